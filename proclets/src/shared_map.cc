#include "proclets/shared_map.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "layout.h"
#include "proclets/shard.h"

namespace silt::proclets {
namespace {

using layout::ArenaControl;
using layout::MapEntry;
using layout::MapHeader;
using layout::Slot;

constexpr size_t kPage = Arena::kPageSize;
// Reads that overlap a change are retried this many times before the caller
// is sent to the owner (whose lock waits properly for a long change).
constexpr int kAttempts = 16;

enum class Found { kYes, kNo, kTorn };

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

template <typename T>
T Load(const char* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}

// The map lookup of shard.cc over bytes that may be changing: everything is
// checked against `size`, and the probe ends after every slot was seen once.
Found Find(const char* arena, size_t size, uint64_t hash, std::string_view key,
           std::string* value) {
  if (size < sizeof(MapHeader)) return Found::kTorn;
  const auto h = Load<MapHeader>(arena);
  if (h.prefix.magic != layout::kMagic ||
      h.prefix.version != layout::kFormatVersion ||
      h.prefix.kind != static_cast<uint8_t>(ShardKind::kMap))
    return Found::kTorn;
  const uint64_t slots = h.index_slots;
  if (slots == 0 || (slots & (slots - 1)) != 0 || slots > size / sizeof(Slot) ||
      slots > layout::kMaxSlots || h.index_offset > size ||
      slots * sizeof(Slot) > size - h.index_offset)
    return Found::kTorn;
  const char* index = arena + h.index_offset;
  const uint64_t mask = slots - 1;
  uint64_t i = layout::Home(hash, std::countr_zero(slots));
  for (uint64_t seen = 0; seen < slots; ++seen, i = (i + 1) & mask) {
    const auto s = Load<Slot>(index + i * sizeof(Slot));
    if (s.offset == layout::kEmptySlot) return Found::kNo;
    if (s.offset == layout::kTombstone || s.hash != hash) continue;
    if (s.offset > size || sizeof(MapEntry) > size - s.offset)
      return Found::kTorn;
    const auto e = Load<MapEntry>(arena + s.offset);
    const uint64_t bytes = uint64_t{e.klen} + e.vlen;
    if (bytes > size - s.offset - sizeof(MapEntry)) return Found::kTorn;
    const char* k = arena + s.offset + sizeof(MapEntry);
    if (e.klen != key.size() || memcmp(k, key.data(), key.size()) != 0)
      continue;
    if (value != nullptr) value->assign(k + e.klen, e.vlen);
    return Found::kYes;
  }
  return Found::kTorn;  // a full index: the owner never leaves one
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMapShard>> SharedMapShard::Open(int fd) {
  std::unique_ptr<SharedMapShard> v(new SharedMapShard());
  v->fd_ = fd;
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < kPage)
    return absl::InvalidArgumentError("not a shard arena's memory file");
  void* p = mmap(nullptr, kPage, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map a shard arena: ", strerror(errno)));
  v->map_ = static_cast<const char*>(p);
  const auto* c = reinterpret_cast<const ArenaControl*>(v->map_);
  if (c->magic != layout::kMagic)
    return absl::InvalidArgumentError("not a shard arena's memory file");
  if (!v->Remap(c->size.load(std::memory_order_acquire)))
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map a shard arena: ", strerror(errno)));
  return v;
}

SharedMapShard::~SharedMapShard() {
  if (map_ != nullptr) munmap(const_cast<char*>(map_), kPage + mapped_);
  if (fd_ >= 0) close(fd_);
}

bool SharedMapShard::Remap(size_t size) {
  if (size <= mapped_) return true;
  void* p = mremap(const_cast<char*>(map_), kPage + mapped_, kPage + size,
                   MREMAP_MAYMOVE);
  if (p == MAP_FAILED) return false;
  map_ = static_cast<const char*>(p);
  mapped_ = size;
  return true;
}

SharedMapShard::Read SharedMapShard::Get(std::string_view key, uint64_t hash,
                                         std::string* value) {
  return Lookup(key, hash, value);
}

SharedMapShard::Read SharedMapShard::Contains(std::string_view key,
                                              uint64_t hash) {
  return Lookup(key, hash, nullptr);
}

SharedMapShard::Read SharedMapShard::Lookup(std::string_view key, uint64_t hash,
                                            std::string* value) {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const auto* c = reinterpret_cast<const ArenaControl*>(map_);
    const uint64_t seq = c->seq.load(std::memory_order_acquire);
    if (seq & 1) {
      CpuRelax();
      continue;
    }
    const uint32_t state = c->state.load(std::memory_order_relaxed);
    if (state == layout::kRetired) return Read::kRetired;
    const uint64_t lo = c->lo.load(std::memory_order_relaxed);
    const uint64_t hi = c->hi.load(std::memory_order_relaxed);
    if (state != layout::kOpen || hash < lo || (hash >= hi && hi != UINT64_MAX))
      return Read::kNotHere;
    const size_t size = c->size.load(std::memory_order_relaxed);
    if (size > mapped_) {
      if (!Remap(size)) return Read::kNotHere;
      c = reinterpret_cast<const ArenaControl*>(map_);
    }
    Found f = Find(map_ + kPage, size, hash, key, value);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (c->seq.load(std::memory_order_relaxed) != seq) continue;
    if (f == Found::kTorn) return Read::kNotHere;  // consistent, yet odd
    return f == Found::kYes ? Read::kFound : Read::kAbsent;
  }
  return Read::kNotHere;
}

}  // namespace silt::proclets
