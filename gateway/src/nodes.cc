#include "nodes.h"

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
#include "invoker/call_wire.h"
#include "invoker/proto/invoker.grpc.pb.h"
#include "log_ring.h"
#include "openfaas_types.h"

namespace silt::gateway {
namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = silt::invoker::v1;
namespace pv1 = silt::proclets::v1;
namespace cw = silt::invoker::call_wire;

constexpr char kDataKeyKey[] = "data-port-key";
// Present once an invoker ever connected to this gateway's store: a restarted
// gateway then holds calls for a moment while its invokers reconnect.
constexpr char kNodesSeenKey[] = "nodes-seen";
constexpr size_t kDataKeyBytes = 32;

std::string Key(const std::string& ns, const std::string& name) {
  return ns + "/" + name;
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

absl::StatusOr<double> ParseQuantity(absl::string_view q, bool cpu) {
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

}  // namespace

absl::StatusOr<uint64_t> ParseMemoryQuantity(absl::string_view q) {
  auto v = ParseQuantity(q, false);
  if (!v.ok()) return v.status();
  return static_cast<uint64_t>(std::llround(*v));
}

absl::StatusOr<uint64_t> ParseCpuMillis(absl::string_view q) {
  auto v = ParseQuantity(q, true);
  if (!v.ok()) return v.status();
  return static_cast<uint64_t>(std::llround(*v * 1000));
}

struct NodeRegistry::Impl final : public v1::Control::Service {
  struct Fn {
    v1::FunctionSpec spec;
    uint64_t replicas = 0;
    // From the deployment's constraints ("node.name==N", "node.name!=N",
    // "kubernetes.io/hostname=N"); others are ignored, as faasd ignores all.
    std::vector<std::string> only_nodes, not_nodes;
    // Label com.silt.pin=NODE: runs only there (a constraint) and nothing of
    // it is ever moved by the rebalancer; com.silt.rebalance=false: placed
    // by free resources, never moved.
    bool pinned = false, rebalance = true;
    bool Movable() const { return !pinned && rebalance; }
    bool Allows(const std::string& node) const {
      auto has = [&](const std::vector<std::string>& v) {
        return std::find(v.begin(), v.end(), node) != v.end();
      };
      return (only_nodes.empty() || has(only_nodes)) && !has(not_nodes);
    }
  };
  struct Node {
    std::string name, address;
    uint64_t session = 0;
    uint32_t cores = 0, gpus = 0;
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
    grpc::ServerReaderWriter<v1::GatewayMessage, v1::NodeMessage>* stream =
        nullptr;
    std::mutex write_mu;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Invoker::Stub> stub;  // control: logs, snapshots
    std::unique_ptr<CallClient> calls;        // function calls
    Clock::time_point last_seen;
    std::map<std::string, v1::InstanceCount> counts;    // by ns/name
    std::map<std::string, int> inflight;                // by ns/name
    std::map<std::string, v1::SnapshotInfo> snapshots;  // by id
  };

  NodeRegistryOptions options;
  // Where the function calls' connections live (CallClient).
  std::vector<boost::asio::io_context*> contexts;
  store::Store* store;
  BundleStore* bundles;
  Metrics* metrics = nullptr;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  // The cluster's data-port key (kept in the store, sent in assignments).
  std::string data_key;
  std::unique_ptr<Directory> directory;
  std::unique_ptr<Rebalancer> rebalancer;  // after directory: stops first

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

  ~Impl() override {
    rebalancer.reset();
    {
      std::lock_guard<std::mutex> l(stop_mu);
      stopping = true;
    }
    stop_cv.notify_all();
    {
      std::lock_guard<std::mutex> l(mu);
      for (auto& [n, node] : nodes)
        if (node->ctx) node->ctx->TryCancel();
    }
    if (server)
      server->Shutdown(std::chrono::system_clock::now() +
                       std::chrono::seconds(1));
    if (liveness.joinable()) liveness.join();
    FailParked(true);
    // Calls in flight end with Unavailable (on the io_context, if it runs).
    std::lock_guard<std::mutex> l(mu);
    for (auto& [n, node] : nodes) node->calls->Close();
  }

  // ---- function specs ----

  absl::StatusOr<std::shared_ptr<const Fn>> BuildFn(
      const store::FunctionRecord& rec) {
    auto d = ParseFunctionDeployment(rec.spec);
    if (!d.ok()) return d.status();
    auto fn = std::make_shared<Fn>();
    fn->replicas = rec.replicas;
    v1::FunctionSpec& s = fn->spec;
    s.set_name(rec.name);
    s.set_namespace_(rec.ns);
    s.set_generation(rec.generation);
    s.set_image(d->image);
    auto digest = proclets::BundleDigestOf(d->image);
    if (digest.ok()) s.set_bundle_digest(*digest);
    s.set_env_process(d->env_process);
    for (const auto& [k, v] : d->env_vars) (*s.mutable_env())[k] = v;
    if (d->labels) {
      for (const auto& [k, v] : *d->labels) (*s.mutable_labels())[k] = v;
      if (auto it = d->labels->find("com.silt.pin");
          it != d->labels->end() && !it->second.empty()) {
        fn->pinned = true;
        fn->only_nodes.push_back(it->second);
      }
      if (auto it = d->labels->find("com.silt.rebalance");
          it != d->labels->end() && it->second == "false")
        fn->rebalance = false;
    }
    for (const auto& name : d->secrets) {
      auto secret = store->GetSecret(rec.ns, name);
      if (secret.ok()) {
        (*s.mutable_secrets())[name] = secret->value;
      } else {
        // The instances start without it (the function reads no file there),
        // and the operator learns why.
        fprintf(stderr, "silt-gateway: function %s.%s: secret %s: %s\n",
                rec.name.c_str(), rec.ns.c_str(), name.c_str(),
                std::string(secret.status().message()).c_str());
      }
    }
    for (const auto& c : d->constraints) {
      std::string flat = absl::StrReplaceAll(c, {{" ", ""}});
      for (auto [prefix, list] :
           {std::pair{"node.name==", &fn->only_nodes},
            std::pair{"kubernetes.io/hostname=", &fn->only_nodes},
            std::pair{"node.name!=", &fn->not_nodes}}) {
        if (absl::StartsWith(flat, prefix)) {
          list->push_back(flat.substr(strlen(prefix)));
          break;
        }
      }
    }
    if (d->limits && !d->limits->memory.empty())
      if (auto m = ParseMemoryQuantity(d->limits->memory); m.ok())
        s.set_memory_limit_bytes(*m);
    if (d->limits && !d->limits->cpu.empty())
      if (auto c = ParseCpuMillis(d->limits->cpu); c.ok()) s.set_cpu_millis(*c);
    return std::shared_ptr<const Fn>(std::move(fn));
  }

  // Caller holds mu.
  absl::Status LoadFnsLocked() {
    if (fns_valid) return absl::OkStatus();
    auto recs = store->ListFunctions("");
    if (!recs.ok()) return recs.status();
    fns.clear();
    for (const auto& rec : *recs) {
      auto fn = BuildFn(rec);
      if (fn.ok()) fns[Key(rec.ns, rec.name)] = *fn;
    }
    fns_valid = true;
    return absl::OkStatus();
  }

  // Caller holds mu. Replicas spread over the nodes the function may run on,
  // in name order.
  v1::Assignment AssignmentLocked(const std::string& node_name) {
    v1::Assignment a;
    a.set_data_key(data_key);
    for (const auto& [key, fn] : fns) {
      if (fn->spec.bundle_digest().empty()) continue;
      if (!fn->Allows(node_name)) continue;
      std::vector<std::string> names;
      for (const auto& [n, node] : nodes)
        if (fn->Allows(n) && !(node->hot && AvoidHotLocked(*fn)))
          names.push_back(n);
      size_t index =
          std::find(names.begin(), names.end(), node_name) - names.begin();
      size_t count = names.size();
      v1::FunctionSpec* s = a.add_functions();
      *s = fn->spec;
      auto d = desired.find(key);
      uint64_t replicas = d == desired.end() ? fn->replicas : d->second;
      uint64_t share =
          count == 0 ? 0
                     : replicas / count + (index < replicas % count ? 1 : 0);
      s->set_min_instances(static_cast<uint32_t>(share));
    }
    return a;
  }

  // Caller holds mu. Whether the function's calls and replicas stay off hot
  // nodes: it may move and some node it may run on is not hot.
  bool AvoidHotLocked(const Fn& fn) const {
    if (!fn.Movable()) return false;
    for (const auto& [n, node] : nodes)
      if (!node->hot && fn.Allows(n)) return true;
    return false;
  }

  void SendAssignments() {
    std::vector<std::pair<std::shared_ptr<Node>, v1::GatewayMessage>> out;
    {
      std::lock_guard<std::mutex> l(mu);
      LoadFnsLocked()
          .IgnoreError();  // a store error leaves the last assignment in place
      for (const auto& [n, node] : nodes) {
        v1::GatewayMessage m;
        *m.mutable_assignment() = AssignmentLocked(n);
        out.emplace_back(node, std::move(m));
      }
    }
    for (auto& [node, m] : out) {
      std::lock_guard<std::mutex> w(node->write_mu);
      if (node->stream) node->stream->Write(m);
    }
  }

  // Every node as the invokers' executors see it (where compute proclets may
  // run): sent to each node when one joins or leaves and after each report.
  void SendClusterView() {
    v1::GatewayMessage m;
    std::vector<std::shared_ptr<Node>> to;
    {
      std::lock_guard<std::mutex> l(mu);
      auto* view = m.mutable_cluster();
      for (const auto& [n, node] : nodes) {
        auto* v = view->add_nodes();
        v->set_name(node->name);
        v->set_data_address(node->data_address);
        v->set_cores(node->cores);
        v->set_draining(node->leaving);
        v->set_tasks(node->tasks);
        v->set_cpu_used(node->cpu_used);
        v->set_hot(node->hot);
        to.push_back(node);
      }
    }
    for (auto& node : to) {
      std::lock_guard<std::mutex> w(node->write_mu);
      if (node->stream) node->stream->Write(m);
    }
  }

  // ---- Control service ----

  grpc::Status Connect(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::GatewayMessage, v1::NodeMessage>* stream)
      override {
    v1::NodeMessage first;
    if (!stream->Read(&first) || !first.has_register_())
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "first message must be register");
    const auto& reg = first.register_();
    if (reg.node_name().empty() || reg.address().empty() ||
        reg.call_address().empty())
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "node name, address and call address required");
    auto node = std::make_shared<Node>();
    node->name = reg.node_name();
    node->address = reg.address();
    node->cores = reg.capacity().cores();
    node->gpus = reg.capacity().gpus();
    node->memory = reg.capacity().memory_bytes();
    node->data_address = reg.data_address();
    node->ctx = ctx;
    node->stream = stream;
    node->last_seen = Clock::now();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    args.SetMaxSendMessageSize(256 << 20);
    node->channel = grpc::CreateCustomChannel(
        node->address, grpc::InsecureChannelCredentials(), args);
    node->stub = v1::Invoker::NewStub(node->channel);
    node->calls =
        std::make_unique<CallClient>(contexts, reg.call_address(), data_key);
    {
      std::lock_guard<std::mutex> l(mu);
      if (auto it = nodes.find(node->name); it != nodes.end()) {
        // Two live invokers must not share a name. A restarted invoker whose
        // old session has not been noticed dead yet retries until the liveness
        // check drops it.
        if (Clock::now() - it->second->last_seen < options.node_timeout) {
          return grpc::Status(
              grpc::StatusCode::ALREADY_EXISTS,
              absl::StrCat("an invoker named ", node->name, " at ",
                           it->second->address, " is already registered"));
        }
        if (it->second->ctx) it->second->ctx->TryCancel();
      }
      node->session = next_session++;
      nodes[node->name] = node;
      if (!nodes_seen_kept) {
        nodes_seen_kept = true;
        store::WriteBatch b;
        b.Put(store::Table::kMeta, kNodesSeenKey, "1");
        store->Write(b, store::Durability::kBuffered).IgnoreError();
      }
    }
    SendAssignments();
    SendClusterView();
    std::vector<std::shared_ptr<Call>> waiting;
    {
      std::lock_guard<std::mutex> l(mu);
      waiting.swap(parked);
    }
    for (auto& call : waiting) Dispatch(call);
    v1::NodeMessage m;
    while (stream->Read(&m)) {
      if (m.has_pulse()) {
        OnPulse(*node, m.pulse());
        continue;
      }
      if (!m.has_report()) continue;
      std::vector<Directory::Held> held;
      for (const auto& sh : m.report().shards())
        held.push_back({sh.id(), sh.bytes(), sh.count(), sh.epoch(), sh.lo(),
                        sh.hi(), sh.namespace_(), sh.structure()});
      directory->Report(node->name, node->data_address, held);
      std::unique_lock<std::mutex> l(mu);
      if (metrics) {
        // Cumulative on the node; a smaller count is a restarted count.
        uint64_t ops = m.report().state_ops();
        metrics->StateOps(node->name,
                          ops >= node->state_ops ? ops - node->state_ops : ops);
      }
      node->state_ops = m.report().state_ops();
      node->last_seen = Clock::now();
      node->shard_bytes = m.report().shard_bytes();
      node->shards = static_cast<uint32_t>(held.size());
      node->memory_used = m.report().used().memory_bytes();
      node->counts.clear();
      for (const auto& c : m.report().instances())
        node->counts[Key(c.namespace_(), c.name())] = c;
      node->tasks = m.report().tasks();
      node->cpu_used = m.report().cpu_used();
      std::map<std::string, v1::SnapshotInfo> snaps;
      for (const auto& sn : m.report().snapshots()) snaps[sn.id()] = sn;
      RecordSnapshotsLocked(*node, std::move(snaps));
      l.unlock();
      SendClusterView();  // its CPU use changed what the others may send it
    }
    bool gone = false;
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = nodes.find(node->name);
      if (it != nodes.end() && it->second->session == node->session) {
        nodes.erase(it);
        gone = true;
      }
    }
    if (gone) directory->NodeGone(node->name);
    {
      std::lock_guard<std::mutex> w(node->write_mu);
      node->stream = nullptr;
    }
    SendAssignments();  // its replicas move to the remaining nodes
    SendClusterView();
    return grpc::Status::OK;
  }

  // The fast half of a node's load: what the rebalancer and the executors'
  // cluster view run on.
  void OnPulse(Node& node, const v1::Pulse& p) {
    bool view_changed;
    {
      std::lock_guard<std::mutex> l(mu);
      // The executors' view changes with a quarter core (their slots are
      // whole cores): smaller moves are not worth a message to every node.
      view_changed = std::abs(p.cpu_used() - node.view_cpu) >= 0.25 ||
                     (p.cores() > 0 && p.cores() != node.cores);
      if (view_changed) node.view_cpu = p.cpu_used();
      node.last_seen = Clock::now();
      node.cpu_used = p.cpu_used();
      node.cpu_foreign = p.cpu_foreign();
      node.memory_used = p.memory_used();
      node.tasks = p.tasks();
      node.busy = p.busy();
      if (p.cores() > 0) node.cores = p.cores();
    }
    if (metrics) metrics->LoadPulse(node.name);
    if (view_changed) SendClusterView();
    if (rebalancer) rebalancer->Wake();
  }

  // ---- rebalancer hooks ----

  std::vector<NodeLoadView> LoadViews() {
    std::lock_guard<std::mutex> l(mu);
    std::vector<NodeLoadView> out;
    for (const auto& [n, node] : nodes)
      out.push_back({node->name, node->cores, node->cpu_used, node->cpu_foreign,
                     node->memory, node->memory_used, node->tasks, node->busy,
                     node->leaving, node->hot});
    return out;
  }

  // Marks a node hot or cool; when hot, the functions with instances there
  // that may move: their calls now go to the other nodes (the one with the
  // most CPU to spare is named), which restore them from the snapshot.
  std::vector<InstanceMove> SetHot(const std::string& name, bool hot) {
    std::vector<InstanceMove> moved;
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = nodes.find(name);
      if (it == nodes.end()) return moved;
      it->second->hot = hot;
      LoadFnsLocked().IgnoreError();
      if (hot) {
        for (const auto& [key, c] : it->second->counts) {
          auto f = fns.find(key);
          if (f == fns.end() || c.ready() == 0 ||
              c.generation() != f->second->spec.generation() ||
              !AvoidHotLocked(*f->second))
            continue;
          std::string to;
          double spare = -1e9;
          for (const auto& [n, node] : nodes) {
            if (node->hot || !f->second->Allows(n)) continue;
            double free = node->cores - node->cpu_used;
            if (free > spare) to = n, spare = free;
          }
          moved.push_back({key, c.ready(), to});
        }
      }
    }
    SendAssignments();
    SendClusterView();
    return moved;
  }

  // A structure's shards may move unless a function that uses it is pinned
  // or opted out.
  bool MayMove(const StructureView& v) {
    std::lock_guard<std::mutex> l(mu);
    LoadFnsLocked().IgnoreError();
    for (const auto& f : v.functions)
      if (auto it = fns.find(Key(v.ns, f));
          it != fns.end() && !it->second->Movable())
        return false;
    return true;
  }

  // The catalog in the store: key "<id>/<node>", value the SnapshotInfo.
  // Written when a node's set changes (or what it keeps staged), not when
  // only the bytes it holds resident move: those are kept in memory.
  void RecordSnapshotsLocked(Node& node,
                             std::map<std::string, v1::SnapshotInfo> now) {
    bool same = now.size() == node.snapshots.size();
    for (const auto& [id, info] : now) {
      auto it = node.snapshots.find(id);
      same = same && it != node.snapshots.end() &&
             it->second.template_resident() == info.template_resident() &&
             it->second.restorer_staged() == info.restorer_staged();
    }
    if (same) {
      node.snapshots = std::move(now);
      return;
    }
    store::WriteBatch batch;
    for (const auto& [id, info] : node.snapshots)
      if (!now.contains(id))
        batch.Delete(store::Table::kSnapshots, id + "/" + node.name);
    for (const auto& [id, info] : now)
      batch.Put(store::Table::kSnapshots, id + "/" + node.name,
                info.SerializeAsString());
    store->Write(batch).IgnoreError();  // the next report retries
    node.snapshots = std::move(now);
  }

  static void ToLayout(const StructureView& v, pv1::Layout* out) {
    out->set_namespace_(v.ns);
    out->set_name(v.name);
    out->set_kind(static_cast<pv1::Kind>(v.kind));
    out->set_max_shard_bytes(v.max_shard_bytes);
    out->set_version(v.version);
    for (const auto& f : v.functions) out->add_functions(f);
    for (const auto& s : v.shards) {
      auto* loc = out->add_shards();
      loc->set_id(s.id);
      loc->set_lo(s.lo);
      loc->set_hi(s.hi);
      loc->set_node(s.node);
      loc->set_data_address(s.data_address);
      loc->set_epoch(s.epoch);
      loc->set_state(static_cast<pv1::ShardState>(s.state));
      loc->set_bytes(s.bytes);
      loc->set_count(s.count);
    }
  }

  grpc::Status OpenStructure(grpc::ServerContext*,
                             const v1::OpenStructureRequest* req,
                             pv1::Layout* res) override {
    if (req->kind() < pv1::KIND_MAP || req->kind() > pv1::KIND_QUEUE)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "unknown structure kind");
    auto v = directory->OpenStructure(
        req->namespace_(), req->name(), static_cast<StructureKind>(req->kind()),
        req->initial_shards(), req->max_shard_bytes(), req->function());
    if (!v.ok())
      return grpc::Status(static_cast<grpc::StatusCode>(v.status().code()),
                          std::string(v.status().message()));
    ToLayout(*v, res);
    return grpc::Status::OK;
  }

  grpc::Status GetLayout(grpc::ServerContext*, const v1::GetLayoutRequest* req,
                         pv1::Layout* res) override {
    auto v = directory->Get(req->namespace_(), req->name());
    if (!v.ok())
      return grpc::Status(static_cast<grpc::StatusCode>(v.status().code()),
                          std::string(v.status().message()));
    ToLayout(*v, res);
    return grpc::Status::OK;
  }

  // A node that is stopping: from now on it takes no new proclets, and the
  // ones it holds move to the others. Runs on this handler thread for as long
  // as the migrations take (bounded by the caller's deadline).
  grpc::Status Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                     v1::DrainReply* res) override {
    const std::string& name = req->node_name();
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = nodes.find(name);
      if (it == nodes.end())
        return grpc::Status(
            grpc::StatusCode::NOT_FOUND,
            absl::StrCat("no connected node named \"", name, "\""));
      it->second->leaving = true;
    }
    SendClusterView();  // no new compute proclets there either
    DrainOptions o;
    o.deadline = ctx->deadline();
    o.cancelled = [ctx] { return ctx->IsCancelled(); };
    auto r = directory->Drain(name, o);
    if (!r.ok())
      return grpc::Status(static_cast<grpc::StatusCode>(r.status().code()),
                          std::string(r.status().message()));
    uint64_t bytes = 0;
    for (const auto& m : r->moved) bytes += m.bytes;
    res->set_moved(static_cast<uint32_t>(r->moved.size()));
    res->set_moved_bytes(bytes);
    for (uint64_t id : r->left) res->add_left(id);
    res->set_left_bytes(r->left_bytes);
    if (!r->reason.ok()) {
      res->set_reason(std::string(r->reason.message()));
      res->set_reason_code(static_cast<int32_t>(r->reason.code()));
    }
    fprintf(stderr,
            "silt-gateway: node %s is leaving: %zu proclet(s) moved off it, "
            "%zu left%s%s\n",
            name.c_str(), r->moved.size(), r->left.size(),
            r->left.empty() ? "" : " (lost when it stops): ",
            res->reason().c_str());
    return grpc::Status::OK;
  }

  // Live nodes for the directory.
  std::vector<DirectoryNode> DirectoryNodes() {
    std::lock_guard<std::mutex> l(mu);
    std::vector<DirectoryNode> out;
    for (auto& [n, node] : nodes) {
      if (node->data_address.empty()) continue;
      out.push_back({node->name, node->data_address, node->memory,
                     node->memory_used, node->channel, node->leaving});
    }
    return out;
  }

  grpc::Status FindSnapshot(grpc::ServerContext*,
                            const v1::FindSnapshotRequest* req,
                            v1::FindSnapshotResponse* res) override {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& [n, node] : nodes)
      if (node->snapshots.contains(req->id()))
        res->add_addresses(node->address);
    return grpc::Status::OK;
  }

  grpc::Status FetchBundle(
      grpc::ServerContext*, const v1::FetchBundleRequest* req,
      grpc::ServerWriter<v1::BundleChunk>* writer) override {
    auto info = bundles->Get(req->digest());
    if (!info.ok())
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          std::string(info.status().message()));
    std::ifstream in(bundles->PathOf(req->digest()), std::ios::binary);
    if (!in)
      return grpc::Status(grpc::StatusCode::DATA_LOSS,
                          "bundle file missing on the gateway");
    std::string buf(1 << 20, '\0');
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      std::streamsize n = in.gcount();
      if (n <= 0) break;
      v1::BundleChunk chunk;
      chunk.set_data(buf.data(), static_cast<size_t>(n));
      if (!writer->Write(chunk)) break;
    }
    return grpc::Status::OK;
  }

  void LivenessLoop() {
    while (true) {
      {
        std::unique_lock<std::mutex> l(stop_mu);
        if (stop_cv.wait_for(l, std::chrono::milliseconds(100),
                             [&] { return stopping; }))
          return;
      }
      {
        std::lock_guard<std::mutex> l(mu);
        auto now = Clock::now();
        for (auto& [n, node] : nodes) {
          if (now - node->last_seen > options.node_timeout && node->ctx)
            node->ctx->TryCancel();
        }
      }
      FailParked(false);
    }
  }

  // How long after the start calls wait for invokers to reconnect: their
  // longest reconnect backoff (2 s) past the node timeout.
  Clock::duration StartGrace() const {
    return options.node_timeout + std::chrono::seconds(2);
  }

  // Fails the parked calls once the start grace is over (or all, stopping).
  void FailParked(bool all) {
    std::vector<std::shared_ptr<Call>> failed;
    {
      std::lock_guard<std::mutex> l(mu);
      if (parked.empty() || (!all && Clock::now() < started + StartGrace()))
        return;
      failed.swap(parked);
    }
    for (auto& call : failed) {
      call->done(absl::UnavailableError(
          absl::StrCat("No endpoints available for: ", call->call.name, ".")));
    }
  }

  // ---- invoke ----

  struct Call {
    InvokeCall call;  // its method, path, query, headers and body: in `frame`
    std::function<void(absl::StatusOr<InvokeResult>)> done;
    std::shared_ptr<const Fn> fn;
    std::shared_ptr<Node> node;
    // The request as sent (kept to send again elsewhere).
    std::shared_ptr<const std::string> frame;
    bool with_spec = false;
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
                                   const std::vector<std::string>& exclude) {
    uint64_t generation = fn.spec.generation();
    uint64_t limit = fn.spec.memory_limit_bytes();
    struct Score {
      bool cool = true;  // not a hot node the function should stay off
      long idle = 0;
      bool fits = false;
      int spare = 0;  // quarter cores
      int inflight = 0;
      bool Better(const Score& o) const {
        if (cool != o.cool) return cool;
        if ((idle > 0 || o.idle > 0) && idle != o.idle) return idle > o.idle;
        if (idle <= 0 && fits != o.fits) return fits;
        if (idle <= 0 && spare != o.spare) return spare > o.spare;
        return inflight < o.inflight;
      }
    };
    std::shared_ptr<Node> best;
    Score best_score;
    size_t i = 0, n = nodes.size();
    std::vector<std::shared_ptr<Node>> order;
    for (auto& [name, node] : nodes) order.push_back(node);
    ++rr;
    bool avoid_hot = AvoidHotLocked(fn);
    for (i = 0; i < n; ++i) {
      auto& node = order[(i + rr) % n];
      if (std::find(exclude.begin(), exclude.end(), node->name) !=
          exclude.end())
        continue;
      if (!fn.Allows(node->name)) continue;
      long ready = 0;
      if (auto it = node->counts.find(key);
          it != node->counts.end() && it->second.generation() == generation)
        ready = it->second.ready();
      Score sc;
      sc.cool = !(avoid_hot && node->hot);
      sc.inflight = node->inflight[key];
      sc.idle = ready - sc.inflight;
      sc.fits = node->memory == 0 || node->memory_used + limit <= node->memory;
      sc.spare = static_cast<int>((node->cores - node->cpu_used) * 4);
      if (!best || sc.Better(best_score)) {
        best = node;
        best_score = sc;
      }
    }
    return best;
  }

  void Invoke(InvokeCall c,
              std::function<void(absl::StatusOr<InvokeResult>)> done) {
    auto call = std::make_shared<Call>();
    call->call = std::move(c);
    call->done = std::move(done);
    {
      std::lock_guard<std::mutex> l(mu);
      if (auto s = LoadFnsLocked(); !s.ok()) return call->done(s);
      auto it = fns.find(Key(call->call.ns, call->call.name));
      if (it == fns.end())
        return call->done(absl::NotFoundError(
            absl::StrCat("function ", call->call.name, " not found")));
      call->fn = it->second;
      ++calls[it->first];
    }
    cw::Request r;
    r.name = call->call.name;
    r.ns = call->call.ns;
    r.generation = call->fn->spec.generation();
    r.call_id = call->call.call_id;
    r.method = std::move(call->call.method);
    r.path = std::move(call->call.path);
    r.query = std::move(call->call.query);
    r.headers = std::move(call->call.headers);
    r.body = std::move(call->call.body);
    r.timeout_ms = static_cast<uint32_t>(call->call.timeout.count());
    r.cold_start = call->call.cold_start;
    auto frame = std::make_shared<std::string>();
    cw::AppendRequest(frame.get(), r);
    call->frame = std::move(frame);
    Dispatch(call);
  }

  void Dispatch(std::shared_ptr<Call> call) {
    std::string key = Key(call->call.ns, call->call.name);
    {
      std::lock_guard<std::mutex> l(mu);
      call->node = PickLocked(key, *call->fn, call->tried);
      if (call->node) ++call->node->inflight[key];
      if (!call->node && call->tried.empty() && expect_nodes &&
          Clock::now() < started + StartGrace()) {
        parked.push_back(call);  // an invoker may be about to reconnect
        return;
      }
    }
    if (!call->node) {
      return call->done(absl::UnavailableError(
          absl::StrCat("No endpoints available for: ", call->call.name, ".")));
    }
    call->tried.push_back(call->node->name);
    Send(call);
  }

  void Send(std::shared_ptr<Call> call) {
    auto deadline = Clock::now() + call->call.timeout + std::chrono::seconds(2);
    call->node->calls->Call(call->frame, deadline,
                            [this, call](absl::StatusOr<cw::Reply> r,
                                         std::shared_ptr<BodyStream> rest) {
                              OnDone(call, r, std::move(rest));
                            });
  }

  // The node does not know this function version: the call goes again with
  // its spec.
  void SendWithSpec(std::shared_ptr<Call> call) {
    // The frame is rebuilt around the body it already holds.
    cw::Request full;
    if (!cw::ParseRequest(std::string_view(*call->frame).substr(4), &full))
      return call->done(absl::InternalError("cannot re-read a call frame"));
    full.spec = call->fn->spec.SerializeAsString();
    auto frame = std::make_shared<std::string>();
    cw::AppendRequest(frame.get(), full);
    call->frame = std::move(frame);
    call->with_spec = true;
    Send(call);
  }

  void OnDone(std::shared_ptr<Call> call, absl::StatusOr<cw::Reply>& r,
              std::shared_ptr<BodyStream> rest) {
    std::string key = Key(call->call.ns, call->call.name);
    bool shutting_down;
    {
      std::lock_guard<std::mutex> l(stop_mu);
      shutting_down = stopping;
    }
    if (r.ok() && r->outcome == cw::Outcome::kNeedSpec && !call->with_spec &&
        !shutting_down)
      return SendWithSpec(std::move(call));
    {
      std::lock_guard<std::mutex> l(mu);
      --call->node->inflight[key];
      if (r.ok() && r->outcome == cw::Outcome::kAnswered) {
        v1::InstanceCount& c = call->node->counts[key];
        c.set_name(call->call.name);
        c.set_namespace_(call->call.ns);
        c.set_generation(call->fn->spec.generation());
        c.set_ready(r->ready);
        c.set_busy(r->busy);
      }
    }
    absl::Status s = r.status();
    if (s.ok() && r->outcome == cw::Outcome::kError)
      s = absl::Status(static_cast<absl::StatusCode>(r->error_code), r->error);
    if (s.ok() && r->outcome == cw::Outcome::kNeedSpec)
      s = absl::InternalError(absl::StrCat("node ", call->node->name,
                                           " did not take function ",
                                           call->call.name, "'s spec"));
    if (absl::IsUnavailable(s) && call->tried.size() < 3 && !shutting_down) {
      // The node went away (or is not ready): try another one.
      fprintf(stderr,
              "silt-gateway: call to %s on node %s: %s; trying another\n",
              call->call.name.c_str(), call->node->name.c_str(),
              std::string(s.message()).c_str());
      call->node.reset();
      return Dispatch(std::move(call));
    }
    if (!s.ok()) return call->done(s);
    InvokeResult out;
    out.status = r->status;
    out.headers = std::move(r->headers);
    out.body = std::move(r->body);
    out.start_tier = r->tier;
    out.start_ms = r->start_us / 1000.0;
    out.instance = std::move(r->instance);
    out.failure = r->failure;
    out.node = call->node->name;
    if (rest && !call->call.take_parts)
      return ReadWhole(std::move(rest),
                       std::make_shared<InvokeResult>(std::move(out)),
                       std::move(call->done));
    out.parts = std::move(rest);
    call->done(std::move(out));
  }

  // Reads the rest of a streamed body into out->body, for a caller that
  // takes it whole (an async call's callback).
  static void ReadWhole(
      std::shared_ptr<BodyStream> rest, std::shared_ptr<InvokeResult> out,
      std::function<void(absl::StatusOr<InvokeResult>)> done) {
    rest->Pull([rest, out, done = std::move(done)](
                   absl::StatusOr<BodyStream::Part> part) mutable {
      if (!part.ok()) return done(part.status());
      out->body += part->bytes;
      if (out->body.size() > kMaxWholeBody) {
        rest->Cancel();
        return done(absl::ResourceExhaustedError(absl::StrCat(
            "the function's response is over ", kMaxWholeBody >> 20,
            " MiB: too large to hold for an async callback")));
      }
      if (part->last) return done(std::move(*out));
      ReadWhole(std::move(rest), std::move(out), std::move(done));
    });
  }

  // ---- logs ----

  void Logs(const std::string& ns, const std::string& name, int64_t since,
            int64_t tail, bool follow,
            const std::function<bool(const LogRecord&)>& emit,
            const std::function<bool()>& stop) {
    std::vector<std::shared_ptr<Node>> targets;
    {
      std::lock_guard<std::mutex> l(mu);
      for (auto& [n, node] : nodes) targets.push_back(node);
    }
    v1::LogsRequest req;
    req.set_name(name);
    req.set_namespace_(ns);
    req.set_since_unix_nanos(since);
    req.set_tail(tail);
    if (!follow) {
      std::vector<LogRecord> all;
      for (auto& node : targets) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
        auto reader = node->stub->Logs(&ctx, req);
        v1::LogEntry e;
        while (reader->Read(&e))
          all.push_back({e.name(), e.namespace_(), e.instance(), e.text(),
                         e.timestamp_unix_nanos()});
        reader->Finish().IgnoreError();
      }
      for (auto& g : gateway_log.Read(ns, name, 0, since))
        all.push_back(
            {g.name, g.ns, "gateway", g.text, g.timestamp_unix_nanos});
      std::stable_sort(all.begin(), all.end(),
                       [](const LogRecord& a, const LogRecord& b) {
                         return a.timestamp_unix_nanos < b.timestamp_unix_nanos;
                       });
      size_t from = tail > 0 && all.size() > static_cast<size_t>(tail)
                        ? all.size() - tail
                        : 0;
      for (size_t i = from; i < all.size(); ++i)
        if (!emit(all[i])) return;
      return;
    }
    req.set_follow(true);
    std::mutex emit_mu;
    std::atomic<bool> closed{false};
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
    std::vector<std::thread> readers;
    for (auto& node : targets) {
      ctxs.push_back(std::make_unique<grpc::ClientContext>());
      grpc::ClientContext* ctx = ctxs.back().get();
      readers.emplace_back([&, node, ctx] {
        auto reader = node->stub->Logs(ctx, req);
        v1::LogEntry e;
        while (reader->Read(&e)) {
          std::lock_guard<std::mutex> l(emit_mu);
          if (closed) break;
          if (!emit({e.name(), e.namespace_(), e.instance(), e.text(),
                     e.timestamp_unix_nanos()}))
            closed = true;
        }
        reader->Finish().IgnoreError();
      });
    }
    // The gateway's own lines: those already there, then new ones as they
    // come (checked as often as the stop condition).
    uint64_t seen = 0;
    auto emit_gateway_lines = [&] {
      for (auto& g : gateway_log.Read(ns, name, seen, since)) {
        seen = g.seq;
        std::lock_guard<std::mutex> l(emit_mu);
        if (closed) return;
        if (!emit({g.name, g.ns, "gateway", g.text, g.timestamp_unix_nanos}))
          closed = true;
      }
    };
    while (!closed && !stop()) {
      emit_gateway_lines();
      std::unique_lock<std::mutex> l(stop_mu);
      if (stop_cv.wait_for(l, std::chrono::milliseconds(200),
                           [&] { return stopping; }))
        break;
    }
    closed = true;
    for (auto& c : ctxs) c->TryCancel();
    for (auto& t : readers) t.join();
  }
};

