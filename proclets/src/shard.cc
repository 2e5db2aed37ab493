// Arena layouts (all little-endian, every link an offset from the base):
//
//   map:    MapHeader @0 | Slot[index_slots] @index_offset | heap of MapEntry
//           Slot = {KeyHash, entry offset}; offset 0 is an empty slot, 1 a
//           tombstone (entries are 8-aligned and never at 0). Linear probing
//           from layout::Home (the top bits of the key's scan position, so
//           slot order is about scan order); the index is rebuilt elsewhere
//           in the arena past 70% load. MapEntry = {klen, vlen, vcap, 0} key
//           value.
//   vector: VectorHeader @0 | u64 table[table_capacity] | heap of Blob
//   queue:  QueueHeader @0 | u64 ring[ring_capacity] (power of two; position
//           p lives at p & (capacity - 1)) | heap of Blob
//           Blob = {len, cap} bytes.
//
// Dead bytes (overwritten or removed entries, abandoned indexes) are counted in
// the header; a container is rebuilt into a fresh arena once they are more
// than 64 KiB and more than half of used(). Rebuilds wait while the arena
// tracks writes, so a pre-copy migration resends only what really changed.
#include "proclets/shard.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "layout.h"

namespace silt::proclets {
namespace {

static_assert(std::endian::native == std::endian::little,
              "shard arenas are little-endian byte images");

using layout::kEmptySlot;
using layout::kFormatVersion;
using layout::kMagic;
using layout::kTombstone;
using layout::MapEntry;
using layout::MapHeader;
using layout::Prefix;
using layout::Slot;

constexpr uint64_t kCompactMinDeadBytes = 64 * 1024;
constexpr uint64_t kMinSlots = 16;
constexpr uint64_t kMinTable = 16;

struct VectorHeader {
  Prefix prefix;
  uint64_t first;
  uint64_t count;
  uint64_t live_bytes;
  uint64_t dead_bytes;
  uint64_t table_offset;
  uint64_t table_capacity;
};

struct QueueHeader {
  Prefix prefix;
  uint64_t head;  // Positions only grow, until the ring is rebuilt.
  uint64_t tail;
  uint64_t live_bytes;
  uint64_t dead_bytes;
  uint64_t ring_offset;
  uint64_t ring_capacity;  // A power of two.
};

struct Blob {
  uint32_t len;
  uint32_t cap;
};

static_assert(sizeof(VectorHeader) == 56 && sizeof(QueueHeader) == 56 &&
              sizeof(Blob) == 8);

constexpr uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

template <typename T>
T* At(Arena& a, uint64_t offset) {
  return reinterpret_cast<T*>(a.data() + offset);
}
template <typename T>
const T* At(const Arena& a, uint64_t offset) {
  return reinterpret_cast<const T*>(a.data() + offset);
}

void Touch(Arena& a, uint64_t offset, size_t length) {
  if (a.tracking()) a.MarkDirty(offset, length);
}
template <typename T>
void Touch(Arena& a, const T* object) {
  Touch(a, reinterpret_cast<const char*>(object) - a.data(), sizeof(T));
}

void CopyBytes(char* to, std::string_view bytes) {
  if (!bytes.empty()) memcpy(to, bytes.data(), bytes.size());
}

absl::Status CheckKey(std::string_view key) {
  if (key.size() <= kMaxKeyBytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("key of ", key.size(), " bytes exceeds the limit of ",
                   kMaxKeyBytes, " bytes"));
}

absl::Status CheckValue(std::string_view value) {
  if (value.size() <= kMaxValueBytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("value of ", value.size(), " bytes exceeds the limit of ",
                   kMaxValueBytes, " bytes"));
}

// For StrCat, whose absl::string_view is not std::string_view here.
absl::string_view KindName(ShardKind kind) {
  std::string_view name = ShardKindName(kind);
  return {name.data(), name.size()};
}

void WritePrefix(Prefix& prefix, ShardKind kind) {
  prefix = {kMagic, kFormatVersion, static_cast<uint8_t>(kind), 0};
}

absl::Status CheckPrefix(const Arena& a, size_t header_bytes, ShardKind kind) {
  if (a.used() < header_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(a.used(), " bytes are too few for a ", KindName(kind),
                     " shard header of ", header_bytes, " bytes"));
  }
  const Prefix* prefix = At<Prefix>(a, 0);
  if (prefix->magic != kMagic) {
    return absl::InvalidArgumentError("arena is not a shard (bad magic)");
  }
  if (prefix->version != kFormatVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard format version ", prefix->version,
                     " is not the supported version ", kFormatVersion));
  }
  if (prefix->kind != static_cast<uint8_t>(kind)) {
    const uint8_t held = prefix->kind;
    return absl::InvalidArgumentError(absl::StrCat(
        "arena holds a ",
        held >= 1 && held <= 3 ? KindName(static_cast<ShardKind>(held))
                               : "unknown",
        " shard, not a ", KindName(kind), " shard"));
  }
  return absl::OkStatus();
}

// Adopt's check that the structures an arena refers to lie inside it and do
// not overlap, so that no later read or in-place write strays.
class Extents {
 public:
  // One bit per 8-byte granule of the used bytes: marking is linear in the
  // bytes covered, with no sort (Adopt runs inside a migration's pause).
  explicit Extents(uint64_t used)
      : used_(used), bits_((used / 8 + 63) / 64 + 1, 0) {}
  // False when [offset, offset + length) is misaligned or past used().
  bool Add(uint64_t offset, uint64_t length) {
    if (offset % 8 != 0 || offset > used_ || length > used_ - offset) {
      return false;
    }
    // Every extent starts 8-aligned, so rounding an end up to a granule never
    // reaches the next extent's first granule unless they overlap.
    uint64_t g = offset / 8;
    const uint64_t end = (offset + length + 7) / 8;
    while (g < end) {
      const uint64_t word = g / 64, bit = g % 64;
      const uint64_t n = std::min<uint64_t>(64 - bit, end - g);
      const uint64_t mask = (n == 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1))
                            << bit;
      if (bits_[word] & mask) overlap_ = true;
      bits_[word] |= mask;
      g += n;
    }
    return true;
  }
  bool Fits(uint64_t offset, uint64_t length) const {
    return offset % 8 == 0 && offset <= used_ && length <= used_ - offset;
  }
  bool Disjoint() const { return !overlap_; }

 private:
  uint64_t used_;
  std::vector<uint64_t> bits_;
  bool overlap_ = false;
};

