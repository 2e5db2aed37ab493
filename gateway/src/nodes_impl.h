// The node registry's internals, shared by the files that implement it:
// nodes.cc (the registry's life and its public face), nodes_control.cc (the
// Control service the invokers connect to, and the specs it assigns),
// nodes_placement.cc (where calls and functions go), nodes_calls.cc (calls
// over the nodes' call ports), nodes_logs.cc. Private to gateway/src.
#ifndef SILT_GATEWAY_NODES_IMPL_H_
#define SILT_GATEWAY_NODES_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "call_client.h"
#include "gateway/proto/control.grpc.pb.h"
#include "gpu_directory.h"
#include "instance_leases.h"
#include "invoker/call_wire.h"
#include "invoker/proto/invoker.grpc.pb.h"
#include "log_ring.h"
#include "nodes.h"
#include "openfaas_types.h"

namespace silt::gateway {

using Clock = std::chrono::steady_clock;
namespace v1 = silt::invoker::v1;
namespace control = silt::control::v1;
namespace pv1 = silt::proclets::v1;
namespace cw = silt::invoker::call_wire;

constexpr char kDataKeyKey[] = "data-port-key";
// Present once an invoker ever connected to this gateway's store: a restarted
// gateway then holds calls for a moment while its invokers reconnect.
constexpr char kNodesSeenKey[] = "nodes-seen";
constexpr size_t kDataKeyBytes = 32;

inline std::string Key(const std::string& ns, const std::string& name) {
  return ns + "/" + name;
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

inline absl::StatusOr<double> ParseQuantity(absl::string_view q, bool cpu) {
  q = absl::StripAsciiWhitespace(q);
  static const std::pair<const char*, double> kSuffixes[] = {
      {"Ki", 1024.0},
      {"Mi", 1048576.0},
      {"Gi", 1073741824.0},
      {"Ti", 1099511627776.0},
      {"Pi", 1125899906842624.0},
      {"Ei", 1152921504606846976.0},
      {"k", 1e3},
      {"M", 1e6},
      {"G", 1e9},
      {"T", 1e12},
      {"P", 1e15},
      {"E", 1e18},
      {"m", 1e-3}};
  double mult = 1;
  for (const auto& [suffix, m] : kSuffixes) {
    if (absl::EndsWith(q, suffix)) {
      q.remove_suffix(strlen(suffix));
      mult = m;
      break;
    }
  }
  double v = 0;
  if (q.empty() || !absl::SimpleAtod(q, &v) || v < 0 || !std::isfinite(v))
    return absl::InvalidArgumentError(absl::StrCat("bad quantity \"", q, "\""));
  (void)cpu;
  return v * mult;
}

struct NodeRegistry::Impl final : public control::Control::Service {
  struct Fn {
    control::FunctionSpec spec;
    uint64_t replicas = 0;
    // From the deployment's constraints ("node.name==N", "node.name!=N",
    // "kubernetes.io/hostname=N"); others are ignored, as faasd ignores all.
    std::vector<std::string> only_nodes, not_nodes;
    // Label com.silt.pin=NODE: runs only there (a constraint) and nothing of
    // it is ever moved by the rebalancer; com.silt.rebalance=false: placed
    // by free resources, never moved.
    bool pinned = false, rebalance = true;
    // An OCI image function runs only on the nodes that hold its image.
    bool needs_image = false;
    std::set<std::string> image_nodes;
    bool Movable() const { return !pinned && rebalance; }
    bool Allows(const std::string& node) const {
      auto has = [&](const std::vector<std::string>& v) {
        return std::find(v.begin(), v.end(), node) != v.end();
      };
      return (only_nodes.empty() || has(only_nodes)) && !has(not_nodes) &&
             (!needs_image || image_nodes.contains(node));
    }
  };
  struct Node {
    std::string name, address;
    uint64_t session = 0;
    uint32_t cores = 0, gpus = 0;
    uint64_t gpu_memory = 0;  // the first GPU's
    std::string gpu_model;
    uint32_t gpu_compute = 0;
    uint64_t memory = 0, memory_used = 0;
    std::string data_address;
    uint64_t shard_bytes = 0;
    uint32_t shards = 0;
    uint64_t state_ops = 0;  // cumulative, as last reported
    bool leaving = false;    // asked to be drained (Drain): place nothing here
    uint32_t tasks = 0;      // compute proclets running there
    double cpu_used = 0;     // cores busy, as last reported
    double cpu_foreign = 0;  // of which not Silt's (the last pulse)
    double view_cpu = -1;    // cpu_used as the executors last heard it
    uint32_t busy = 0;       // instances serving a call (the last pulse)
    // Over its CPU mark (the rebalancer): movable functions' calls and
    // replicas go elsewhere, no new compute proclets.
    bool hot = false;
    grpc::ServerContext* ctx = nullptr;
    grpc::ServerReaderWriter<control::GatewayMessage, control::NodeMessage>*
        stream = nullptr;
    std::mutex write_mu;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Invoker::Stub> stub;  // control: logs, snapshots
    std::unique_ptr<CallClient> calls;        // function calls
    // Calls straight to its instances, when it is on this machine (null
    // otherwise). Declared after `calls`: closed first.
    std::unique_ptr<InstanceLeases> leases;
    Clock::time_point last_seen;
    std::map<std::string, control::InstanceCount> counts;    // by ns/name
    std::map<std::string, int> inflight;                     // by ns/name
    std::map<std::string, control::SnapshotInfo> snapshots;  // by id
  };

  NodeRegistryOptions options;
  // Where the function calls' connections live (CallClient).
  std::vector<boost::asio::io_context*> contexts;
  store::Store* store;
  BundleStore* bundles;
  ImageArchives* images;
  Metrics* metrics = nullptr;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  // The cluster's data-port key (kept in the store, sent in assignments).
  std::string data_key;
  std::unique_ptr<Directory> directory;
  std::unique_ptr<Rebalancer> rebalancer;  // after directory: stops first
  std::unique_ptr<GpuDirectory> gpu_directory;

  std::mutex mu;
  std::map<std::string, std::shared_ptr<Node>> nodes;    // by name
  std::map<std::string, std::shared_ptr<const Fn>> fns;  // cache by ns/name
  bool fns_valid = false;
  // The autoscaler's replicas, by ns/name (over the function's own count).
  std::map<std::string, uint64_t> desired;
  std::map<std::string, uint64_t> calls;  // routed since the start, by ns/name
  LogRing gateway_log;  // the gateway's own lines in functions' logs
  uint64_t next_session = 1;
  uint64_t rr = 0;

  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;
  std::thread liveness;
  Clock::time_point started = Clock::now();
  bool expect_nodes = false;     // invokers connected to this store before
  bool nodes_seen_kept = false;  // guarded by mu
  ~Impl() override;

  // ---- function specs ----
  absl::StatusOr<std::shared_ptr<const Fn>> BuildFn(
      const store::FunctionRecord& rec);

  // Caller holds mu.
  absl::Status LoadFnsLocked();

  // Caller holds mu. Replicas spread over the nodes the function may run on,
  // in name order.
  control::Assignment AssignmentLocked(const std::string& node_name);

  // Caller holds mu. Whether the function's calls and replicas stay off hot
  // nodes: it may move and some node it may run on is not hot.
  bool AvoidHotLocked(const Fn& fn) const;

  void SendAssignments();

  // Every node as the invokers' executors see it (where compute proclets may
  // run): sent to each node when one joins or leaves and after each report.
  void SendClusterView();

  // ---- Control service ----
  grpc::Status Connect(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<control::GatewayMessage, control::NodeMessage>*
          stream) override;

  // The fast half of a node's load: what the rebalancer and the executors'
  // cluster view run on.
  void OnPulse(Node& node, const control::Pulse& p);

  // ---- rebalancer hooks ----
  std::vector<NodeLoadView> LoadViews();

  // Marks a node hot or cool; when hot, the functions with instances there
  // that may move: their calls now go to the other nodes (the one with the
  // most CPU to spare is named), which restore them from the snapshot.
  std::vector<InstanceMove> SetHot(const std::string& name, bool hot);

  // A structure's shards may move unless a function that uses it is pinned
  // or opted out.
  bool MayMove(const StructureView& v);

  // The catalog in the store: key "<id>/<node>", value the SnapshotInfo.
  // Written when a node's set changes (or what it keeps staged), not when
  // only the bytes it holds resident move: those are kept in memory.
  void RecordSnapshotsLocked(Node& node,
                             std::map<std::string, control::SnapshotInfo> now);

  static void ToLayout(const StructureView& v, pv1::Layout* out);

  grpc::Status OpenStructure(grpc::ServerContext*,
                             const control::OpenStructureRequest* req,
                             pv1::Layout* res) override;

  grpc::Status GetLayout(grpc::ServerContext*,
                         const control::GetLayoutRequest* req,
                         pv1::Layout* res) override;

  // A node that is stopping: from now on it takes no new proclets, and the
  // ones it holds move to the others. Runs on this handler thread for as long
  // as the migrations take (bounded by the caller's deadline).
  grpc::Status Drain(grpc::ServerContext* ctx, const control::DrainRequest* req,
                     control::DrainReply* res) override;

  // Live nodes for the directory.
  std::vector<DirectoryNode> DirectoryNodes();
  std::vector<GpuNode> GpuNodes();
  grpc::Status OpenGpuProclet(grpc::ServerContext*,
                              const control::OpenGpuProcletRequest* req,
                              control::GpuProcletLocation* res) override;

  grpc::Status FindSnapshot(grpc::ServerContext*,
                            const control::FindSnapshotRequest* req,
                            control::FindSnapshotResponse* res) override;

  grpc::Status FetchArchive(
      grpc::ServerContext*, const control::FetchArchiveRequest* req,
      grpc::ServerWriter<control::BundleChunk>* writer) override;
  // The images every node keeps (ImageSet), and sending it to every node:
  // the names of the nodes it went to.
  control::GatewayMessage ImageSetMessage() const;
  std::set<std::string> SendImageSet();
  grpc::Status FetchBundle(
      grpc::ServerContext*, const control::FetchBundleRequest* req,
      grpc::ServerWriter<control::BundleChunk>* writer) override;

  void LivenessLoop();

  // How long after the start calls wait for invokers to reconnect: their
  // longest reconnect backoff (2 s) past the node timeout.
  Clock::duration StartGrace() const;

  // Fails the parked calls once the start grace is over (or all, stopping).
  void FailParked(bool all);

  // ---- invoke ----

  struct Call {
    InvokeCall call;  // its method, path, query, headers and body: in `frame`
    std::function<void(absl::StatusOr<InvokeResult>)> done;
    std::shared_ptr<const Fn> fn;
    std::shared_ptr<Node> node;
    // The request as sent (kept to send again elsewhere).
    // Until it goes to a call port: the request (`frame` once sent there).
    cw::Request request;
    std::shared_ptr<const std::string> frame;
    bool with_spec = false;
    bool leased = false;  // it ran on a leased instance (instance_leases.h)
    bool lease_waited = false;  // it waited for a busy lease first
    std::vector<std::string> tried;
  };
  // Calls that came while no node could take them in the first moments after
  // this gateway started (its invokers are still reconnecting): dispatched as
  // nodes connect, failed once the grace is over. Guarded by mu.
  std::vector<std::shared_ptr<Call>> parked;

  // Caller holds mu. Of the nodes the function's constraints allow (a hot
  // one only when no other is left, while the function may move): the one
  // with the most idle instances of it, then the fewest calls of it in flight.
  // Where no node has an idle one (the call starts an instance), the node with
  // room for the function's memory limit and the most CPU to spare (in quarter
  // cores), then the fewest calls in flight; round robin breaks ties.
  std::shared_ptr<Node> PickLocked(const std::string& key, const Fn& fn,
                                   const std::vector<std::string>& exclude);

  void Invoke(InvokeCall c,
              std::function<void(absl::StatusOr<InvokeResult>)> done);

  void Dispatch(std::shared_ptr<Call> call);

  // To `call->node`: straight to an instance leased from it when that can
  // take the call (instance_leases.h), else through its call port.
  void Send(std::shared_ptr<Call> call);

  // The node does not know this function version: the call goes again with
  // its spec.
  void SendWithSpec(std::shared_ptr<Call> call);

  // Through the node's call port (the frame built once).
  void SendToPort(std::shared_ptr<Call> call);
  void OnDone(std::shared_ptr<Call> call, absl::StatusOr<cw::Reply>& r,
              std::shared_ptr<BodyStream> rest);

  // Reads the rest of a streamed body into out->body, for a caller that
  // takes it whole (an async call's callback).
  static void ReadWhole(std::shared_ptr<BodyStream> rest,
                        std::shared_ptr<InvokeResult> out,
                        std::function<void(absl::StatusOr<InvokeResult>)> done);

  // ---- logs ----
  void Logs(const std::string& ns, const std::string& name, int64_t since,
            int64_t tail, bool follow,
            const std::function<bool(const LogRecord&)>& emit,
            const std::function<bool()>& stop);
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_NODES_IMPL_H_
