#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proclets/shard.h"

namespace silt::proclets {
namespace {

// Far beyond any machine's memory; keeps size arithmetic clear of overflow
// when a caller (or a peer's garbage) asks for an absurd size.
constexpr size_t kMaxMapping = size_t{1} << 46;

size_t RoundUpToPage(size_t n) {
  return (n + Arena::kPageSize - 1) & ~(Arena::kPageSize - 1);
}

}  // namespace

absl::StatusOr<Arena> Arena::Create(size_t reserve) {
  Arena arena;
  absl::Status s = arena.Grow(std::max(reserve, kPageSize));
  if (!s.ok()) return s;
  return arena;
}

Arena::Arena(Arena&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      mapped_(std::exchange(other.mapped_, 0)),
      used_(std::exchange(other.used_, 0)),
      tracking_(std::exchange(other.tracking_, false)),
      dirty_(std::move(other.dirty_)) {
  other.dirty_.clear();
}

Arena& Arena::operator=(Arena&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) munmap(base_, mapped_);
    base_ = std::exchange(other.base_, nullptr);
    mapped_ = std::exchange(other.mapped_, 0);
    used_ = std::exchange(other.used_, 0);
    tracking_ = std::exchange(other.tracking_, false);
    dirty_ = std::move(other.dirty_);
    other.dirty_.clear();
  }
  return *this;
}

Arena::~Arena() {
  if (base_ != nullptr) munmap(base_, mapped_);
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
    void* p = base_ == nullptr ? mmap(nullptr, size, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                               : mremap(base_, mapped_, size, MREMAP_MAYMOVE);
    if (p != MAP_FAILED) {
      base_ = static_cast<char*>(p);
      mapped_ = size;
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
  dirty_.assign(on ? (mapped_ / kPageSize + 63) / 64 : 0, 0);
}

void Arena::MarkDirty(uint64_t offset, size_t length) {
  if (!tracking_ || length == 0 || offset >= mapped_) return;
  length = std::min<uint64_t>(length, mapped_ - offset);
  const uint64_t first = offset / kPageSize;
  const uint64_t last = (offset + length - 1) / kPageSize;
  if (last / 64 >= dirty_.size()) dirty_.resize(last / 64 + 1, 0);
  for (uint64_t page = first; page <= last; ++page) {
    dirty_[page / 64] |= uint64_t{1} << (page % 64);
  }
}

std::vector<std::pair<uint64_t, uint64_t>> Arena::TakeDirty() {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  const uint64_t pages = (used_ + kPageSize - 1) / kPageSize;
  for (uint64_t word = 0; word < dirty_.size(); ++word) {
    uint64_t bits = dirty_[word];
    while (bits != 0) {
      const uint64_t page = word * 64 + std::countr_zero(bits);
      bits &= bits - 1;
      if (page >= pages) break;
      const uint64_t start = page * kPageSize;
      if (!runs.empty() && runs.back().first + runs.back().second == start) {
        runs.back().second += kPageSize;
      } else {
        runs.emplace_back(start, kPageSize);
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
  if (offset > new_used || bytes.size() > new_used - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "write of ", bytes.size(), " bytes at offset ", offset,
        " ends past the arena's new size of ", new_used, " bytes"));
  }
  absl::Status s = Grow(new_used);
  if (!s.ok()) return s;
  if (!bytes.empty()) memcpy(base_ + offset, bytes.data(), bytes.size());
  used_ = new_used;
  if (tracking_) MarkDirty(offset, bytes.size());
  return absl::OkStatus();
}

}  // namespace silt::proclets
