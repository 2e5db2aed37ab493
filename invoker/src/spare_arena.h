// Memory made ready ahead of time for the next shard that migrates to this
// node. A migration's target must back every byte it receives with fresh
// memory, and on some machines (VMs above all) that costs as much as the
// copy itself (~1 ms/MiB measured on a 2-core cloud VM, 4 KiB pages): the
// spare moves that cost out of the move. One spare arena, backed in full,
// sized like the last shard that arrived (shards that move come in similar
// sizes: a drain, a rebalance), rebuilt on a thread of its own after each
// arrival. It costs the node that much memory, at most kMaxBytes.
//
// Thread safety: thread-safe.
#ifndef SILT_INVOKER_SPARE_ARENA_H_
#define SILT_INVOKER_SPARE_ARENA_H_

#include <cstddef>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proclets/shard.h"

namespace silt::invoker {

class SpareArena {
 public:
  // The largest spare kept (a larger shard is backed as it arrives).
  static constexpr size_t kMaxBytes = size_t{128} << 20;

  SpareArena();   // starts the thread; no spare until a shard arrives
  ~SpareArena();  // stops and joins it
  SpareArena(const SpareArena&) = delete;
  SpareArena& operator=(const SpareArena&) = delete;

  // An empty arena with at least `bytes` mapped and backed by memory: the
  // spare when it fits (not smaller, and not so much larger that it would
  // waste more than a grown arena does), else a new one backed now. The
  // next spare is made for `bytes`. ResourceExhausted when no memory.
  absl::StatusOr<proclets::Arena> Take(size_t bytes);

  // The size of the spare ready now; 0 when there is none.
  size_t ready_bytes() const;

 private:
  void Run();

  mutable absl::Mutex mu_;
  std::optional<proclets::Arena> spare_ ABSL_GUARDED_BY(mu_);
  size_t want_ ABSL_GUARDED_BY(mu_) = 0;  // bytes the next spare should have
  size_t spare_for_ ABSL_GUARDED_BY(mu_) = 0;  // the want_ spare_ was made for
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_SPARE_ARENA_H_
