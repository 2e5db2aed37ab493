// The Control service the invokers connect to (registration, load reports,
// pulses, assignments, bundles, snapshots, layouts, drains), and the function
// specs it assigns them.
#include "containerd/archive.h"
#include "nodes_impl.h"
#include "silt/state_wire.h"

namespace silt::gateway {

auto NodeRegistry::Impl::BuildFn(const store::FunctionRecord& rec)
    -> absl::StatusOr<std::shared_ptr<const Fn>> {
  auto d = ParseFunctionDeployment(rec.spec);
  if (!d.ok()) return d.status();
  auto fn = std::make_shared<Fn>();
  fn->replicas = rec.replicas;
  control::FunctionSpec& s = fn->spec;
  s.set_name(rec.name);
  s.set_namespace_(rec.ns);
  s.set_generation(rec.generation);
  s.set_image(d->image);
  auto digest = proclets::BundleDigestOf(d->image);
  if (digest.ok()) {
    s.set_bundle_digest(*digest);
  } else if (auto image = containerd::NormalizeImageName(d->image);
             image.ok() && images != nullptr) {
    // Its instances run only where the image is.
    s.set_container_image(*image);
    s.set_read_only_root(d->read_only_root_filesystem);
    fn->needs_image = true;
    for (const auto& [node, held] : images->Holders(*image))
      fn->image_nodes.insert(node);
  }
  s.set_env_process(d->env_process);
  for (const auto& [k, v] : d->env_vars) (*s.mutable_env())[k] = v;
  if (d->labels) {
    for (const auto& [k, v] : *d->labels) (*s.mutable_labels())[k] = v;
    if (auto it = d->labels->find("com.silt.pin");
        it != d->labels->end() && !it->second.empty()) {
      fn->pinned = true;
      fn->only_nodes.push_back(it->second);
    }
    if (auto gpu = ParseGpuLabels(*d->labels); gpu.ok()) {
      s.set_gpu_memory_limit_bytes(gpu->max);
      s.set_gpu_min_memory_bytes(gpu->min);
      s.set_gpu_preferred_memory_bytes(gpu->preferred);
      s.set_gpu_compute_capability(gpu->compute);
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

absl::Status NodeRegistry::Impl::LoadFnsLocked() {
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

control::Assignment NodeRegistry::Impl::AssignmentLocked(
    const std::string& node_name) {
  control::Assignment a;
  a.set_data_key(data_key);
  for (const auto& [key, fn] : fns) {
    if (fn->spec.bundle_digest().empty() && fn->spec.container_image().empty())
      continue;
    if (!fn->Allows(node_name)) continue;
    std::vector<std::string> names;
    for (const auto& [n, node] : nodes)
      if (fn->Allows(n) && !(node->hot && AvoidHotLocked(*fn)))
        names.push_back(n);
    size_t index =
        std::find(names.begin(), names.end(), node_name) - names.begin();
    size_t count = names.size();
    control::FunctionSpec* s = a.add_functions();
    *s = fn->spec;
    auto d = desired.find(key);
    uint64_t replicas = d == desired.end() ? fn->replicas : d->second;
    uint64_t share =
        count == 0 ? 0 : replicas / count + (index < replicas % count ? 1 : 0);
    s->set_min_instances(static_cast<uint32_t>(share));
  }
  return a;
}

void NodeRegistry::Impl::SendAssignments() {
  std::vector<std::pair<std::shared_ptr<Node>, control::GatewayMessage>> out;
  {
    std::lock_guard<std::mutex> l(mu);
    LoadFnsLocked()
        .IgnoreError();  // a store error leaves the last assignment in place
    for (const auto& [n, node] : nodes) {
      control::GatewayMessage m;
      *m.mutable_assignment() = AssignmentLocked(n);
      out.emplace_back(node, std::move(m));
    }
  }
  for (auto& [node, m] : out) {
    std::lock_guard<std::mutex> w(node->write_mu);
    if (node->stream) node->stream->Write(m);
  }
}

void NodeRegistry::Impl::SendClusterView() {
  control::GatewayMessage m;
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

grpc::Status NodeRegistry::Impl::Connect(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<control::GatewayMessage, control::NodeMessage>*
        stream) {
  control::NodeMessage first;
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
  node->gpu_memory = reg.capacity().gpu_memory_bytes();
  node->gpu_model = reg.capacity().gpu_model();
  node->gpu_compute = reg.capacity().gpu_compute_capability();
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
  if (options.instance_leases && !reg.call_socket().empty()) {
    // Reachable only from the invoker's network namespace: a node elsewhere
    // (or in a namespace of its own) is called through its call port.
    auto leases =
        InstanceLeases::Connect(contexts, reg.call_socket(), data_key);
    if (leases.ok()) node->leases = *std::move(leases);
  }
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
  if (images) {
    control::GatewayMessage m = ImageSetMessage();
    std::lock_guard<std::mutex> w(node->write_mu);
    stream->Write(m);
  }
  std::vector<std::shared_ptr<Call>> waiting;
  {
    std::lock_guard<std::mutex> l(mu);
    waiting.swap(parked);
  }
  for (auto& call : waiting) Dispatch(call);
  control::NodeMessage m;
  while (stream->Read(&m)) {
    if (m.has_pulse()) {
      OnPulse(*node, m.pulse());
      continue;
    }
    if (m.has_images()) {
      if (!images) continue;
      std::map<std::string, ImageArchives::NodeImage> held;
      for (const auto& i : m.images().images())
        held[i.name()] = {i.digest(), i.size(), i.archive()};
      std::map<std::string, ImageArchives::Failure> failed;
      for (const auto& f : m.images().failures())
        failed[f.archive()] = {f.kind() == control::IMAGE_FAILURE_BAD_ARCHIVE,
                               f.message()};
      if (images->Report(node->name, std::move(held), std::move(failed)))
        SendImageSet();  // an archive found bad was dropped
      {
        // Image functions may run where images now are.
        std::lock_guard<std::mutex> l(mu);
        fns_valid = false;
      }
      SendAssignments();
      continue;
    }
    if (!m.has_report()) continue;
    std::vector<Directory::Held> held;
    for (const auto& sh : m.report().shards())
      held.push_back({sh.id(), sh.bytes(), sh.count(), sh.epoch(), sh.lo(),
                      sh.hi(), sh.namespace_(), sh.structure()});
    directory->Report(node->name, node->data_address, held);
    {
      std::vector<GpuProcletView> gpu;
      for (const auto& g : m.report().gpu_proclets()) {
        GpuProcletView v;
        v.ns = g.namespace_();
        v.function = g.function();
        v.name = g.name();
        v.backend = g.backend();
        v.device = g.device();
        v.memory_used = g.memory_used();
        v.memory_limit = g.memory_limit();
        v.launches = g.launches();
        v.busy_ns = g.busy_ns();
        gpu.push_back(std::move(v));
      }
      gpu_directory->Report(node->name, std::move(gpu));
    }
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
    std::map<std::string, control::SnapshotInfo> snaps;
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
  if (gone) {
    directory->NodeGone(node->name);
    gpu_directory->NodeGone(node->name);
  }
  if (gone && images) images->NodeGone(node->name);
  {
    std::lock_guard<std::mutex> w(node->write_mu);
    node->stream = nullptr;
  }
  SendAssignments();  // its replicas move to the remaining nodes
  SendClusterView();
  return grpc::Status::OK;
}

void NodeRegistry::Impl::OnPulse(Node& node, const control::Pulse& p) {
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

void NodeRegistry::Impl::RecordSnapshotsLocked(
    Node& node, std::map<std::string, control::SnapshotInfo> now) {
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

void NodeRegistry::Impl::ToLayout(const StructureView& v, pv1::Layout* out) {
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

grpc::Status NodeRegistry::Impl::OpenStructure(
    grpc::ServerContext*, const control::OpenStructureRequest* req,
    pv1::Layout* res) {
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

grpc::Status NodeRegistry::Impl::GetLayout(grpc::ServerContext*,
                                           const control::GetLayoutRequest* req,
                                           pv1::Layout* res) {
  auto v = directory->Get(req->namespace_(), req->name());
  if (!v.ok())
    return grpc::Status(static_cast<grpc::StatusCode>(v.status().code()),
                        std::string(v.status().message()));
  ToLayout(*v, res);
  return grpc::Status::OK;
}

grpc::Status NodeRegistry::Impl::Drain(grpc::ServerContext* ctx,
                                       const control::DrainRequest* req,
                                       control::DrainReply* res) {
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
  fprintf(
      stderr,
      "silt-gateway: node %s is leaving: %zu proclet(s) moved off it, "
      "%zu left%s%s\n",
      name.c_str(), r->moved.size(), r->left.size(),
      r->left.empty() ? "" : " (lost when it stops): ", res->reason().c_str());
  return grpc::Status::OK;
}

std::vector<DirectoryNode> NodeRegistry::Impl::DirectoryNodes() {
  std::lock_guard<std::mutex> l(mu);
  std::vector<DirectoryNode> out;
  for (auto& [n, node] : nodes) {
    if (node->data_address.empty()) continue;
    out.push_back({node->name, node->data_address, node->memory,
                   node->memory_used, node->channel, node->leaving});
  }
  return out;
}

std::vector<GpuNode> NodeRegistry::Impl::GpuNodes() {
  std::lock_guard<std::mutex> l(mu);
  std::vector<GpuNode> out;
  for (auto& [n, node] : nodes) {
    if (node->data_address.empty()) continue;
    out.push_back({node->name, node->data_address, node->gpus, node->gpu_memory,
                   node->gpu_model, node->channel, node->leaving,
                   node->gpu_compute});
  }
  return out;
}

grpc::Status NodeRegistry::Impl::OpenGpuProclet(
    grpc::ServerContext*, const control::OpenGpuProcletRequest* req,
    control::GpuProcletLocation* res) {
  if (req->namespace_().empty() || req->function().empty() ||
      !wire::ValidStructureName(req->name()))
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a GPU proclet needs a namespace, a function and a "
                        "name of 1-63 characters of [a-z0-9._-]");
  GpuNeeds needs;
  needs.min = req->min_memory();
  needs.preferred = req->preferred_memory();
  needs.compute = req->compute_capability();
  needs.max = req->memory_limit();
  auto v = gpu_directory->Open(req->namespace_(), req->function(), req->name(),
                               needs, req->node());
  if (!v.ok())
    return grpc::Status(static_cast<grpc::StatusCode>(v.status().code()),
                        std::string(v.status().message()));
  res->set_id(v->id);
  res->set_node(v->node);
  res->set_memory_limit(v->memory_limit);
  res->set_backend(v->backend);
  std::lock_guard<std::mutex> l(mu);
  auto it = nodes.find(v->node);
  if (it == nodes.end())
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the GPU proclet's node just left");
  res->set_data_address(it->second->data_address);
  return grpc::Status::OK;
}

grpc::Status NodeRegistry::Impl::FindSnapshot(
    grpc::ServerContext*, const control::FindSnapshotRequest* req,
    control::FindSnapshotResponse* res) {
  std::lock_guard<std::mutex> l(mu);
  for (const auto& [n, node] : nodes)
    if (node->snapshots.contains(req->id())) res->add_addresses(node->address);
  return grpc::Status::OK;
}

grpc::Status NodeRegistry::Impl::FetchBundle(
    grpc::ServerContext*, const control::FetchBundleRequest* req,
    grpc::ServerWriter<control::BundleChunk>* writer) {
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
    control::BundleChunk chunk;
    chunk.set_data(buf.data(), static_cast<size_t>(n));
    if (!writer->Write(chunk)) break;
  }
  return grpc::Status::OK;
}

std::set<std::string> NodeRegistry::Impl::SendImageSet() {
  control::GatewayMessage m = ImageSetMessage();
  std::vector<std::shared_ptr<Node>> to;
  std::set<std::string> names;
  {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& [name, node] : nodes) {
      to.push_back(node);
      names.insert(name);
    }
  }
  for (auto& node : to) {
    std::lock_guard<std::mutex> w(node->write_mu);
    if (node->stream) node->stream->Write(m);
  }
  return names;
}

control::GatewayMessage NodeRegistry::Impl::ImageSetMessage() const {
  control::GatewayMessage m;
  auto* set = m.mutable_images();
  if (images == nullptr) return m;
  for (const auto& r : images->List()) {
    auto* w = set->add_images();
    w->set_name(r.name);
    w->set_archive(r.archive);
    w->set_archive_size(r.archive_size);
  }
  return m;
}

grpc::Status NodeRegistry::Impl::FetchArchive(
    grpc::ServerContext*, const control::FetchArchiveRequest* req,
    grpc::ServerWriter<control::BundleChunk>* writer) {
  std::string path = images ? images->PathOf(req->digest()) : "";
  std::ifstream in(path, std::ios::binary);
  if (path.empty() || !in)
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "no image archive " + req->digest());
  std::string buf(1 << 20, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    std::streamsize n = in.gcount();
    if (n <= 0) break;
    control::BundleChunk chunk;
    chunk.set_data(buf.data(), static_cast<size_t>(n));
    if (!writer->Write(chunk)) break;
  }
  return grpc::Status::OK;
}

void NodeRegistry::Impl::LivenessLoop() {
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

}  // namespace silt::gateway
