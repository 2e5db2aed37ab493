// Memory proclets: the shards of a function's sharded maps, vectors and
// queues. Each shard keeps all of its data in one relocatable Arena: every
// link inside it is an offset from the arena's base, so the arena's first
// used() bytes are the whole shard and a migration is a copy of them (no
// re-serialisation, no fix-ups), landing at any address on the target.
//
// Shards are not thread-safe: their owner (the invoker's proclet host) holds
// one lock per shard.
#ifndef SILT_PROCLETS_SHARD_H_
#define SILT_PROCLETS_SHARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace silt::proclets {

enum class ShardKind : uint8_t { kMap = 1, kVector = 2, kQueue = 3 };

// How much Adopt checks of an arena it takes over. kFull: everything later
// reads and in-place writes rely on (bytes from anyone). kHeader: the format
// header only, for bytes from an authenticated peer that served them itself
// (a migration: the full check is O(entries) and would sit in its pause).
enum class AdoptCheck : uint8_t { kFull, kHeader };

// "map", "vector", "queue".
std::string_view ShardKindName(ShardKind kind);
std::optional<ShardKind> ParseShardKind(std::string_view name);

// The hash that places a map key in a shard's [lo, hi) hash range. Stable
// across releases and machines (it is part of the directory's meaning).
uint64_t KeyHash(std::string_view key);

// Where a map entry comes in a scan: the low 32 bits of its KeyHash,
// reversed. A shard's index places a key by the hash's low bits, so the
// entries in a range of positions sit in a range of index slots whatever
// the index's size; and a range's entries are spread evenly over the
// shards, whose own ranges split the hash by its high bits. A scan's
// positions run over [0, kScanEnd).
uint32_t ScanPosition(uint64_t hash);
inline constexpr uint64_t kScanEnd = uint64_t{1} << 32;

// The largest key or value a shard takes; bigger is ResourceExhausted.
inline constexpr size_t kMaxKeyBytes = 64 * 1024;
inline constexpr size_t kMaxValueBytes = 1024 * 1024;

// One contiguous, growable, offset-addressed region; offsets never change.
// Bytes [0, used()) are the shard. It lives in a sealed memory file (a memfd:
// a control page, then the arena's bytes) that grows with ftruncate and
// mremap, so that its owner can hand it to other processes: they map it
// read-only (SharedMapShard) and the seals stop them from writing or
// shrinking it.
class Arena {
 public:
  static constexpr size_t kPageSize = 4096;

  // An empty arena with `reserve` bytes mapped.
  static absl::StatusOr<Arena> Create(size_t reserve = 64 * 1024);
  Arena(Arena&&) noexcept;
  Arena& operator=(Arena&&) noexcept;
  ~Arena();  // retires the window: sharers stop reading

  size_t used() const { return used_; }
  size_t mapped() const { return mapped_; }
  const char* data() const { return base_; }
  char* data() { return base_; }

  // Bump-allocates n bytes (8-aligned); may grow the mapping.
  // ResourceExhausted when the mapping cannot grow.
  absl::StatusOr<uint64_t> Allocate(size_t n);
  // Drops everything (used() = 0) and keeps the mapping.
  void Reset();

  // Write tracking for pre-copy migration: while on, every change through the
  // containers marks the blocks it touched; TakeDirty returns them as
  // (offset, length) runs and clears the marks. Blocks are smaller than a
  // page: a 1 KB value rewritten in place resends ~1-2 KiB, not 4-8.
  static constexpr size_t kDirtyBlock = 1024;
  void TrackWrites(bool on);
  bool tracking() const { return tracking_; }
  void MarkDirty(uint64_t offset, size_t length);
  std::vector<std::pair<uint64_t, uint64_t>> TakeDirty();

  // Receiving side of a migration: writes `bytes` at `offset` and sets used()
  // to `new_used` (growing the mapping as needed). OutOfRange when
  // offset + bytes.size() > new_used.
  absl::Status WriteAt(uint64_t offset, std::string_view bytes,
                       size_t new_used);
  // The same for a caller that fills the bytes itself (straight from a
  // socket): [offset, offset + n) is writable at the returned pointer until
  // the arena next grows.
  absl::StatusOr<char*> Receive(uint64_t offset, size_t n, size_t new_used);
  // Grows the mapping to at least n bytes and backs all of it with memory
  // now (one pass, rather than a page fault per page as bytes arrive).
  absl::Status Prefault(size_t n);

  // ---- sharing with readers in other processes ----
  // The memory file (owned by the arena; dup it to hand it out).
  int memory_fd() const { return fd_; }
  // What sharers may answer from the arena: while open, the entries whose
  // hint (a map's KeyHash) lies in [lo, hi) (hi == UINT64_MAX: no upper
  // end). A new arena's window is closed; its owner opens it once the arena
  // is the authoritative copy of that range, and closes it before the range
  // changes or the arena stops being authoritative (a migration's freeze).
  void SetWindow(uint64_t lo, uint64_t hi, bool open);
  // Bracket every change to the arena's bytes (a sequence lock readers
  // check): the containers call them around each mutation. Not nested.
  void BeginChange();
  void EndChange();
  // A container rebuilt into `this` fresh arena, inside a change of `old`:
  // takes over old's window and its open change, and retires `old`.
  void TakeWindow(Arena& old);

