// One shard held by this node's proclet host, and what runs an operation on
// it: the executor shared by instances on this node (the state loop's fast
// path, the router) and peers (the data port), plus the small helpers that
// build and read the replies of the state wire (silt/state_wire.h).
//
// Thread safety: every field of a HostedShard but throttle_us is guarded by
// its own mutex; Execute runs with that mutex held. The free functions are
// stateless.
#ifndef SILT_INVOKER_HOSTED_SHARD_H_
#define SILT_INVOKER_HOSTED_SHARD_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "invoker/proto/proclets.pb.h"
#include "proclets/shard.h"
#include "silt/state_wire.h"

namespace silt::invoker {

namespace pv1 = ::silt::proclets::v1;

// The hi of the last shard of a structure: its range has no end.
inline constexpr uint64_t kOpenEnd = wire::kOpenEnd;

// In a multi-get reply: the key belongs to another shard.
inline constexpr uint8_t kNotHere = 2;

// One shard held here. Shared (shared_ptr) by the host's table, the requests
// running on it, the shard it split off or merged into, and a migration
// moving it; it outlives its removal from the table as a tombstone that
// answers MOVED.
struct HostedShard {
  absl::Mutex mu;
  pv1::ShardInfo info ABSL_GUARDED_BY(mu);
  std::unique_ptr<proclets::MapShard> map ABSL_GUARDED_BY(mu);
  std::unique_ptr<proclets::VectorShard> vec ABSL_GUARDED_BY(mu);
  std::unique_ptr<proclets::QueueShard> queue ABSL_GUARDED_BY(mu);
  bool frozen ABSL_GUARDED_BY(mu) = false;  // final round of a migration
  bool gone ABSL_GUARDED_BY(mu) = false;    // moved or dropped
  std::string moved_to ABSL_GUARDED_BY(mu);
  uint64_t moved_epoch ABSL_GUARDED_BY(mu) = 0;
  // Halves split off this shard: requests whose hint is >= at go there.
  std::vector<std::pair<uint64_t, std::shared_ptr<HostedShard>>> splits
      ABSL_GUARDED_BY(mu);
  bool closing ABSL_GUARDED_BY(mu) = false;  // the host is stopping
  // While a migration's pre-copy does not converge, writes wait this long
  // first (auto-converge: the rounds shrink, and so does the final pause).
  std::atomic<uint32_t> throttle_us{0};
  // Set when merged into the shard below it: that one serves its range now.
  std::shared_ptr<HostedShard> merged_into ABSL_GUARDED_BY(mu);

  // The arena of whichever structure this is; null once dropped or moved.
  proclets::Arena* arena() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (map) return &map->arena();
    if (vec) return &vec->arena();
    if (queue) return &queue->arena();
    return nullptr;
  }
  // Opens or closes what instances on this node may read of a map shard
  // straight from its arena (they get its memory file: ShareMap): open only
  // while this copy is authoritative for info's range and nothing is moving.
  void Publish(bool open) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (map) map->arena().SetWindow(info.lo(), info.hi(), open);
  }
  uint64_t count() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (map) return map->count();
    if (vec) return vec->count();
    if (queue) return queue->count();
    return 0;
  }
};

// Runs op (its arguments are the rest of r) on a locked shard and returns the
// reply. A queue pop may wait for an element, releasing s.mu meanwhile.
std::string Execute(HostedShard& s, wire::StateOp op, wire::Reader& r)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// Whether op changes a shard (auto-converge throttles these).
bool IsWrite(wire::StateOp op);

// Whether hint falls in info's range.
bool Covers(const pv1::ShardInfo& info, uint64_t hint);

// ---- replies ----

// A reply: the code, then its payload.
std::string Reply(wire::StateCode code, std::string_view payload = {});
// An error reply: the code, then the message.
std::string Error(wire::StateCode code, absl::string_view message);
// The MOVED reply: the shard lives at `to` (empty: ask the directory) since
// `epoch`.
std::string MovedReply(const std::string& to, uint64_t epoch);
// The state code for a Status (from the directory or a shard).
wire::StateCode CodeOf(const absl::Status& s);

pv1::Kind ProtoKind(wire::StateKind k);
// "map", "vector", "queue" (for messages).
std::string KindName(pv1::Kind k);

}  // namespace silt::invoker

#endif  // SILT_INVOKER_HOSTED_SHARD_H_
