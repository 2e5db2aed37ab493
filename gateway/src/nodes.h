// The gateway's view of the invokers: the Control gRPC service they connect to,
// their load, the per-node assignment of replicas, and the invoke path to a
// chosen node. gRPC stays inside nodes.cc.
#ifndef SILT_GATEWAY_NODES_H_
#define SILT_GATEWAY_NODES_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bundles.h"
#include "directory.h"
#include "gpu_directory.h"
#include "http_types.h"
#include "images.h"
#include "invoker/call_wire.h"
#include "metrics.h"
#include "rebalancer.h"
#include "store/store.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace silt::gateway {

// The most of a streamed response read whole for a caller that does not take
// parts.
inline constexpr size_t kMaxWholeBody = 64 << 20;

struct InvokeCall {
  std::string ns;
  std::string name;
  std::string call_id;
  std::string method;
  std::string path;
  std::string query;
  HeaderList headers;
  std::string body;
  // The body's rest, when it streams (HttpRequest::body_rest): sent to the
  // node as it arrives. Such a call is not tried on another node once its
  // body began to go out.
  std::shared_ptr<BodyStream> body_rest;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // X-Silt-Cold-Start: a new instance started this way serves the call.
  invoker::call_wire::ColdStart cold_start =
      invoker::call_wire::ColdStart::kAny;
  // Whether the caller takes a streamed response in parts
  // (InvokeResult::parts); otherwise its body is read whole first, up to
  // kMaxWholeBody.
  bool take_parts = false;
};

struct InvokeResult {
  int status = 0;
  HeaderList headers;
  std::string body;  // the first part only, when `parts` is set
  // The rest of a streamed body (InvokeCall::take_parts).
  std::shared_ptr<BodyStream> parts;
  invoker::call_wire::StartTier start_tier =
      invoker::call_wire::StartTier::kWarm;
  double start_ms = 0;
  std::string instance;
  std::string node;
  // Set when the instance died serving the call.
  invoker::call_wire::Failure failure = invoker::call_wire::Failure::kNone;
};

struct LogRecord {
  std::string name, ns, instance, text;
  int64_t timestamp_unix_nanos = 0;
};

struct NodeInfo {
  std::string name;
  std::string address;
  uint32_t cores = 0;
  uint32_t gpus = 0;
  uint64_t memory_bytes = 0;
  uint64_t memory_used_bytes = 0;
  uint32_t instances = 0;
  std::string data_address;  // state and migration traffic
  uint32_t shards = 0;       // memory proclets held
  uint64_t shard_bytes = 0;
  double cpu_used = 0;     // cores its instances kept busy (last report)
  uint32_t tasks = 0;      // compute proclets running there
  double cpu_foreign = 0;  // of cpu_used, not Silt's (the last pulse)
  bool hot = false;        // over its CPU mark: work moved off it
};

// One snapshot image and the nodes that hold it (the catalog).
struct SnapshotView {
  std::string id, name, ns;
  uint64_t generation = 0;
  uint64_t bytes = 0;
  int64_t created_unix = 0;
  double checkpoint_ms = 0;
  std::vector<std::string> nodes;  // online nodes that hold it
  bool template_resident = false;  // a fork template on some node
  bool restorer_staged = false;    // a staged restorer on some node
  // What its staged restorers and templates hold now, on all nodes, and on
  // each (the nodes' resident budgets).
  uint64_t resident_bytes = 0;
  std::map<std::string, uint64_t> resident_by_node;
  bool current = false;  // of the function's current version
};

// One function's load, for the autoscaler.
struct FunctionLoad {
  std::string ns, name;
  std::map<std::string, std::string> labels;
  uint64_t replicas = 0;  // the user's count (FunctionRecord.replicas)
  uint64_t calls = 0;     // calls routed to nodes since the gateway started
  uint64_t inflight = 0;  // of them, running now
  uint64_t ready = 0;     // instances of its current version up
  // Cores its instances keep busy: each node's instance CPU (last pulse),
  // shared among the functions by their busy instances there.
  double cpu_cores = 0;
};