NodeRegistry::NodeRegistry(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
NodeRegistry::~NodeRegistry() = default;

absl::StatusOr<std::unique_ptr<NodeRegistry>> NodeRegistry::Start(
    const NodeRegistryOptions& options,
    const std::vector<boost::asio::io_context*>& contexts, store::Store* store,
    BundleStore* bundles, Metrics* metrics) {
  if (contexts.empty())
    return absl::InvalidArgumentError("the node registry needs an io_context");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->contexts = contexts;
  impl->metrics = metrics;
  impl->store = store;
  impl->bundles = bundles;
  auto key = store->Get(store::Table::kMeta, kDataKeyKey);
  if (key.ok() && key->size() == kDataKeyBytes) {
    impl->data_key = *std::move(key);
  } else {
    std::random_device rd;
    for (size_t i = 0; i < kDataKeyBytes; ++i)
      impl->data_key.push_back(static_cast<char>(rd()));
    store::WriteBatch b;
    b.Put(store::Table::kMeta, kDataKeyKey, impl->data_key);
    if (auto s = store->Write(b); !s.ok()) return s;
  }
  impl->expect_nodes = impl->nodes_seen_kept =
      store->Get(store::Table::kMeta, kNodesSeenKey).ok();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(),
                           &port);
  // gRPC binds with SO_REUSEPORT by default: a second gateway on the same
  // port would silently share the invokers' connections. Fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  builder.RegisterService(impl.get());
  impl->server = builder.BuildAndStart();
  if (!impl->server || port == 0)
    return absl::UnavailableError(
        absl::StrCat("cannot listen for invokers on ", options.listen));
  std::string host = options.listen.substr(0, options.listen.rfind(':'));
  if (host.empty()) host = "0.0.0.0";
  impl->address = absl::StrCat(host, ":", port);
  Impl* p = impl.get();
  auto dir = Directory::Open(
      store, options.directory, [p] { return p->DirectoryNodes(); }, metrics);
  if (!dir.ok()) return dir.status();
  impl->directory = *std::move(dir);
  Rebalancer::Hooks hooks;
  hooks.nodes = [p] { return p->LoadViews(); };
  hooks.set_hot = [p](const std::string& n, bool hot) {
    return p->SetHot(n, hot);
  };
  hooks.may_move = [p](const StructureView& v) { return p->MayMove(v); };
  impl->rebalancer = Rebalancer::Start(options.rebalancer, std::move(hooks),
                                       impl->directory.get(), metrics);
  impl->liveness = std::thread([p] { p->LivenessLoop(); });
  return std::unique_ptr<NodeRegistry>(new NodeRegistry(std::move(impl)));
}

