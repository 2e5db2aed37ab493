// Byte layouts shared by the shard containers (shard.cc), their arenas
// (arena.cc) and the read-only views other processes take of map shards
// (shared_map.cc). Little-endian; never change a field without bumping
// kFormatVersion (arenas cross the network in migrations).
#ifndef SILT_PROCLETS_LAYOUT_H_
#define SILT_PROCLETS_LAYOUT_H_

#include <atomic>
#include <cstdint>

namespace silt::proclets::layout {

inline constexpr uint32_t kMagic = 0x53544c53;  // "SLTS" in a hex dump.
inline constexpr uint16_t kFormatVersion = 1;
inline constexpr uint64_t kEmptySlot = 0;
inline constexpr uint64_t kTombstone = 1;

struct Prefix {
  uint32_t magic;
  uint16_t version;
  uint8_t kind;
  uint8_t reserved;
};

struct MapHeader {
  Prefix prefix;
  uint64_t count;
  uint64_t live_bytes;  // Key and value bytes of live entries.
  uint64_t dead_bytes;  // Arena bytes nothing refers to any more.
  uint64_t index_offset;
  uint64_t index_slots;  // A power of two.
  uint64_t index_used;   // Live slots plus tombstones.
  uint64_t tombstones;
};

struct Slot {
  uint64_t hash;
  uint64_t offset;
};

struct MapEntry {
  uint32_t klen;
  uint32_t vlen;
  uint32_t vcap;  // Room for the value, so that a shorter one can regrow.
  uint32_t reserved;
};

static_assert(sizeof(MapHeader) == 64 && sizeof(Slot) == 16 &&
              sizeof(MapEntry) == 16);

// Page 0 of an arena's memory file; the arena's bytes start at page 1. Only
// the arena's owner writes it. `seq` is a sequence lock over the page and the
// arena's bytes: odd while a change is under way, so a reader that saw the
// same even value before and after its reads read a consistent shard.
enum WindowState : uint32_t { kClosed = 0, kOpen = 1, kRetired = 2 };
struct ArenaControl {
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> size;   // arena bytes in the file (never shrinks)
  std::atomic<uint64_t> lo;     // readers may answer for hints in [lo, hi)
  std::atomic<uint64_t> hi;     // (UINT64_MAX: no upper end)
  std::atomic<uint32_t> state;  // WindowState
  uint32_t magic;               // kMagic once initialised
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

}  // namespace silt::proclets::layout

#endif  // SILT_PROCLETS_LAYOUT_H_
