// The shards this node holds, by id, and the operations that change which
// shards those are: create, drop, split, merge, and the lookup that runs one
// state operation on the shard covering a hint (following splits and merges
// made here, answering MOVED for shards that went elsewhere).
//
// Thread safety: thread-safe. The table's mutex guards only the id -> shard
// map; each shard has its own (hosted_shard.h). Lock order: the table's
// before a shard's (only Close() holds both); two shards by their ids (only
// Merge holds two).
#ifndef SILT_INVOKER_SHARD_TABLE_H_
#define SILT_INVOKER_SHARD_TABLE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "hosted_shard.h"
#include "invoker/proto/proclets.pb.h"
#include "silt/state_wire.h"

namespace silt::invoker {

class ShardTable {
 public:
  ShardTable() = default;
  ShardTable(const ShardTable&) = delete;
  ShardTable& operator=(const ShardTable&) = delete;

  // The shard of this id (possibly a tombstone: gone or merged), or null.
  std::shared_ptr<HostedShard> Find(uint64_t id) const;
  // Every shard in the table (tombstones too), for the caller to lock one at
  // a time.
  std::vector<std::shared_ptr<HostedShard>> All() const;
  // Holds hs as shard `id`, replacing whatever had that id.
  void Put(uint64_t id, std::shared_ptr<HostedShard> hs);

  // A new, empty shard. AlreadyExists when held here, InvalidArgument for an
  // unknown kind.
  absl::Status Create(const pv1::ShardInfo& info);
  // Forgets the shards and their bytes; requests still running on them get
  // MOVED with no address (ask the directory). Ids not held are skipped.
  void Drop(const std::vector<uint64_t>& ids);
  // See ProcletHost::Split: NotFound, AlreadyExists (new_id), or
  // FailedPrecondition when it cannot split.
  absl::StatusOr<pv1::SplitShardResponse> Split(uint64_t id, uint64_t new_id);
  // See ProcletHost::Merge: NotFound unless both are here,
  // FailedPrecondition when they are not adjacent or one of them is moving.
  absl::StatusOr<pv1::ShardInfo> Merge(uint64_t keep_id, uint64_t absorb_id);
  // The live shards (not moved, dropped or merged) with their sizes.
  std::vector<pv1::ShardInfo> Infos() const;

  // One operation on a shard held here (a peer's, or this node's own): r
  // holds u64 id, u64 hint, u8 op and the op's arguments; returns the reply.
  // With would_block set, returns "" and sets it instead of waiting for a
  // migration's final round or for a queue to fill.
  std::string HandleShardOp(wire::Reader r, bool* would_block = nullptr);

  // State operations executed so far (cumulative).
  uint64_t ops() const { return ops_.load(std::memory_order_relaxed); }

  // The host is stopping: queue pops waiting on these shards return.
  void Close();
  // Forgets every shard.
  void Clear();

 private:
  // The shard that holds `hint`, following splits made here. Returns it
  // locked, or null (with *moved set when it went elsewhere).
  // With would_block set, never waits: a frozen shard sets *would_block.
  static HostedShard* Resolve(std::shared_ptr<HostedShard> hs, uint64_t hint,
                              std::shared_ptr<HostedShard>* keep,
                              std::string* moved, uint64_t* moved_epoch,
                              bool* would_block = nullptr)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;

  mutable absl::Mutex mu_;  // shards and tombstones
  std::map<uint64_t, std::shared_ptr<HostedShard>> shards_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> ops_{0};  // shard operations executed (metrics)
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_SHARD_TABLE_H_