std::string NodeRegistry::address() const { return impl_->address; }

Directory* NodeRegistry::directory() { return impl_->directory.get(); }

void NodeRegistry::FunctionsChanged() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->fns_valid = false;
  }
  impl_->SendAssignments();
}

void NodeRegistry::Invoke(
    InvokeCall call, std::function<void(absl::StatusOr<InvokeResult>)> done) {
  impl_->Invoke(std::move(call), std::move(done));
}

uint64_t NodeRegistry::AvailableReplicas(const std::string& ns,
                                         const std::string& name) {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->LoadFnsLocked().IgnoreError();
  auto it = impl_->fns.find(Key(ns, name));
  if (it == impl_->fns.end()) return 0;
  uint64_t gen = it->second->spec.generation();
  uint64_t total = 0;
  for (auto& [n, node] : impl_->nodes) {
    auto c = node->counts.find(Key(ns, name));
    if (c != node->counts.end() && c->second.generation() == gen)
      total += c->second.ready();
  }
  return total;
}

std::vector<NodeInfo> NodeRegistry::Nodes() {
  std::lock_guard<std::mutex> l(impl_->mu);
  std::vector<NodeInfo> out;
  for (auto& [n, node] : impl_->nodes) {
    uint32_t instances = 0;
    for (auto& [k, c] : node->counts) instances += c.ready();
    out.push_back({node->name, node->address, node->cores, node->gpus,
                   node->memory, node->memory_used, instances,
                   node->data_address, node->shards, node->shard_bytes,
                   node->cpu_used, node->tasks, node->cpu_foreign, node->hot});
  }
  return out;
}

