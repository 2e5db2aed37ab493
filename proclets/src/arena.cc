#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "layout.h"
#include "proclets/shard.h"

namespace silt::proclets {
namespace {

// Far beyond any machine's memory; keeps size arithmetic clear of overflow
// when a caller (or a peer's garbage) asks for an absurd size.
constexpr size_t kMaxMapping = size_t{1} << 46;

size_t RoundUpToPage(size_t n) {
  return (n + Arena::kPageSize - 1) & ~(Arena::kPageSize - 1);
}

layout::ArenaControl* Control(char* map) {
  return reinterpret_cast<layout::ArenaControl*>(map);
}

// Marks an arena retired for its readers, inside a change or not (a change
// under way is closed by it).
void Retire(layout::ArenaControl* c) {
  const uint64_t seq = c->seq.load(std::memory_order_relaxed) | 1;
  c->seq.store(seq, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  c->state.store(layout::kRetired, std::memory_order_relaxed);
  c->seq.store(seq + 1, std::memory_order_release);
}

}  // namespace

absl::StatusOr<Arena> Arena::Create(size_t reserve) {
  Arena arena;
  arena.fd_ = memfd_create("silt-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (arena.fd_ < 0)
    return absl::ResourceExhaustedError(
        absl::StrCat("memfd_create: ", strerror(errno)));
  absl::Status s = arena.Grow(std::max(reserve, kPageSize));
  if (!s.ok()) return s;
  // The owner's writable mapping exists now: from here on nobody may map the
  // file writable, write it or shrink it (the sharers get it read-only).
  if (fcntl(arena.fd_, F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0)
    return absl::InternalError(
        absl::StrCat("sealing an arena: ", strerror(errno)));
  Control(arena.map_)->magic = layout::kMagic;
  return arena;
}

Arena::Arena(Arena&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      map_(std::exchange(other.map_, nullptr)),
      base_(std::exchange(other.base_, nullptr)),
      mapped_(std::exchange(other.mapped_, 0)),
      used_(std::exchange(other.used_, 0)),
      tracking_(std::exchange(other.tracking_, false)),
      dirty_(std::move(other.dirty_)) {
  other.dirty_.clear();
}

Arena& Arena::operator=(Arena&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    map_ = std::exchange(other.map_, nullptr);
    base_ = std::exchange(other.base_, nullptr);
    mapped_ = std::exchange(other.mapped_, 0);
    used_ = std::exchange(other.used_, 0);
    tracking_ = std::exchange(other.tracking_, false);
    dirty_ = std::move(other.dirty_);
    other.dirty_.clear();
  }
  return *this;
}

Arena::~Arena() { Release(); }

void Arena::Release() {
  if (map_ != nullptr) {
    Retire(Control(map_));
    munmap(map_, kPageSize + mapped_);
  }
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  map_ = base_ = nullptr;
  mapped_ = 0;
}

absl::Status Arena::Grow(size_t need) {
  if (need <= mapped_) return absl::OkStatus();
  if (need > kMaxMapping) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "arena of ", need, " bytes exceeds the ", kMaxMapping, "-byte limit"));
  }
  const size_t exact = RoundUpToPage(need);
  // Doubling keeps a stream of appends at amortised O(1) remaps.
  size_t size = std::max(exact, std::min(mapped_ * 2, kMaxMapping));
  for (;;) {
    // A sharer cannot shrink the file, but one holding it writable through
    // /proc could have grown it: larger than asked is fine.
    bool sized = ftruncate(fd_, static_cast<off_t>(kPageSize + size)) == 0;
    if (!sized && errno == EPERM) {
      struct stat st;
      sized = fstat(fd_, &st) == 0 &&
              static_cast<size_t>(st.st_size) >= kPageSize + size;
    }
    void* p = MAP_FAILED;
    if (sized) {
      p = map_ == nullptr ? mmap(nullptr, kPageSize + size,
                                 PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0)
                          : mremap(map_, kPageSize + mapped_, kPageSize + size,
                                   MREMAP_MAYMOVE);
    }
    if (p != MAP_FAILED) {
      map_ = static_cast<char*>(p);
      base_ = map_ + kPageSize;
      mapped_ = size;
      Control(map_)->size.store(size, std::memory_order_release);
      return absl::OkStatus();
    }
    if (size == exact) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot grow arena from ", mapped_, " to ", size,
                       " bytes: ", strerror(errno)));
    }
    size = exact;  // The doubled size may not fit where the exact one does.
  }
}

void Arena::SetWindow(uint64_t lo, uint64_t hi, bool open) {
  if (map_ == nullptr) return;
  layout::ArenaControl* c = Control(map_);
  BeginChange();
  c->lo.store(lo, std::memory_order_relaxed);
  c->hi.store(hi, std::memory_order_relaxed);
  c->state.store(open ? layout::kOpen : layout::kClosed,
                 std::memory_order_relaxed);
  EndChange();
}

