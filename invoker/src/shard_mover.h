// The source side of moving a shard held here to another node's data port
// (the target side is DataPort): pre-copies the shard's arena while writes go
// on, in rounds of what they dirtied (slowing writers down while rounds stop
// shrinking), then holds writes only to send what changed since and commit.
// The bytes go from a read-only mapping of the arena's memory file straight
// into the socket (one copy), and land straight in the target's arena.
// The shard's old arena is freed afterwards by a thread of its own.
//
// Thread safety: thread-safe; a shard moves at most once at a time (a second
// Migrate of it is FailedPrecondition). Moves lock the moving shard only to
// take each round's dirty pages; writes wait (frozen, not locked) during the
// final round.
#ifndef SILT_INVOKER_SHARD_MOVER_H_
#define SILT_INVOKER_SHARD_MOVER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "invoker/proto/proclets.pb.h"
#include "peer_wire.h"
#include "shard_table.h"

namespace silt::invoker {

// Frees what it is given on its own thread: the arenas of shards that moved
// away (unmapping and truncating tens of MiB takes milliseconds, which would
// otherwise be part of every move).
class Reaper {
 public:
  Reaper();
  ~Reaper();  // frees what is queued, then joins
  void Free(std::shared_ptr<void> garbage);

 private:
  void Run();
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<void>> queue_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

class ShardMover {
 public:
  // `self` is this node's data address. `shards` and `key` must outlive the
  // mover.
  ShardMover(std::string self, ShardTable& shards, const DataKey& key);
  ShardMover(const ShardMover&) = delete;
  ShardMover& operator=(const ShardMover&) = delete;

  // See ProcletHost::Migrate. NotFound when the shard is not here,
  // InvalidArgument when `target` is this node, FailedPrecondition when it is
  // already moving, Unavailable without the data key or a reachable target,
  // DeadlineExceeded when the final round would start after `deadline`.
  // On success the shard answers MOVED here; on failure it keeps serving
  // here, unchanged.
  // Unavailable once Stop() was called.
  absl::StatusOr<pv1::MigrateShardResponse> Migrate(
      uint64_t id, const std::string& target,
      std::chrono::system_clock::time_point deadline);

  // Aborts the moves in progress (their connections are shut down, so they
  // fail at once and their shards stay here, unchanged) and refuses new ones:
  // a node that is stopping does not wait for a copy to finish. Idempotent.
  void Stop();

 private:
  // A move's connection, known to Stop() while the move runs.
  class Registration;

  const std::string self_;
  ShardTable& shards_;
  const DataKey& key_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> moving_fds_ ABSL_GUARDED_BY(mu_);
  Reaper reaper_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_SHARD_MOVER_H_
