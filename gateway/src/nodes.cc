#include "nodes.h"

#include "nodes_impl.h"

namespace silt::gateway {

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

NodeRegistry::Impl::~Impl() {
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
  for (auto& [n, node] : nodes) {
    node->calls->Close();
    if (node->leases) node->leases->Close();
  }
}

NodeRegistry::NodeRegistry(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
NodeRegistry::~NodeRegistry() = default;

absl::StatusOr<std::unique_ptr<NodeRegistry>> NodeRegistry::Start(
    const NodeRegistryOptions& options,
    const std::vector<boost::asio::io_context*>& contexts, store::Store* store,
    BundleStore* bundles, ImageArchives* images, Metrics* metrics) {
  if (contexts.empty())
    return absl::InvalidArgumentError("the node registry needs an io_context");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->contexts = contexts;
  impl->metrics = metrics;
  impl->store = store;
  impl->bundles = bundles;
  impl->images = images;
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
  impl->gpu_directory =
      std::make_unique<GpuDirectory>([p] { return p->GpuNodes(); }, store);
  Rebalancer::Hooks hooks;
  hooks.nodes = [p] { return p->LoadViews(); };
  hooks.set_hot = [p](const std::string& n, bool hot) {
    return p->SetHot(n, hot);
  };
  hooks.may_move = [p](const StructureView& v) { return p->MayMove(v); };
  hooks.gpu = [p] { return p->gpu_directory->Rebalance(); };
  impl->rebalancer = Rebalancer::Start(options.rebalancer, std::move(hooks),
                                       impl->directory.get(), metrics);
  impl->liveness = std::thread([p] { p->LivenessLoop(); });
  return std::unique_ptr<NodeRegistry>(new NodeRegistry(std::move(impl)));
}

std::string NodeRegistry::address() const { return impl_->address; }

Directory* NodeRegistry::directory() { return impl_->directory.get(); }
GpuDirectory* NodeRegistry::gpu_directory() {
  return impl_->gpu_directory.get();
}

std::set<std::string> NodeRegistry::ImagesChanged() {
  return impl_->SendImageSet();
}

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
    control::SnapshotInfo info;
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
        const control::SnapshotInfo& live =
            s->second;  // the node's last report
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
  control::GatewayMessage m;
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