std::vector<SnapshotView> NodeRegistry::Snapshots(const std::string& ns,
                                                  const std::string& name) {
  auto rows = impl_->store->Scan(store::Table::kSnapshots, "");
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->LoadFnsLocked().IgnoreError();
  std::map<std::string, SnapshotView> by_id;
  if (!rows.ok()) return {};
  for (const auto& [key, value] : *rows) {
    v1::SnapshotInfo info;
    if (!info.ParseFromString(value)) continue;
    if (!ns.empty() && info.namespace_() != ns) continue;
    if (!name.empty() && info.name() != name) continue;
    std::string node = key.substr(key.find('/') + 1);
    auto& v = by_id[info.id()];
    v.id = info.id();
    v.name = info.name();
    v.ns = info.namespace_();
    v.generation = info.generation();
    v.bytes = info.bytes();
    v.created_unix = info.created_unix();
    v.checkpoint_ms = info.checkpoint_ms();
    auto n = impl_->nodes.find(node);
    if (n != impl_->nodes.end())
      if (auto s = n->second->snapshots.find(info.id());
          s != n->second->snapshots.end()) {
        const v1::SnapshotInfo& live = s->second;  // the node's last report
        v.nodes.push_back(node);
        v.template_resident |= live.template_resident();
        v.restorer_staged |= live.restorer_staged();
        v.resident_bytes += live.resident_bytes();
        if (live.resident_bytes() > 0)
          v.resident_by_node[node] = live.resident_bytes();
      }
    auto fn = impl_->fns.find(Key(v.ns, v.name));
    v.current =
        fn != impl_->fns.end() && fn->second->spec.generation() == v.generation;
  }
  std::vector<SnapshotView> out;
  for (auto& [id, v] : by_id) out.push_back(std::move(v));
  return out;
}

