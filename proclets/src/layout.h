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
inline constexpr uint16_t kFormatVersion = 2;   // 2: homes by scan position
inline constexpr uint64_t kEmptySlot = 0;
inline constexpr uint64_t kTombstone = 1;
// The largest map index (home slots are the top bits of a 32-bit position).
inline constexpr uint64_t kMaxSlots = uint64_t{1} << 32;

// A map entry's scan position: the low 32 bits of its key hash, reversed
// (proclets::ScanPosition).
inline uint32_t Position(uint64_t hash) {
  uint32_t v = static_cast<uint32_t>(hash);
  v = ((v >> 1) & 0x55555555u) | ((v & 0x55555555u) << 1);
  v = ((v >> 2) & 0x33333333u) | ((v & 0x33333333u) << 2);
  v = ((v >> 4) & 0x0f0f0f0fu) | ((v & 0x0f0f0f0fu) << 4);
  v = ((v >> 8) & 0x00ff00ffu) | ((v & 0x00ff00ffu) << 8);
  return (v >> 16) | (v << 16);
}

// Where linear probing for a key starts in an index of 2^bits slots (bits
// at most 32): the top bits of its position, so that walking the index in
// slot order visits entries in (nearly) scan order, whatever its size.
inline uint64_t Home(uint64_t hash, int bits) {
  return bits == 0 ? 0 : Position(hash) >> (32 - bits);
}

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
