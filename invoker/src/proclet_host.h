// The invoker's memory proclets: the shards it holds, the state connections
// of its instances, and its data port, where peers send shard operations and
// migrations. Instances reach every shard of their namespace through here:
// shards on this node without a network hop, others over a pooled connection
// to the holder's data port. Where each shard lives comes from the gateway's
// directory (a resolver callback) and is cached; a MOVED reply from a shard's
// old home carries the new one.
//
// Peers prove they belong to the cluster with a key the gateway hands out, so
// that arenas received in a migration can be taken without an O(entries)
// check inside its pause.
//
// Data path: length-prefixed binary frames (silt/state_wire.h payloads) on
// plain sockets, not gRPC, so that a remote operation costs one round trip
// and no allocation-heavy protobuf work; gRPC stays the control path.
#ifndef SILT_INVOKER_PROCLET_HOST_H_
#define SILT_INVOKER_PROCLET_HOST_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "invoker/proto/proclets.pb.h"
#include "peer_wire.h"

namespace silt::invoker {

namespace pv1 = ::silt::proclets::v1;

struct ProcletHostOptions {
  std::string data_listen = "127.0.0.1:0";  // the data port
  // The directory. With create, makes the structure if absent (options
  // apply then); without, NotFound when absent.
  std::function<absl::StatusOr<pv1::Layout>(
      const std::string& ns, const std::string& name, pv1::Kind kind,
      uint32_t initial_shards, uint64_t max_shard_bytes, bool create,
      const std::string& function)>
      resolve;
  // Runs compute proclets that peers send here (data port kRunTask).
  TaskRunner run_task;
  // Serves an instance's compute-job requests (kJobStart, kJobWait); may
  // block. Empty: they fail as unavailable.
  std::function<std::string(const std::string& ns, const std::string& function,
                            std::string_view request)>
      jobs;
  // Serves an instance's GPU proclet request (op kGpu); may block. Empty:
  // they fail as unavailable.
  std::function<std::string(const std::string& ns, const std::string& function,
                            std::string_view request)>
      gpu;
  // Serves peers' GPU proclet frames on the data port (may be empty).
  GpuPeerHandlers gpu_peer;
};

class ProcletHost {
 public:
  static absl::StatusOr<std::unique_ptr<ProcletHost>> Start(
      ProcletHostOptions options);
  ~ProcletHost();  // closes every connection and joins its threads

  // Takes no more peer connections and joins the threads serving them (tasks
  // they run finish first), so the owner can tear down what `run_task` and
  // `jobs` use before destroying the host. Idempotent.
  void StopPeers();
  // Aborts the shard moves in progress from here and refuses new ones (see
  // ShardMover::Stop): the first thing a stopping node does. Idempotent.
  void StopMoves();

  std::string data_address() const;
  // The cluster's data-port key (from the gateway): every data connection,
  // in and out, starts with it; until it is set, none is made or taken.
  void SetDataKey(const std::string& key);
  // The key itself (for the invoker's other port, the call port).
  const DataKey& data_key() const;

  // Serves one instance's state connection (takes the fd) for a function of
  // namespace `ns`, until the instance closes it.
  void Attach(int fd, const std::string& ns, const std::string& function);

  // AlreadyExists when held here.
  absl::Status CreateShard(const pv1::ShardInfo& info);
  void DropShards(const std::vector<uint64_t>& ids);
  // Moves a shard to `target_data_address`: pre-copies while writes go on,
  // then holds writes only to send what changed since. On success the shard
  // answers MOVED here; on failure it keeps serving here, unchanged.
  // DeadlineExceeded (and nothing moved) when the final round would start
  // after `deadline`.
  absl::StatusOr<pv1::MigrateShardResponse> Migrate(
      uint64_t id, const std::string& target_data_address,
      std::chrono::system_clock::time_point deadline =
          std::chrono::system_clock::time_point::max());
  // Splits a map or vector shard at its middle; the upper half becomes shard
  // `new_id` on this node. FailedPrecondition when it cannot split.
  absl::StatusOr<pv1::SplitShardResponse> Split(uint64_t id, uint64_t new_id);
  // Merges shard `absorb` (the range right above `keep`'s, both held here)
  // into `keep` and returns keep's new info. Requests for `absorb` are served
  // by `keep` until the directory drops it. FailedPrecondition when they are
  // not adjacent or one of them is moving.
  absl::StatusOr<pv1::ShardInfo> Merge(uint64_t keep, uint64_t absorb);
  // Serves one state request as an instance of `function` (namespace ns)
  // would have it served (blocks); the reply.
  std::string Serve(const std::string& ns, const std::string& function,
                    std::string_view request);
  // The first frame of a connection to a peer's data port (peer_wire.h);
  // empty until the cluster's key is known.
  std::string Hello() const;
  // Forget cached layouts of one structure (it was deleted or changed).
  void ForgetLayout(const std::string& ns, const std::string& name);

  std::vector<pv1::ShardInfo> Shards() const;
  // Their bytes together.
  uint64_t shard_bytes() const;
  // State operations executed on shards held here so far (cumulative).
  uint64_t ops() const;
  // Memory held ready for shards that migrate here (the spare arena).
  uint64_t spare_bytes() const;

 private:
  struct Impl;
  explicit ProcletHost(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_PROCLET_HOST_H_