size_t NodeRegistry::DeleteSnapshots(const std::string& ns,
                                     const std::string& name) {
  auto views = Snapshots(ns, name);
  if (views.empty()) return 0;
  v1::GatewayMessage m;
  store::WriteBatch batch;
  auto rows = impl_->store->Scan(store::Table::kSnapshots, "");
  for (const auto& v : views) {
    m.mutable_delete_snapshots()->add_ids(v.id);
    if (rows.ok())
      for (const auto& [key, value] : *rows)
        if (absl::StartsWith(key, v.id + "/"))
          batch.Delete(store::Table::kSnapshots, key);
  }
  std::vector<std::shared_ptr<Impl::Node>> targets;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (auto& [n, node] : impl_->nodes) {
      for (const auto& v : views) node->snapshots.erase(v.id);
      targets.push_back(node);
    }
  }
  impl_->store->Write(batch).IgnoreError();
  for (auto& node : targets) {
    std::lock_guard<std::mutex> w(node->write_mu);
    if (node->stream) node->stream->Write(m);
  }
  return views.size();
}

std::vector<RebalanceEvent> NodeRegistry::Events(
    uint64_t after, std::chrono::milliseconds wait) {
  return impl_->rebalancer->Events(after, wait);
}

std::vector<FunctionLoad> NodeRegistry::FunctionLoads() {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->LoadFnsLocked().IgnoreError();  // the last good table serves
  std::vector<FunctionLoad> out;
  std::map<std::string, size_t> index;
  for (const auto& [key, fn] : impl_->fns) {
    FunctionLoad f;
    f.ns = fn->spec.namespace_();
    f.name = fn->spec.name();
    f.labels.insert(fn->spec.labels().begin(), fn->spec.labels().end());
    f.replicas = fn->replicas;
    if (auto c = impl_->calls.find(key); c != impl_->calls.end())
      f.calls = c->second;
    index[key] = out.size();
    out.push_back(std::move(f));
  }
  for (auto& [n, node] : impl_->nodes) {
    // Its instances' CPU, shared by busy instances (ready ones when none is).
    double cpu = std::max(0.0, node->cpu_used - node->cpu_foreign);
    uint64_t busy = 0, ready = 0;
    for (const auto& [key, c] : node->counts)
      busy += c.busy(), ready += c.ready();
    for (const auto& [key, c] : node->counts) {
      auto i = index.find(key);
      if (i == index.end()) continue;
      FunctionLoad& f = out[i->second];
      if (c.generation() == impl_->fns[key]->spec.generation())
        f.ready += c.ready();
      if (busy > 0) {
        f.cpu_cores += cpu * c.busy() / busy;
      } else if (ready > 0) {
        f.cpu_cores += cpu * c.ready() / ready;
      }
    }
    for (const auto& [key, in] : node->inflight) {
      auto i = index.find(key);
      if (i != index.end() && in > 0) out[i->second].inflight += in;
    }
  }
  return out;
}