 private:
  Arena() = default;
  absl::Status Grow(size_t need);
  void Release();
  int fd_ = -1;
  char* map_ = nullptr;  // the control page; base_ follows it
  char* base_ = nullptr;
  size_t mapped_ = 0;
  size_t used_ = 0;
  bool tracking_ = false;
  std::vector<uint64_t> dirty_;  // one bit per kDirtyBlock
};

// A hash-partitioned piece of a sharded map: the keys whose KeyHash falls in
// the shard's range (the range itself is the directory's business).
// Variable-length keys and values; an open-addressing index of offsets plus a
// log-structured heap, compacted when more than half of it is dead.
class MapShard {
 public:
  static absl::StatusOr<std::unique_ptr<MapShard>> Create();
  // Takes over an arena received from a peer; DataLoss if its bytes are not
  // a map shard of this format (kFull: every offset in bounds, no two
  // structures overlapping, counters and hashes matching the index).
  static absl::StatusOr<std::unique_ptr<MapShard>> Adopt(
      Arena arena, AdoptCheck check = AdoptCheck::kFull);

  // NotFound when absent. The view is valid until the next change.
  absl::StatusOr<std::string_view> Get(std::string_view key) const;
  // Inserts or replaces. ResourceExhausted for an oversized key or value.
  absl::Status Put(std::string_view key, std::string_view value);
  bool Erase(std::string_view key);  // false when absent
  bool Contains(std::string_view key) const;
  uint64_t count() const;
  // Live key and value bytes (what a split halves).
  uint64_t live_bytes() const;

  // The hash below which about half of the entries lie (a split point), or
  // nullopt when the shard has fewer than two distinct hashes.
  std::optional<uint64_t> MedianHash() const;
  // Moves every entry whose KeyHash >= mid into a new shard and returns it.
  absl::StatusOr<std::unique_ptr<MapShard>> SplitOff(uint64_t mid);
  // Takes every entry of `other` (a merge of adjacent ranges).
  absl::Status Absorb(const MapShard& other);
  void ForEach(
      const std::function<void(std::string_view, std::string_view)>& fn) const;
  // Calls fn(position, key, value) for the entries whose KeyHash lies in
  // [lo, hi) (hi == UINT64_MAX: no upper end) and whose ScanPosition lies in
  // [from, to), in position order, stopping once about max_bytes of keys
  // and values were passed (never between two entries of one position).
  // Returns where the next call goes on from: `to` when it got there.
  // The views are valid until the next change. Entries that are there from
  // the first call to the last are seen once however the shard changes in
  // between (its index grows, it is compacted or migrated).
  uint64_t Scan(uint64_t lo, uint64_t hi, uint64_t from, uint64_t to,
                size_t max_bytes,
                const std::function<void(uint32_t, std::string_view,
                                         std::string_view)>& fn) const;

  Arena& arena() { return arena_; }
  const Arena& arena() const { return arena_; }

 private:
  explicit MapShard(Arena arena) : arena_(std::move(arena)) {}
  Arena arena_;
};

// A contiguous index range [first(), first() + count()) of a sharded vector.
class VectorShard {
 public:
  static absl::StatusOr<std::unique_ptr<VectorShard>> Create(uint64_t first);
  static absl::StatusOr<std::unique_ptr<VectorShard>> Adopt(
      Arena arena, AdoptCheck check = AdoptCheck::kFull);

  uint64_t first() const;
  uint64_t count() const;
  uint64_t live_bytes() const;
  // Appends at index first() + count(); returns that index.
  absl::StatusOr<uint64_t> PushBack(std::string_view value);
  // OutOfRange outside [first(), first() + count()).
  absl::StatusOr<std::string_view> Get(uint64_t index) const;
  absl::Status Set(uint64_t index, std::string_view value);
  // Up to n values from index (clipped to the shard).
  absl::StatusOr<std::vector<std::string_view>> Range(uint64_t index,
                                                      uint64_t n) const;
  // Moves [at, end) into a new shard whose first() is `at`.
  absl::StatusOr<std::unique_ptr<VectorShard>> SplitOff(uint64_t at);
  // Appends `next` (whose first() must be first() + count()).
  absl::Status Absorb(const VectorShard& next);

  Arena& arena() { return arena_; }
  const Arena& arena() const { return arena_; }

 private:
  explicit VectorShard(Arena arena) : arena_(std::move(arena)) {}
  Arena arena_;
};

// A FIFO segment of a sharded queue.
class QueueShard {
 public:
  static absl::StatusOr<std::unique_ptr<QueueShard>> Create();
  static absl::StatusOr<std::unique_ptr<QueueShard>> Adopt(
      Arena arena, AdoptCheck check = AdoptCheck::kFull);

  uint64_t count() const;
  uint64_t live_bytes() const;
  absl::Status Push(std::string_view value);
  // The oldest value, removed; nullopt when empty.
  std::optional<std::string> Pop();
  // Appends every value of `other` after this one's (in order).
  absl::Status Absorb(const QueueShard& other);

  Arena& arena() { return arena_; }
  const Arena& arena() const { return arena_; }

 private:
  explicit QueueShard(Arena arena) : arena_(std::move(arena)) {}
  Arena arena_;
};

}  // namespace silt::proclets

#endif  // SILT_PROCLETS_SHARD_H_