void Arena::BeginChange() {
  if (map_ == nullptr) return;
  layout::ArenaControl* c = Control(map_);
  c->seq.store(c->seq.load(std::memory_order_relaxed) + 1,
               std::memory_order_relaxed);
  // Readers must see the odd sequence before any byte of the change.
  std::atomic_thread_fence(std::memory_order_release);
}

void Arena::EndChange() {
  if (map_ == nullptr) return;
  layout::ArenaControl* c = Control(map_);
  c->seq.store(c->seq.load(std::memory_order_relaxed) + 1,
               std::memory_order_release);
}

void Arena::TakeWindow(Arena& old) {
  if (map_ == nullptr || old.map_ == nullptr) return;
  layout::ArenaControl* from = Control(old.map_);
  layout::ArenaControl* to = Control(map_);
  to->lo.store(from->lo.load(std::memory_order_relaxed));
  to->hi.store(from->hi.load(std::memory_order_relaxed));
  to->state.store(from->state.load(std::memory_order_relaxed));
  // Nobody maps this arena yet: it simply continues old's count, so that the
  // caller's EndChange closes the change here.
  to->seq.store(from->seq.load(std::memory_order_relaxed));
  Retire(from);
}

absl::StatusOr<uint64_t> Arena::Allocate(size_t n) {
  const size_t offset = (used_ + 7) & ~size_t{7};
  if (n > kMaxMapping || offset + n > kMaxMapping) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating ", n, " bytes exceeds the ", kMaxMapping,
                     "-byte arena limit"));
  }
  absl::Status s = Grow(offset + n);
  if (!s.ok()) return s;
  used_ = offset + n;
  // The whole block counts as written, slack included, so that a pre-copy
  // target ends up byte-identical to the source.
  if (tracking_) MarkDirty(offset, n);
  return offset;
}

void Arena::Reset() { used_ = 0; }

void Arena::TrackWrites(bool on) {
  tracking_ = on;
  dirty_.assign(on ? (mapped_ / kDirtyBlock + 63) / 64 : 0, 0);
}

void Arena::MarkDirty(uint64_t offset, size_t length) {
  if (!tracking_ || length == 0 || offset >= mapped_) return;
  length = std::min<uint64_t>(length, mapped_ - offset);
  const uint64_t first = offset / kDirtyBlock;
  const uint64_t last = (offset + length - 1) / kDirtyBlock;
  if (last / 64 >= dirty_.size()) dirty_.resize(last / 64 + 1, 0);
  for (uint64_t block = first; block <= last; ++block) {
    dirty_[block / 64] |= uint64_t{1} << (block % 64);
  }
}

std::vector<std::pair<uint64_t, uint64_t>> Arena::TakeDirty() {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  const uint64_t blocks = (used_ + kDirtyBlock - 1) / kDirtyBlock;
  for (uint64_t word = 0; word < dirty_.size(); ++word) {
    uint64_t bits = dirty_[word];
    while (bits != 0) {
      const uint64_t block = word * 64 + std::countr_zero(bits);
      bits &= bits - 1;
      if (block >= blocks) break;
      const uint64_t start = block * kDirtyBlock;
      if (!runs.empty() && runs.back().first + runs.back().second == start) {
        runs.back().second += kDirtyBlock;
      } else {
        runs.emplace_back(start, kDirtyBlock);
      }
    }
  }
  if (!runs.empty()) {
    auto& last = runs.back();
    last.second = std::min<uint64_t>(last.second, used_ - last.first);
  }
  std::fill(dirty_.begin(), dirty_.end(), 0);
  return runs;
}

absl::Status Arena::WriteAt(uint64_t offset, std::string_view bytes,
                            size_t new_used) {
  auto p = Receive(offset, bytes.size(), new_used);
  if (!p.ok()) return p.status();
  if (!bytes.empty()) memcpy(*p, bytes.data(), bytes.size());
  return absl::OkStatus();
}

absl::StatusOr<char*> Arena::Receive(uint64_t offset, size_t n,
                                     size_t new_used) {
  if (offset > new_used || n > new_used - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "write of ", n, " bytes at offset ", offset,
        " ends past the arena's new size of ", new_used, " bytes"));
  }
  absl::Status s = Grow(new_used);
  if (!s.ok()) return s;
  used_ = new_used;
  if (tracking_) MarkDirty(offset, n);
  return base_ + offset;
}

absl::Status Arena::Prefault(size_t n) {
  absl::Status s = Grow(n);
  if (!s.ok() || n == 0) return s;
  // Best effort: without MADV_POPULATE_WRITE (Linux < 5.14) pages fault in
  // as they are written. A piece at a time, so that the process's memory
  // map is not held for all of it (another thread may want to map memory).
  constexpr size_t kPiece = size_t{2} << 20;
  const size_t end = RoundUpToPage(n);
  for (size_t at = 0; at < end; at += kPiece)
    if (madvise(base_ + at, std::min(kPiece, end - at), MADV_POPULATE_WRITE) !=
        0)
      break;
  return absl::OkStatus();
}

}  // namespace silt::proclets