// Swaps in a rebuilt arena. A tracked arena stays tracked and counts as
// rewritten in full, since a pre-copy target holds none of the new layout.
void ReplaceArena(Arena& arena, Arena fresh) {
  if (arena.tracking()) {
    fresh.TrackWrites(true);
    fresh.MarkDirty(0, fresh.used());
  }
  fresh.TakeWindow(arena);
  arena = std::move(fresh);
}

// One change of a map shard, for readers of its shared arena (the arena may
// be replaced by a rebuild inside: the change ends on whatever arena_ is).
class Change {
 public:
  explicit Change(Arena& arena) : arena_(arena) { arena_.BeginChange(); }
  ~Change() { arena_.EndChange(); }
  Change(const Change&) = delete;
  Change& operator=(const Change&) = delete;

 private:
  Arena& arena_;
};

bool ShouldCompact(const Arena& a, uint64_t dead_bytes) {
  return !a.tracking() && dead_bytes > kCompactMinDeadBytes &&
         dead_bytes > a.used() / 2;
}

// A Blob holding `value`; its capacity takes up the alignment slack.
absl::StatusOr<uint64_t> NewBlob(Arena& a, std::string_view value) {
  const uint64_t size = Align8(sizeof(Blob) + value.size());
  absl::StatusOr<uint64_t> offset = a.Allocate(size);
  if (!offset.ok()) return offset;
  Blob* blob = At<Blob>(a, *offset);
  blob->len = static_cast<uint32_t>(value.size());
  blob->cap = static_cast<uint32_t>(size - sizeof(Blob));
  CopyBytes(reinterpret_cast<char*>(blob + 1), value);
  Touch(a, *offset, size);
  return offset;
}

std::string_view BlobValue(const Arena& a, uint64_t offset) {
  const Blob* blob = At<Blob>(a, offset);
  return {reinterpret_cast<const char*>(blob + 1), blob->len};
}

// Checks the Blob at `offset` for Adopt and adds its length to `bytes`.
bool CheckBlob(const Arena& a, uint64_t offset, Extents& extents,
               uint64_t& bytes) {
  if (!extents.Fits(offset, sizeof(Blob))) return false;
  const Blob* blob = At<Blob>(a, offset);
  if (blob->len > blob->cap || blob->cap > kMaxValueBytes) return false;
  if (!extents.Add(offset, sizeof(Blob) + uint64_t{blob->cap})) return false;
  bytes += blob->len;
  return true;
}

uint64_t Mix(uint64_t a, uint64_t b) {
  const unsigned __int128 product =
      static_cast<unsigned __int128>(a) * static_cast<unsigned __int128>(b);
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
}

