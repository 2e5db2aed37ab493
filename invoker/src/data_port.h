// The proclet host's data port: where peers (after proving the cluster's key,
// peer_wire.h) run operations on the shards held here, and where shards that
// migrate to this node arrive. Each peer connection is served, in order, on a
// thread of its own.
//
// Thread safety: thread-safe. The port's connections are its ConnServer's;
// the shards live in the ShardTable it was given.
#ifndef SILT_INVOKER_DATA_PORT_H_
#define SILT_INVOKER_DATA_PORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "conn_server.h"
#include "peer_wire.h"
#include "shard_table.h"
#include "spare_arena.h"

namespace silt::invoker {

class DataPort {
 public:
  // Binds `data_listen` (host:port; port 0 picks one) without accepting yet.
  // InvalidArgument for a bad address, Unavailable when it cannot listen.
  // `shards` and `key` must outlive the port. `run_task` serves kRunTask
  // (may be empty: those connections are then closed); `gpu` kGpu and
  // kGpuAdopt (likewise).
  static absl::StatusOr<std::unique_ptr<DataPort>> Listen(
      const std::string& data_listen, ShardTable& shards, const DataKey& key,
      TaskRunner run_task = {}, GpuPeerHandlers gpu = {});
  ~DataPort();  // Shutdown(), then Join()

  DataPort(const DataPort&) = delete;
  DataPort& operator=(const DataPort&) = delete;

  // host:port of the port (with the port picked when 0 was asked for).
  const std::string& address() const { return server_->address(); }

  // Memory held ready for the next shard to arrive (SpareArena).
  uint64_t spare_bytes() const { return spare_.ready_bytes(); }

  // Starts accepting peers (once).
  void StartAccepting();
  // Stops accepting and shuts down every peer connection, so that no shard
  // arrives from now on; their threads may still be finishing (Join).
  // Idempotent.
  void Shutdown();
  // Joins the connection threads and closes the listener. Call after
  // Shutdown(). Idempotent.
  void Join();

 private:
  DataPort(ShardTable& shards, const DataKey& key, TaskRunner run_task,
           GpuPeerHandlers gpu);

  // A peer's connection: its requests are answered in order, and the answers
  // to requests that arrived together leave in one write.
  void ServePeer(int fd);

  ShardTable& shards_;
  const DataKey& key_;
  const TaskRunner run_task_;
  const GpuPeerHandlers gpu_;
  SpareArena spare_;  // for the next shard to arrive
  std::unique_ptr<ConnServer> server_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_DATA_PORT_H_