void NodeRegistry::SetDesiredReplicas(const std::string& ns,
                                      const std::string& name,
                                      std::optional<uint64_t> replicas) {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    std::string key = Key(ns, name);
    impl_->LoadFnsLocked().IgnoreError();  // the last good table serves
    auto fn = impl_->fns.find(key);
    uint64_t user = fn == impl_->fns.end() ? 0 : fn->second->replicas;
    auto it = impl_->desired.find(key);
    uint64_t before = it == impl_->desired.end() ? user : it->second;
    if (replicas) {
      impl_->desired[key] = *replicas;
    } else if (it != impl_->desired.end()) {
      impl_->desired.erase(it);
    }
    // The nodes hear only of a count that changed.
    if (replicas.value_or(user) == before) return;
  }
  impl_->SendAssignments();
}

uint64_t NodeRegistry::DesiredReplicas(const std::string& ns,
                                       const std::string& name, uint64_t user) {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->desired.find(Key(ns, name));
  return it == impl_->desired.end() ? user : it->second;
}

void NodeRegistry::GatewayLog(const std::string& ns, const std::string& name,
                              const std::string& text) {
  impl_->gateway_log.Append(ns, name, text);
}

void NodeRegistry::Logs(const std::string& ns, const std::string& name,
                        int64_t since, int64_t tail, bool follow,
                        const std::function<bool(const LogRecord&)>& emit,
                        const std::function<bool()>& stop) {
  impl_->Logs(ns, name, since, tail, follow, emit, stop);
}

}  // namespace silt::gateway