uint64_t Load64(const unsigned char* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

uint64_t Load32(const unsigned char* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

// ---------------------------------------------------------------------------
// Map internals.

MapHeader* MapHead(Arena& a) { return At<MapHeader>(a, 0); }
const MapHeader* MapHead(const Arena& a) { return At<MapHeader>(a, 0); }

std::string_view EntryKey(const MapEntry* e) {
  return {reinterpret_cast<const char*>(e + 1), e->klen};
}
std::string_view EntryValue(const MapEntry* e) {
  return {reinterpret_cast<const char*>(e + 1) + e->klen, e->vlen};
}
uint64_t EntryBytes(const MapEntry* e) {
  return sizeof(MapEntry) + uint64_t{e->klen} + e->vcap;
}

// Smallest index for n entries at no more than half load.
uint64_t SlotsFor(uint64_t n) {
  uint64_t slots = kMinSlots;
  while (slots < 2 * n) slots *= 2;
  return slots;
}

absl::Status MapInit(Arena& a, uint64_t slots) {
  absl::StatusOr<uint64_t> header = a.Allocate(sizeof(MapHeader));
  if (!header.ok()) return header.status();
  absl::StatusOr<uint64_t> index = a.Allocate(slots * sizeof(Slot));
  if (!index.ok()) return index.status();
  memset(a.data() + *index, 0, slots * sizeof(Slot));
  MapHeader* h = MapHead(a);
  *h = MapHeader{};
  WritePrefix(h->prefix, ShardKind::kMap);
  h->index_offset = *index;
  h->index_slots = slots;
  Touch(a, 0, a.used());
  return absl::OkStatus();
}

struct Probe {
  uint64_t slot;  // The key's slot, or where it would go.
  bool found;
};

Probe MapFind(const Arena& a, uint64_t hash, std::string_view key) {
  const MapHeader* h = MapHead(a);
  const Slot* slots = At<Slot>(a, h->index_offset);
  const uint64_t mask = h->index_slots - 1;
  uint64_t free_slot = UINT64_MAX;
  for (uint64_t i = layout::Home(hash, std::countr_zero(h->index_slots));;
       i = (i + 1) & mask) {
    const Slot& s = slots[i];
    if (s.offset == kEmptySlot) {
      return {free_slot == UINT64_MAX ? i : free_slot, false};
    }
    if (s.offset == kTombstone) {
      if (free_slot == UINT64_MAX) free_slot = i;
    } else if (s.hash == hash && EntryKey(At<MapEntry>(a, s.offset)) == key) {
      return {i, true};
    }
  }
}

// Moves the index to a fresh table sized for n entries, dropping tombstones.
absl::Status MapRehash(Arena& a, uint64_t n) {
  const uint64_t slots = SlotsFor(n);
  if (slots > layout::kMaxSlots)
    return absl::ResourceExhaustedError(absl::StrCat(
        "a map shard holds at most ", layout::kMaxSlots / 2, " entries"));
  absl::StatusOr<uint64_t> offset = a.Allocate(slots * sizeof(Slot));
  if (!offset.ok()) return offset.status();
  Slot* fresh = At<Slot>(a, *offset);
  memset(fresh, 0, slots * sizeof(Slot));
  MapHeader* h = MapHead(a);
  const Slot* old = At<Slot>(a, h->index_offset);
  const uint64_t mask = slots - 1;
  const int bits = std::countr_zero(slots);
  for (uint64_t i = 0; i < h->index_slots; ++i) {
    if (old[i].offset <= kTombstone) continue;
    uint64_t j = layout::Home(old[i].hash, bits);
    while (fresh[j].offset != kEmptySlot) j = (j + 1) & mask;
    fresh[j] = old[i];
  }
  h->dead_bytes += h->index_slots * sizeof(Slot);
  h->index_offset = *offset;
  h->index_slots = slots;
  h->index_used = h->count;
  h->tombstones = 0;
  Touch(a, *offset, slots * sizeof(Slot));
  Touch(a, h);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> NewEntry(Arena& a, std::string_view key,
                                  std::string_view value) {
  const uint64_t size = Align8(sizeof(MapEntry) + key.size() + value.size());
  absl::StatusOr<uint64_t> offset = a.Allocate(size);
  if (!offset.ok()) return offset;
  MapEntry* e = At<MapEntry>(a, *offset);
  e->klen = static_cast<uint32_t>(key.size());
  e->vlen = static_cast<uint32_t>(value.size());
  e->vcap = static_cast<uint32_t>(size - sizeof(MapEntry) - key.size());
  e->reserved = 0;
  char* bytes = reinterpret_cast<char*>(e + 1);
  CopyBytes(bytes, key);
  CopyBytes(bytes + key.size(), value);
  Touch(a, *offset, size);
  return offset;
}

// Put with the key's hash already known; sizes already checked.
absl::Status MapPut(Arena& a, uint64_t hash, std::string_view key,
                    std::string_view value) {
  Probe probe = MapFind(a, hash, key);
  if (probe.found) {
    const uint64_t offset =
        At<Slot>(a, MapHead(a)->index_offset)[probe.slot].offset;
    MapEntry* e = At<MapEntry>(a, offset);
    const uint32_t old_vlen = e->vlen;
    if (value.size() <= e->vcap) {
      e->vlen = static_cast<uint32_t>(value.size());
      CopyBytes(reinterpret_cast<char*>(e + 1) + e->klen, value);
      Touch(a, offset, sizeof(MapEntry) + e->klen + value.size());
      MapHeader* h = MapHead(a);
      h->live_bytes = h->live_bytes - old_vlen + value.size();
      Touch(a, h);
      return absl::OkStatus();
    }
    const uint64_t old_bytes = EntryBytes(e);
    absl::StatusOr<uint64_t> moved = NewEntry(a, key, value);
    if (!moved.ok()) return moved.status();
    MapHeader* h = MapHead(a);  // Allocate may have moved the base.
    Slot& s = At<Slot>(a, h->index_offset)[probe.slot];
    s.offset = *moved;
    h->dead_bytes += old_bytes;
    h->live_bytes = h->live_bytes - old_vlen + value.size();
    Touch(a, &s);
    Touch(a, h);
    return absl::OkStatus();
  }
  {
    const MapHeader* h = MapHead(a);
    if ((h->index_used + 1) * 10 > h->index_slots * 7) {
      absl::Status s = MapRehash(a, h->count + 1);
      if (!s.ok()) return s;
      probe = MapFind(a, hash, key);
    }
  }
  absl::StatusOr<uint64_t> offset = NewEntry(a, key, value);
  if (!offset.ok()) return offset.status();
  MapHeader* h = MapHead(a);
  Slot& s = At<Slot>(a, h->index_offset)[probe.slot];
  if (s.offset == kTombstone) {
    --h->tombstones;
  } else {
    ++h->index_used;
  }
  s = {hash, *offset};
  ++h->count;
  h->live_bytes += key.size() + value.size();
  Touch(a, &s);
  Touch(a, h);
  return absl::OkStatus();
}

// Calls fn(slot) for every live slot, in index order.
template <typename Fn>
void ForEachSlot(const Arena& a, Fn fn) {
  const MapHeader* h = MapHead(a);
  const Slot* slots = At<Slot>(a, h->index_offset);
  for (uint64_t i = 0; i < h->index_slots; ++i) {
    if (slots[i].offset > kTombstone) fn(slots[i]);
  }
}

// A compact copy of the entries whose hash `keep` accepts.
template <typename Keep>
absl::StatusOr<Arena> MapBuild(const Arena& src, Keep keep) {
  uint64_t n = 0;
  uint64_t heap = 0;
  ForEachSlot(src, [&](const Slot& s) {
    if (!keep(s.hash)) return;
    const MapEntry* e = At<MapEntry>(src, s.offset);
    ++n;
    heap += Align8(sizeof(MapEntry) + e->klen + e->vlen);
  });
  const uint64_t slots = SlotsFor(n);
  absl::StatusOr<Arena> a =
      Arena::Create(sizeof(MapHeader) + slots * sizeof(Slot) + heap);
  if (!a.ok()) return a;
  absl::Status status = MapInit(*a, slots);
  ForEachSlot(src, [&](const Slot& s) {
    if (!status.ok() || !keep(s.hash)) return;
    const MapEntry* e = At<MapEntry>(src, s.offset);
    status = MapPut(*a, s.hash, EntryKey(e), EntryValue(e));
  });
  if (!status.ok()) return status;
  return a;
}

void MapMaybeCompact(Arena& a) {
  if (!ShouldCompact(a, MapHead(a)->dead_bytes)) return;
  absl::StatusOr<Arena> fresh = MapBuild(a, [](uint64_t) { return true; });
  // Compaction only returns space: without a fresh arena the shard simply
  // stays as it is, still correct, and the next change tries again.
  if (fresh.ok()) ReplaceArena(a, *std::move(fresh));
}

absl::Status MapValidate(const Arena& a) {
  const MapHeader* h = MapHead(a);
  Extents extents(a.used());
  extents.Add(0, sizeof(MapHeader));
  if (h->index_slots == 0 || !std::has_single_bit(h->index_slots) ||
      h->index_slots > a.used() / sizeof(Slot) ||
      h->index_slots > layout::kMaxSlots ||
      !extents.Add(h->index_offset, h->index_slots * sizeof(Slot))) {
    return absl::DataLossError(
        absl::StrCat("map shard index of ", h->index_slots, " slots at offset ",
                     h->index_offset, " does not fit in ", a.used(), " bytes"));
  }
  const Slot* slots = At<Slot>(a, h->index_offset);
  uint64_t live = 0, tombstones = 0, empty = 0, bytes = 0;
  for (uint64_t i = 0; i < h->index_slots; ++i) {
    const Slot& s = slots[i];
    if (s.offset == kEmptySlot) {
      ++empty;
      continue;
    }
    if (s.offset == kTombstone) {
      ++tombstones;
      continue;
    }
    if (!extents.Fits(s.offset, sizeof(MapEntry))) {
      return absl::DataLossError(
          absl::StrCat("map shard slot ", i, " points outside the arena"));
    }
    const MapEntry* e = At<MapEntry>(a, s.offset);
    if (e->klen > kMaxKeyBytes || e->vcap > kMaxValueBytes ||
        e->vlen > e->vcap || !extents.Add(s.offset, EntryBytes(e))) {
      return absl::DataLossError(absl::StrCat("map shard entry at offset ",
                                              s.offset, " is malformed"));
    }
    if (KeyHash(EntryKey(e)) != s.hash) {
      return absl::DataLossError(absl::StrCat(
          "map shard entry at offset ", s.offset, " does not match its hash"));
    }
    ++live;
    bytes += e->klen + uint64_t{e->vlen};
  }
  if (empty == 0 || live != h->count || tombstones != h->tombstones ||
      live + tombstones != h->index_used || bytes != h->live_bytes ||
      h->dead_bytes > a.used()) {
    return absl::DataLossError(
        "map shard header counters do not match its index");
  }
  if (!extents.Disjoint()) {
    return absl::DataLossError("map shard entries overlap");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Vector internals.

VectorHeader* VecHead(Arena& a) { return At<VectorHeader>(a, 0); }
const VectorHeader* VecHead(const Arena& a) { return At<VectorHeader>(a, 0); }
uint64_t* VecTable(Arena& a) {
  return At<uint64_t>(a, VecHead(a)->table_offset);
}
const uint64_t* VecTable(const Arena& a) {
  return At<uint64_t>(a, VecHead(a)->table_offset);
}

absl::Status VecInit(Arena& a, uint64_t first, uint64_t capacity) {
  absl::StatusOr<uint64_t> header = a.Allocate(sizeof(VectorHeader));
  if (!header.ok()) return header.status();
  absl::StatusOr<uint64_t> table = a.Allocate(capacity * sizeof(uint64_t));
  if (!table.ok()) return table.status();
  VectorHeader* h = VecHead(a);
  *h = VectorHeader{};
  WritePrefix(h->prefix, ShardKind::kVector);
  h->first = first;
  h->table_offset = *table;
  h->table_capacity = capacity;
  Touch(a, h);
  return absl::OkStatus();
}

// Makes room in the offset table for n values.
absl::Status VecReserve(Arena& a, uint64_t n) {
  const uint64_t capacity = VecHead(a)->table_capacity;
  if (n <= capacity) return absl::OkStatus();
  const uint64_t grown = std::max({n, capacity * 2, kMinTable});
  absl::StatusOr<uint64_t> offset = a.Allocate(grown * sizeof(uint64_t));
  if (!offset.ok()) return offset.status();
  VectorHeader* h = VecHead(a);
  CopyBytes(a.data() + *offset,
            {a.data() + h->table_offset, h->count * sizeof(uint64_t)});
  Touch(a, *offset, h->count * sizeof(uint64_t));
  h->dead_bytes += capacity * sizeof(uint64_t);
  h->table_offset = *offset;
  h->table_capacity = grown;
  Touch(a, h);
  return absl::OkStatus();
}

absl::Status VecAppend(Arena& a, std::string_view value) {
  absl::Status s = VecReserve(a, VecHead(a)->count + 1);
  if (!s.ok()) return s;
  absl::StatusOr<uint64_t> offset = NewBlob(a, value);
  if (!offset.ok()) return offset.status();
  VectorHeader* h = VecHead(a);
  uint64_t* slot = VecTable(a) + h->count;
  *slot = *offset;
  ++h->count;
  h->live_bytes += value.size();
  Touch(a, slot);
  Touch(a, h);
  return absl::OkStatus();
}

// A compact vector of src's positions [from, to), starting at index `first`.
absl::StatusOr<Arena> VecBuild(const Arena& src, uint64_t from, uint64_t to,
                               uint64_t first) {
  const uint64_t* table = VecTable(src);
  uint64_t heap = 0;
  for (uint64_t i = from; i < to; ++i) {
    heap += Align8(sizeof(Blob) + BlobValue(src, table[i]).size());
  }
  const uint64_t capacity = std::max(to - from, kMinTable);
  absl::StatusOr<Arena> a = Arena::Create(
      sizeof(VectorHeader) + capacity * sizeof(uint64_t) + heap + 8);
  if (!a.ok()) return a;
  absl::Status s = VecInit(*a, first, capacity);
  for (uint64_t i = from; s.ok() && i < to; ++i) {
    s = VecAppend(*a, BlobValue(src, table[i]));
  }
  if (!s.ok()) return s;
  return a;
}

void VecMaybeCompact(Arena& a) {
  const VectorHeader* h = VecHead(a);
  if (!ShouldCompact(a, h->dead_bytes)) return;
  absl::StatusOr<Arena> fresh = VecBuild(a, 0, h->count, h->first);
  // As for maps: compaction is an optimisation and may be retried later.
  if (fresh.ok()) ReplaceArena(a, *std::move(fresh));
}

absl::Status VecValidate(const Arena& a) {
  const VectorHeader* h = VecHead(a);
  Extents extents(a.used());
  extents.Add(0, sizeof(VectorHeader));
  if (h->table_capacity > a.used() / sizeof(uint64_t) ||
      h->count > h->table_capacity || h->first + h->count < h->first ||
      !extents.Add(h->table_offset, h->table_capacity * sizeof(uint64_t))) {
    return absl::DataLossError(
        absl::StrCat("vector shard table of ", h->count, "/", h->table_capacity,
                     " entries at offset ", h->table_offset,
                     " does not fit in ", a.used(), " bytes"));
  }
  const uint64_t* table = VecTable(a);
  uint64_t bytes = 0;
  for (uint64_t i = 0; i < h->count; ++i) {
    if (!CheckBlob(a, table[i], extents, bytes)) {
      return absl::DataLossError(
          absl::StrCat("vector shard value ", h->first + i, " is malformed"));
    }
  }
  if (bytes != h->live_bytes || h->dead_bytes > a.used()) {
    return absl::DataLossError(
        "vector shard header counters do not match its table");
  }
  if (!extents.Disjoint()) {
    return absl::DataLossError("vector shard values overlap");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Queue internals.

QueueHeader* QueueHead(Arena& a) { return At<QueueHeader>(a, 0); }
const QueueHeader* QueueHead(const Arena& a) { return At<QueueHeader>(a, 0); }
uint64_t* RingSlot(Arena& a, uint64_t position) {
  const QueueHeader* h = QueueHead(a);
  return At<uint64_t>(a, h->ring_offset) + (position & (h->ring_capacity - 1));
}
uint64_t RingAt(const Arena& a, uint64_t position) {
  const QueueHeader* h = QueueHead(a);
  return At<uint64_t>(a, h->ring_offset)[position & (h->ring_capacity - 1)];
}

absl::Status QueueInit(Arena& a, uint64_t capacity) {
  absl::StatusOr<uint64_t> header = a.Allocate(sizeof(QueueHeader));
  if (!header.ok()) return header.status();
  absl::StatusOr<uint64_t> ring = a.Allocate(capacity * sizeof(uint64_t));
  if (!ring.ok()) return ring.status();
  QueueHeader* h = QueueHead(a);
  *h = QueueHeader{};
  WritePrefix(h->prefix, ShardKind::kQueue);
  h->ring_offset = *ring;
  h->ring_capacity = capacity;
  Touch(a, h);
  return absl::OkStatus();
}

uint64_t RingFor(uint64_t n) { return std::bit_ceil(std::max(n, kMinTable)); }

// Makes room in the ring for n values, unwrapping it to start at position 0.
absl::Status QueueReserve(Arena& a, uint64_t n) {
  const uint64_t capacity = QueueHead(a)->ring_capacity;
  if (n <= capacity) return absl::OkStatus();
  const uint64_t grown = RingFor(std::max(n, capacity * 2));
  absl::StatusOr<uint64_t> offset = a.Allocate(grown * sizeof(uint64_t));
  if (!offset.ok()) return offset.status();
  QueueHeader* h = QueueHead(a);
  uint64_t* ring = At<uint64_t>(a, *offset);
  const uint64_t count = h->tail - h->head;
  for (uint64_t i = 0; i < count; ++i) ring[i] = RingAt(a, h->head + i);
  Touch(a, *offset, count * sizeof(uint64_t));
  h->dead_bytes += capacity * sizeof(uint64_t);
  h->ring_offset = *offset;
  h->ring_capacity = grown;
  h->head = 0;
  h->tail = count;
  Touch(a, h);
  return absl::OkStatus();
}

absl::Status QueuePush(Arena& a, std::string_view value) {
  const QueueHeader* h = QueueHead(a);
  absl::Status s = QueueReserve(a, h->tail - h->head + 1);
  if (!s.ok()) return s;
  absl::StatusOr<uint64_t> offset = NewBlob(a, value);
  if (!offset.ok()) return offset.status();
  QueueHeader* q = QueueHead(a);
  uint64_t* slot = RingSlot(a, q->tail);
  *slot = *offset;
  ++q->tail;
  q->live_bytes += value.size();
  Touch(a, slot);
  Touch(a, q);
  return absl::OkStatus();
}

absl::StatusOr<Arena> QueueBuild(const Arena& src) {
  const QueueHeader* h = QueueHead(src);
  uint64_t heap = 0;
  for (uint64_t p = h->head; p < h->tail; ++p) {
    heap += Align8(sizeof(Blob) + BlobValue(src, RingAt(src, p)).size());
  }
  const uint64_t capacity = RingFor(h->tail - h->head);
  absl::StatusOr<Arena> a = Arena::Create(
      sizeof(QueueHeader) + capacity * sizeof(uint64_t) + heap + 8);
  if (!a.ok()) return a;
  absl::Status s = QueueInit(*a, capacity);
  for (uint64_t p = h->head; s.ok() && p < h->tail; ++p) {
    s = QueuePush(*a, BlobValue(src, RingAt(src, p)));
  }
  if (!s.ok()) return s;
  return a;
}

void QueueMaybeCompact(Arena& a) {
  if (!ShouldCompact(a, QueueHead(a)->dead_bytes)) return;
  absl::StatusOr<Arena> fresh = QueueBuild(a);
  // As for maps: compaction is an optimisation and may be retried later.
  if (fresh.ok()) ReplaceArena(a, *std::move(fresh));
}

absl::Status QueueValidate(const Arena& a) {
  const QueueHeader* h = QueueHead(a);
  Extents extents(a.used());
  extents.Add(0, sizeof(QueueHeader));
  if (h->ring_capacity == 0 || !std::has_single_bit(h->ring_capacity) ||
      h->ring_capacity > a.used() / sizeof(uint64_t) || h->head > h->tail ||
      h->tail - h->head > h->ring_capacity ||
      !extents.Add(h->ring_offset, h->ring_capacity * sizeof(uint64_t))) {
    return absl::DataLossError(
        absl::StrCat("queue shard ring [", h->head, ", ", h->tail, ") of ",
                     h->ring_capacity, " slots at offset ", h->ring_offset,
                     " does not fit in ", a.used(), " bytes"));
  }
  uint64_t bytes = 0;
  for (uint64_t p = h->head; p < h->tail; ++p) {
    if (!CheckBlob(a, RingAt(a, p), extents, bytes)) {
      return absl::DataLossError(
          absl::StrCat("queue shard value ", p - h->head, " is malformed"));
    }
  }
  if (bytes != h->live_bytes || h->dead_bytes > a.used()) {
    return absl::DataLossError(
        "queue shard header counters do not match its ring");
  }
  if (!extents.Disjoint()) {
    return absl::DataLossError("queue shard values overlap");
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view ShardKindName(ShardKind kind) {
  switch (kind) {
    case ShardKind::kMap:
      return "map";
    case ShardKind::kVector:
      return "vector";
    case ShardKind::kQueue:
      return "queue";
  }
  return "unknown";
}

std::optional<ShardKind> ParseShardKind(std::string_view name) {
  for (ShardKind kind :
       {ShardKind::kMap, ShardKind::kVector, ShardKind::kQueue}) {
    if (name == ShardKindName(kind)) return kind;
  }
  return std::nullopt;
}

uint32_t ScanPosition(uint64_t hash) { return layout::Position(hash); }

// wyhash (the final-4 construction, seed 0, its default secret), reading
// little-endian. The values are part of the directory's meaning: never change
// them (shard_test pins a few).
uint64_t KeyHash(std::string_view key) {
  constexpr uint64_t kSecret[4] = {0x2d358dccaa6c78a5ull, 0x8bb84b93962eacc9ull,
                                   0x4b33a62ed433d4a3ull,
                                   0x4d5a2da51de1aa47ull};
  const auto* p = reinterpret_cast<const unsigned char*>(key.data());
  const size_t len = key.size();
  uint64_t seed = Mix(kSecret[0], kSecret[1]);
  uint64_t a;
  uint64_t b;
  if (len <= 16) {
    if (len >= 4) {
      const size_t step = (len >> 3) << 2;
      a = (Load32(p) << 32) | Load32(p + step);
      b = (Load32(p + len - 4) << 32) | Load32(p + len - 4 - step);
    } else if (len > 0) {
      a = (uint64_t{p[0]} << 16) | (uint64_t{p[len >> 1]} << 8) | p[len - 1];
      b = 0;
    } else {
      a = b = 0;
    }
  } else {
    size_t i = len;
    if (i >= 48) {
      uint64_t see1 = seed;
      uint64_t see2 = seed;
      do {
        seed = Mix(Load64(p) ^ kSecret[1], Load64(p + 8) ^ seed);
        see1 = Mix(Load64(p + 16) ^ kSecret[2], Load64(p + 24) ^ see1);
        see2 = Mix(Load64(p + 32) ^ kSecret[3], Load64(p + 40) ^ see2);
        p += 48;
        i -= 48;
      } while (i >= 48);
      seed ^= see1 ^ see2;
    }
    while (i > 16) {
      seed = Mix(Load64(p) ^ kSecret[1], Load64(p + 8) ^ seed);
      i -= 16;
      p += 16;
    }
    a = Load64(p + i - 16);
    b = Load64(p + i - 8);
  }
  a ^= kSecret[1];
  b ^= seed;
  const unsigned __int128 product =
      static_cast<unsigned __int128>(a) * static_cast<unsigned __int128>(b);
  a = static_cast<uint64_t>(product);
  b = static_cast<uint64_t>(product >> 64);
  return Mix(a ^ kSecret[0] ^ len, b ^ kSecret[1]);
}

// ---------------------------------------------------------------------------
// MapShard.

absl::StatusOr<std::unique_ptr<MapShard>> MapShard::Create() {
  absl::StatusOr<Arena> arena = Arena::Create();
  if (!arena.ok()) return arena.status();
  absl::Status s = MapInit(*arena, kMinSlots);
  if (!s.ok()) return s;
  return std::unique_ptr<MapShard>(new MapShard(*std::move(arena)));
}

absl::StatusOr<std::unique_ptr<MapShard>> MapShard::Adopt(Arena arena,
                                                          AdoptCheck check) {
  absl::Status s = CheckPrefix(arena, sizeof(MapHeader), ShardKind::kMap);
  if (s.ok() && check == AdoptCheck::kFull) s = MapValidate(arena);
  if (!s.ok()) return s;
  return std::unique_ptr<MapShard>(new MapShard(std::move(arena)));
}

absl::StatusOr<std::string_view> MapShard::Get(std::string_view key) const {
  const Probe probe = MapFind(arena_, KeyHash(key), key);
  // No message: a status with one allocates, and misses are a hot path.
  if (!probe.found) return absl::NotFoundError("");
  const Slot* slots = At<Slot>(arena_, MapHead(arena_)->index_offset);
  return EntryValue(At<MapEntry>(arena_, slots[probe.slot].offset));
}

absl::Status MapShard::Put(std::string_view key, std::string_view value) {
  Change change(arena_);
  absl::Status s = CheckKey(key);
  if (s.ok()) s = CheckValue(value);
  if (s.ok()) s = MapPut(arena_, KeyHash(key), key, value);
  if (!s.ok()) return s;
  MapMaybeCompact(arena_);
  return absl::OkStatus();
}

bool MapShard::Erase(std::string_view key) {
  const Probe probe = MapFind(arena_, KeyHash(key), key);
  if (!probe.found) return false;
  Change change(arena_);
  MapHeader* h = MapHead(arena_);
  Slot* slots = At<Slot>(arena_, h->index_offset);
  const uint64_t mask = h->index_slots - 1;
  const MapEntry* e = At<MapEntry>(arena_, slots[probe.slot].offset);
  --h->count;
  h->live_bytes -= e->klen + uint64_t{e->vlen};
  h->dead_bytes += EntryBytes(e);
  if (slots[(probe.slot + 1) & mask].offset == kEmptySlot) {
    // Nothing probes past an empty slot, so this one and the tombstones just
    // before it can become empty too.
    uint64_t i = probe.slot;
    slots[i] = {0, kEmptySlot};
    Touch(arena_, &slots[i]);
    --h->index_used;
    for (i = (i - 1) & mask; slots[i].offset == kTombstone;
         i = (i - 1) & mask) {
      slots[i] = {0, kEmptySlot};
      Touch(arena_, &slots[i]);
      --h->index_used;
      --h->tombstones;
    }
  } else {
    slots[probe.slot] = {0, kTombstone};
    Touch(arena_, &slots[probe.slot]);
    ++h->tombstones;
  }
  Touch(arena_, h);
  MapMaybeCompact(arena_);
  return true;
}

bool MapShard::Contains(std::string_view key) const {
  return MapFind(arena_, KeyHash(key), key).found;
}

uint64_t MapShard::count() const { return MapHead(arena_)->count; }

uint64_t MapShard::live_bytes() const { return MapHead(arena_)->live_bytes; }

std::optional<uint64_t> MapShard::MedianHash() const {
  if (count() < 2) return std::nullopt;
  std::vector<uint64_t> hashes;
  hashes.reserve(count());
  ForEachSlot(arena_, [&](const Slot& s) { hashes.push_back(s.hash); });
  const auto mid = hashes.begin() + hashes.size() / 2;
  std::nth_element(hashes.begin(), mid, hashes.end());
  // Everything before `mid` is <= *mid and goes to the lower half, which
  // must not end up empty.
  if (*std::min_element(hashes.begin(), mid) < *mid) return *mid;
  std::optional<uint64_t> above;
  for (auto it = mid; it != hashes.end(); ++it) {
    if (*it > *mid && (!above || *it < *above)) above = *it;
  }
  return above;
}

absl::StatusOr<std::unique_ptr<MapShard>> MapShard::SplitOff(uint64_t mid) {
  Change change(arena_);
  absl::StatusOr<Arena> high =
      MapBuild(arena_, [mid](uint64_t hash) { return hash >= mid; });
  if (!high.ok()) return high.status();
  absl::StatusOr<Arena> low =
      MapBuild(arena_, [mid](uint64_t hash) { return hash < mid; });
  if (!low.ok()) return low.status();
  ReplaceArena(arena_, *std::move(low));
  return std::unique_ptr<MapShard>(new MapShard(*std::move(high)));
}

absl::Status MapShard::Absorb(const MapShard& other) {
  if (&other == this) {
    return absl::InvalidArgumentError("a map shard cannot absorb itself");
  }
  Change change(arena_);
  const MapHeader* h = MapHead(arena_);
  const uint64_t incoming = other.count();
  if ((h->index_used + incoming + 1) * 10 > h->index_slots * 7) {
    absl::Status s = MapRehash(arena_, h->count + incoming);
    if (!s.ok()) return s;
  }
  absl::Status status;
  ForEachSlot(other.arena_, [&](const Slot& s) {
    if (!status.ok()) return;
    const MapEntry* e = At<MapEntry>(other.arena_, s.offset);
    status = MapPut(arena_, s.hash, EntryKey(e), EntryValue(e));
  });
  if (!status.ok()) return status;
  MapMaybeCompact(arena_);
  return absl::OkStatus();
}

void MapShard::ForEach(
    const std::function<void(std::string_view, std::string_view)>& fn) const {
  ForEachSlot(arena_, [&](const Slot& s) {
    const MapEntry* e = At<MapEntry>(arena_, s.offset);
    fn(EntryKey(e), EntryValue(e));
  });
}

uint64_t MapShard::Scan(
    uint64_t lo, uint64_t hi, uint64_t from, uint64_t to, size_t max_bytes,
    const std::function<void(uint32_t, std::string_view, std::string_view)>& fn)
    const {
  to = std::min(to, kScanEnd);
  if (from >= to) return to;
  const MapHeader* h = MapHead(arena_);
  const Slot* slots = At<Slot>(arena_, h->index_offset);
  const uint64_t n = h->index_slots, mask = n - 1;
  const int bits = std::countr_zero(n);
  const int shift = 32 - bits;
  // Home slot k holds positions [k << shift, (k + 1) << shift): the homes
  // [first, last) cover [from, to). Walking slots in order visits their
  // entries, except those pushed past the last home taken by probing, which
  // lie between it and the next empty slot.
  const uint64_t first = from >> shift;
  const uint64_t last = ((to - 1) >> shift) + 1;
  struct Found {
    uint32_t position;
    uint64_t offset;
  };
  std::vector<Found> found;
  size_t bytes = 0;
  uint64_t end = last;  // homes [first, end) are taken
  // The entry at linear index j (slot j & mask) came from linear home
  // j - (its distance from its home); it is taken when that home is.
  auto visit = [&](uint64_t j) {
    const Slot& s = slots[j & mask];
    if (s.offset <= kTombstone) return;
    const uint64_t distance = ((j & mask) - layout::Home(s.hash, bits)) & mask;
    if (distance > j - first || j - distance >= end) return;
    if (s.hash < lo || (s.hash >= hi && hi != UINT64_MAX)) return;
    const uint32_t pos = layout::Position(s.hash);
    if (pos < from || pos >= to) return;
    found.push_back({pos, s.offset});
    const MapEntry* e = At<MapEntry>(arena_, s.offset);
    bytes += e->klen + e->vlen;
  };
  uint64_t j = first;
  for (; j < last; ++j) {
    visit(j);
    if (bytes >= max_bytes) {
      end = ++j;
      break;
    }
  }
  for (; j - end < n && slots[j & mask].offset != kEmptySlot; ++j) visit(j);
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.position < b.position;
  });
  for (const Found& f : found) {
    const MapEntry* e = At<MapEntry>(arena_, f.offset);
    fn(f.position, EntryKey(e), EntryValue(e));
  }
  return end == last ? to : std::min(to, end << shift);
}

// ---------------------------------------------------------------------------
// VectorShard.

absl::StatusOr<std::unique_ptr<VectorShard>> VectorShard::Create(
    uint64_t first) {
  absl::StatusOr<Arena> arena = Arena::Create();
  if (!arena.ok()) return arena.status();
  absl::Status s = VecInit(*arena, first, kMinTable);
  if (!s.ok()) return s;
  return std::unique_ptr<VectorShard>(new VectorShard(*std::move(arena)));
}

absl::StatusOr<std::unique_ptr<VectorShard>> VectorShard::Adopt(
    Arena arena, AdoptCheck check) {
  absl::Status s = CheckPrefix(arena, sizeof(VectorHeader), ShardKind::kVector);
  if (s.ok() && check == AdoptCheck::kFull) s = VecValidate(arena);
  if (!s.ok()) return s;
  return std::unique_ptr<VectorShard>(new VectorShard(std::move(arena)));
}

uint64_t VectorShard::first() const { return VecHead(arena_)->first; }

uint64_t VectorShard::count() const { return VecHead(arena_)->count; }

uint64_t VectorShard::live_bytes() const { return VecHead(arena_)->live_bytes; }

absl::StatusOr<uint64_t> VectorShard::PushBack(std::string_view value) {
  absl::Status s = CheckValue(value);
  if (s.ok()) s = VecAppend(arena_, value);
  if (!s.ok()) return s;
  return first() + count() - 1;
}

absl::StatusOr<std::string_view> VectorShard::Get(uint64_t index) const {
  const VectorHeader* h = VecHead(arena_);
  if (index < h->first || index - h->first >= h->count) {
    return absl::OutOfRangeError(
        absl::StrCat("index ", index, " is outside the shard's [", h->first,
                     ", ", h->first + h->count, ")"));
  }
  return BlobValue(arena_, VecTable(arena_)[index - h->first]);
}

absl::Status VectorShard::Set(uint64_t index, std::string_view value) {
  absl::Status s = CheckValue(value);
  if (!s.ok()) return s;
  VectorHeader* h = VecHead(arena_);
  if (index < h->first || index - h->first >= h->count) {
    return absl::OutOfRangeError(
        absl::StrCat("index ", index, " is outside the shard's [", h->first,
                     ", ", h->first + h->count, ")"));
  }
  const uint64_t position = index - h->first;
  const uint64_t offset = VecTable(arena_)[position];
  Blob* blob = At<Blob>(arena_, offset);
  const uint32_t old_len = blob->len;
  if (value.size() <= blob->cap) {
    blob->len = static_cast<uint32_t>(value.size());
    CopyBytes(reinterpret_cast<char*>(blob + 1), value);
    Touch(arena_, offset, sizeof(Blob) + value.size());
    h->live_bytes = h->live_bytes - old_len + value.size();
    Touch(arena_, h);
    return absl::OkStatus();
  }
  const uint64_t old_bytes = sizeof(Blob) + uint64_t{blob->cap};
  absl::StatusOr<uint64_t> moved = NewBlob(arena_, value);
  if (!moved.ok()) return moved.status();
  h = VecHead(arena_);
  uint64_t* slot = VecTable(arena_) + position;
  *slot = *moved;
  h->dead_bytes += old_bytes;
  h->live_bytes = h->live_bytes - old_len + value.size();
  Touch(arena_, slot);
  Touch(arena_, h);
  VecMaybeCompact(arena_);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string_view>> VectorShard::Range(
    uint64_t index, uint64_t n) const {
  const VectorHeader* h = VecHead(arena_);
  if (index < h->first || index - h->first > h->count) {
    return absl::OutOfRangeError(
        absl::StrCat("range start ", index, " is outside the shard's [",
                     h->first, ", ", h->first + h->count, "]"));
  }
  const uint64_t position = index - h->first;
  const uint64_t end = position + std::min(n, h->count - position);
  const uint64_t* table = VecTable(arena_);
  std::vector<std::string_view> values;
  values.reserve(end - position);
  for (uint64_t i = position; i < end; ++i) {
    values.push_back(BlobValue(arena_, table[i]));
  }
  return values;
}

absl::StatusOr<std::unique_ptr<VectorShard>> VectorShard::SplitOff(
    uint64_t at) {
  const VectorHeader* h = VecHead(arena_);
  if (at < h->first || at - h->first > h->count) {
    return absl::OutOfRangeError(
        absl::StrCat("split point ", at, " is outside the shard's [", h->first,
                     ", ", h->first + h->count, "]"));
  }
  const uint64_t first = h->first;
  const uint64_t count = h->count;
  absl::StatusOr<Arena> high = VecBuild(arena_, at - first, count, at);
  if (!high.ok()) return high.status();
  absl::StatusOr<Arena> low = VecBuild(arena_, 0, at - first, first);
  if (!low.ok()) return low.status();
  ReplaceArena(arena_, *std::move(low));
  return std::unique_ptr<VectorShard>(new VectorShard(*std::move(high)));
}

absl::Status VectorShard::Absorb(const VectorShard& next) {
  if (&next == this) {
    return absl::InvalidArgumentError("a vector shard cannot absorb itself");
  }
  if (next.first() != first() + count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vector shard starting at ", next.first(), " cannot follow [", first(),
        ", ", first() + count(), ")"));
  }
  absl::Status s = VecReserve(arena_, count() + next.count());
  const uint64_t* table = VecTable(next.arena_);
  for (uint64_t i = 0; s.ok() && i < next.count(); ++i) {
    s = VecAppend(arena_, BlobValue(next.arena_, table[i]));
  }
  return s;
}

// ---------------------------------------------------------------------------
// QueueShard.

absl::StatusOr<std::unique_ptr<QueueShard>> QueueShard::Create() {
  absl::StatusOr<Arena> arena = Arena::Create();
  if (!arena.ok()) return arena.status();
  absl::Status s = QueueInit(*arena, kMinTable);
  if (!s.ok()) return s;
  return std::unique_ptr<QueueShard>(new QueueShard(*std::move(arena)));
}

absl::StatusOr<std::unique_ptr<QueueShard>> QueueShard::Adopt(
    Arena arena, AdoptCheck check) {
  absl::Status s = CheckPrefix(arena, sizeof(QueueHeader), ShardKind::kQueue);
  if (s.ok() && check == AdoptCheck::kFull) s = QueueValidate(arena);
  if (!s.ok()) return s;
  return std::unique_ptr<QueueShard>(new QueueShard(std::move(arena)));
}

uint64_t QueueShard::count() const {
  const QueueHeader* h = QueueHead(arena_);
  return h->tail - h->head;
}

uint64_t QueueShard::live_bytes() const {
  return QueueHead(arena_)->live_bytes;
}

absl::Status QueueShard::Push(std::string_view value) {
  absl::Status s = CheckValue(value);
  if (!s.ok()) return s;
  return QueuePush(arena_, value);
}

std::optional<std::string> QueueShard::Pop() {
  QueueHeader* h = QueueHead(arena_);
  if (h->head == h->tail) return std::nullopt;
  const uint64_t offset = RingAt(arena_, h->head);
  const Blob* blob = At<Blob>(arena_, offset);
  std::string value(BlobValue(arena_, offset));
  ++h->head;
  h->live_bytes -= blob->len;
  h->dead_bytes += sizeof(Blob) + uint64_t{blob->cap};
  Touch(arena_, h);
  QueueMaybeCompact(arena_);
  return value;
}

absl::Status QueueShard::Absorb(const QueueShard& other) {
  if (&other == this) {
    return absl::InvalidArgumentError("a queue shard cannot absorb itself");
  }
  absl::Status s = QueueReserve(arena_, count() + other.count());
  const QueueHeader* oh = QueueHead(other.arena_);
  for (uint64_t p = oh->head; s.ok() && p < oh->tail; ++p) {
    s = QueuePush(arena_, BlobValue(other.arena_, RingAt(other.arena_, p)));
  }
  return s;
}

}  // namespace silt::proclets