struct NodeRegistryOptions {
  std::string listen = "127.0.0.1:8081";
  // A node that sends no report for this long is dropped and its replicas move.
  std::chrono::milliseconds node_timeout{std::chrono::seconds(5)};
  DirectoryOptions directory;
  RebalancerOptions rebalancer;
  // Lease warm instances from nodes on this machine (instance_leases.h).
  bool instance_leases = true;
};

class NodeRegistry {
 public:
  // Function calls to the nodes run on `contexts` (invoker/call_wire.h),
  // each on the one the calling thread runs. They, and `metrics` (may be
  // null), must outlive the registry.
  static absl::StatusOr<std::unique_ptr<NodeRegistry>> Start(
      const NodeRegistryOptions& options,
      const std::vector<boost::asio::io_context*>& contexts,
      store::Store* store, BundleStore* bundles, ImageArchives* images,
      Metrics* metrics = nullptr);
  ~NodeRegistry();

  std::string address() const;
  // The proclet directory (owned here: it places shards on these nodes).
  Directory* directory();
  // Where GPU proclets are (placement, moves).
  GpuDirectory* gpu_directory();
  // The function table changed (deploy, update, delete, scale, secret): rebuild
  // the specs and send every node its new assignment.
  void FunctionsChanged();
  // The image catalog changed (silt image import, remove): send every node
  // the images it keeps. The names of the nodes connected now.
  std::set<std::string> ImagesChanged();
  // Routes one call to a node. `done` runs on an io_context thread (or here).
  // NotFound: no such function; Unavailable: no node can run it;
  // DeadlineExceeded: it timed out.
  void Invoke(InvokeCall call,
              std::function<void(absl::StatusOr<InvokeResult>)> done);
  // Instances of the function's current version that are up, over all nodes.
  uint64_t AvailableReplicas(const std::string& ns, const std::string& name);
  std::vector<NodeInfo> Nodes();
  // The snapshot catalog (namespace "" = all); with name, one function's.
  std::vector<SnapshotView> Snapshots(const std::string& ns,
                                      const std::string& name = "");
  // Tells every node to drop the function's snapshots; returns how many
  // catalog entries went.
  size_t DeleteSnapshots(const std::string& ns, const std::string& name);
  // The rebalancer's decisions after sequence number `after` (waits up to
  // `wait` for one).
  std::vector<RebalanceEvent> Events(uint64_t after,
                                     std::chrono::milliseconds wait);
  // Every deployed function with its load now (for the autoscaler).
  std::vector<FunctionLoad> FunctionLoads();
  // The replicas the nodes keep for the function from now on (the
  // autoscaler's decision); nullopt: the user's count again. Sends the nodes
  // their assignments when it changed.
  void SetDesiredReplicas(const std::string& ns, const std::string& name,
                          std::optional<uint64_t> replicas);
  // The replicas the nodes are asked to keep: the autoscaler's decision, else
  // `user` (the function record's count).
  uint64_t DesiredReplicas(const std::string& ns, const std::string& name,
                           uint64_t user);
  // A line from the gateway itself in the function's logs (scale decisions).
  void GatewayLog(const std::string& ns, const std::string& name,
                  const std::string& text);
  // Collects log lines from every node and the gateway's own (blocking; with
  // follow, until `stop` or the emit callback returns false).
  void Logs(const std::string& ns, const std::string& name, int64_t since,
            int64_t tail, bool follow,
            const std::function<bool(const LogRecord&)>& emit,
            const std::function<bool()>& stop);

 private:
  struct Impl;
  explicit NodeRegistry(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Kubernetes quantities: "128Mi" → 134217728 bytes; "500m" CPU → 500
// millicores.
absl::StatusOr<uint64_t> ParseMemoryQuantity(absl::string_view q);
absl::StatusOr<uint64_t> ParseCpuMillis(absl::string_view q);

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_NODES_H_
