#include "spare_arena.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace silt::invoker {
namespace {

using proclets::Arena;

absl::StatusOr<Arena> Backed(size_t bytes) {
  auto a = Arena::Create();
  if (!a.ok()) return a.status();
  if (auto s = a->Prefault(bytes); !s.ok()) return s;
  return a;
}

// Whether `a` may stand in for a new arena of `bytes`: large enough, and
// wasting no more than doubling growth would (or than a small arena).
bool Fits(const Arena& a, size_t bytes) {
  constexpr size_t kSmall = 1 << 20;
  return a.mapped() >= bytes && a.mapped() <= std::max(2 * bytes, kSmall);
}

}  // namespace

SpareArena::SpareArena() : thread_([this] { Run(); }) {}

SpareArena::~SpareArena() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

absl::StatusOr<Arena> SpareArena::Take(size_t bytes) {
  std::optional<Arena> spare;
  {
    absl::MutexLock l(&mu_);
    if (spare_ && Fits(*spare_, bytes)) spare.swap(spare_);
    want_ = std::min(bytes, kMaxBytes);
    // A spare that does not fit is kept: the thread replaces it.
  }
  if (spare) return *std::move(spare);
  return Backed(bytes);
}

size_t SpareArena::ready_bytes() const {
  absl::MutexLock l(&mu_);
  return spare_ ? spare_->mapped() : 0;
}

void SpareArena::Run() {
  // Background work: writers and moves come first.
  (void)setpriority(PRIO_PROCESS, static_cast<int>(syscall(SYS_gettid)), 19);
  while (true) {
    size_t want;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](SpareArena* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->stopping_ ||
                   (s->want_ > 0 && (!s->spare_ || s->spare_for_ != s->want_));
          },
          this));
      if (stopping_) return;
      want = want_;
    }
    auto made = Backed(want);  // without the lock: milliseconds
    std::optional<Arena> old;
    absl::MutexLock l(&mu_);
    if (!made.ok()) {
      want_ = 0;  // no memory for it: none until the next arrival
      continue;
    }
    old = std::move(spare_);
    spare_ = *std::move(made);
    spare_for_ = want;
  }
}

}  // namespace silt::invoker
