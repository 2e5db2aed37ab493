#include "invoker/invoker.h"

#include "invoker_impl.h"
#include "seccomp_policy.h"

namespace silt::invoker {

// ProcletHost over gRPC: the gateway's control of the shards held here.
class ProcletService final : public pv1::ProcletHost::Service {
 public:
  ProcletService(ProcletHost* host, std::function<GpuProclets*()> gpu)
      : host_(host), gpu_(std::move(gpu)) {}

  grpc::Status MigrateGpuProclet(grpc::ServerContext*,
                                 const pv1::MigrateGpuProcletRequest* req,
                                 pv1::MigrateGpuProcletResponse* res) override {
    GpuProclets* gpu = gpu_();
    if (gpu == nullptr)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the node is starting");
    auto m = gpu->Migrate(req->namespace_(), req->function(), req->name(),
                          req->target_data_address(), req->target_backend());
    if (!m.ok()) return ToGrpc(m.status());
    res->set_from_backend(m->from_backend);
    res->set_to_backend(m->to_backend);
    res->set_to_device(m->to_device);
    res->set_bytes(m->bytes);
    res->set_pause_ms(m->pause_ms);
    res->set_extract_ms(m->extract_ms);
    res->set_inject_ms(m->inject_ms);
    res->set_precopy_ms(m->precopy_ms);
    res->set_precopy_bytes(m->precopy_bytes);
    res->set_paused_bytes(m->paused_bytes);
    return grpc::Status::OK;
  }
  grpc::Status ResizeGpuProclet(grpc::ServerContext*,
                                const pv1::ResizeGpuProcletRequest* req,
                                pv1::ResizeGpuProcletResponse* res) override {
    GpuProclets* gpu = gpu_();
    if (gpu == nullptr)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the node is starting");
    auto i = gpu->Resize(req->namespace_(), req->function(), req->name(),
                         req->memory_limit(),
                         absl::Milliseconds(std::min(req->wait_ms(), 60000u)));
    if (!i.ok()) return ToGrpc(i.status());
    res->set_memory_limit(i->memory_limit);
    res->set_memory_used(i->memory_used);
    res->set_generation(i->generation);
    return grpc::Status::OK;
  }
  grpc::Status DropGpuProclets(grpc::ServerContext*,
                               const pv1::DropGpuProcletsRequest* req,
                               pv1::DropGpuProcletsResponse*) override {
    if (GpuProclets* gpu = gpu_())
      gpu->DropFunction(req->namespace_(), req->function());
    return grpc::Status::OK;
  }

  grpc::Status CreateShard(grpc::ServerContext*,
                           const pv1::CreateShardRequest* req,
                           pv1::CreateShardResponse*) override {
    return ToGrpc(host_->CreateShard(req->shard()));
  }
  grpc::Status DropShards(grpc::ServerContext*,
                          const pv1::DropShardsRequest* req,
                          pv1::DropShardsResponse*) override {
    host_->DropShards({req->ids().begin(), req->ids().end()});
    return grpc::Status::OK;
  }
  grpc::Status MigrateShard(grpc::ServerContext*,
                            const pv1::MigrateShardRequest* req,
                            pv1::MigrateShardResponse* res) override {
    auto deadline = std::chrono::system_clock::time_point::max();
    if (req->deadline_unix_ms() > 0)
      deadline = std::chrono::system_clock::time_point(
          std::chrono::milliseconds(req->deadline_unix_ms()));
    auto r = host_->Migrate(req->id(), req->target_data_address(), deadline);
    if (!r.ok()) return ToGrpc(r.status());
    *res = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status SplitShard(grpc::ServerContext*,
                          const pv1::SplitShardRequest* req,
                          pv1::SplitShardResponse* res) override {
    auto r = host_->Split(req->id(), req->new_id());
    if (!r.ok()) return ToGrpc(r.status());
    *res = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status MergeShards(grpc::ServerContext*,
                           const pv1::MergeShardsRequest* req,
                           pv1::MergeShardsResponse* res) override {
    auto r = host_->Merge(req->keep(), req->absorb());
    if (!r.ok()) return ToGrpc(r.status());
    *res->mutable_merged() = *std::move(r);
    return grpc::Status::OK;
  }

 private:
  ProcletHost* host_;
  std::function<GpuProclets*()> gpu_;
};

Invoker::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> l(stop_mu);
    stopping = true;
    // (Ends a connection attempt the gateway is not answering.)
    if (connect_ctx) connect_ctx->TryCancel();
  }
  stop_cv.notify_all();
  // A move in progress would hold the server's shutdown until it ends.
  if (proclet_host) proclet_host->StopMoves();
  if (server)
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
  if (connector.joinable()) connector.join();
  // An import in progress ends first; containerd stays for the instances'
  // containers, stopped with them below.
  if (container_images) container_images->StopImports();
  // Calls in flight end first (they use everything below).
  // The calls on lent instances end first too (new leases are refused);
  // what did not come back by then stops with the lease connections.
  RecallLeases(std::chrono::seconds(5));
  if (call_port) call_port->Stop();
  if (lease_port) lease_port->Stop();
  if (reaper.joinable()) reaper.join();
  if (tender.joinable()) tender.join();
  {
    std::lock_guard<std::mutex> l(mu);
    for (int fd : task_channels) shutdown(fd, SHUT_RDWR);
  }
  // The data port's peer threads run tasks and jobs here (RunTask: the
  // pools, mu, seccomp_log, the proclet host itself; the executor), so they
  // are joined while all of those still exist.
  if (proclet_host) proclet_host->StopPeers();
  executor.reset();
  proclet_host.reset();
  std::vector<std::unique_ptr<Instance>> doomed;
  {
    std::lock_guard<std::mutex> l(mu);
    pools.clear();
    doomed.swap(graveyard);
  }
  doomed.clear();
  // After the instances (their containers are deleted through it): a
  // containerd of our own stops.
  container_images.reset();
}

bool Invoker::Impl::Stopping() {
  std::lock_guard<std::mutex> l(stop_mu);
  return stopping;
}

absl::Status PrepareProcess() {
  // A mount namespace of the invoker's own, into which the host's mounts
  // still propagate but from which none of the invoker's (instances' /tmp and
  // /dev, CRIU's binds) leak: they go with the namespace when the invoker dies,
  // even by SIGKILL, on every host.
  if (unshare(CLONE_NEWNS) != 0)
    return absl::FailedPreconditionError(
        absl::StrCat("no private mount namespace (", strerror(errno),
                     "): mounts made for instances outlive a killed invoker"));
  if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make the mount namespace a slave (", strerror(errno),
        "): mounts made for instances outlive a killed invoker"));
  // CRIU keeps its kernel-feature cache in /run: it needs a tmpfs there.
  struct statfs run;
  if (statfs("/run", &run) == 0 && run.f_type == TMPFS_MAGIC)
    return absl::OkStatus();
  if (mount("silt-run", "/run", "tmpfs", MS_NOSUID | MS_NODEV,
            "mode=0755,size=16m") != 0)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot mount a tmpfs on /run (", strerror(errno),
                     "): CRIU's kernel-feature cache is off"));
  return absl::OkStatus();
}

Invoker::Invoker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Invoker::~Invoker() = default;

// GPU proclets run sandboxed like the function's instances, with its bundle
// (the kernels' PTX and host builds) and its uid.
GpuProcletsOptions Invoker::Impl::GpuProcletsHere() {
  Impl* p = this;
  GpuProcletsOptions o;
  o.data_dir = p->options.data_dir;
  o.root_dir = p->root_skeleton;
  o.dev_dir = p->gpu_dev_dir;
  o.worker_dir = p->worker_dir;
  o.cgroup_prefix = "silt/" + p->cgroup_id;
  o.backend = p->options.gpu_backend;
  o.data_address = [p] { return p->proclet_host->data_address(); };
  o.hello = [p] { return p->proclet_host->Hello(); };
  o.locate = [p](const std::string& ns, const std::string& function,
                 const std::string& name,
                 const GpuProcletsOptions::FunctionInfo& needs)
      -> absl::StatusOr<GpuProcletsOptions::Location> {
    control::OpenGpuProcletRequest req;
    req.set_namespace_(ns);
    req.set_function(function);
    req.set_name(name);
    req.set_memory_limit(needs.memory_limit);
    req.set_min_memory(needs.min_memory);
    req.set_preferred_memory(needs.preferred_memory);
    req.set_compute_capability(needs.compute_capability);
    req.set_node(p->node_name);
    control::GpuProcletLocation loc;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    grpc::Status st = p->control->OpenGpuProclet(&ctx, req, &loc);
    if (!st.ok())
      return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                          st.error_message());
    return GpuProcletsOptions::Location{loc.data_address(), loc.memory_limit(),
                                        loc.backend()};
  };
  o.function = [p](const std::string& ns, const std::string& function)
      -> absl::StatusOr<GpuProcletsOptions::FunctionInfo> {
    std::lock_guard<std::mutex> lock(p->mu);
    for (const auto& [key, pool] : p->pools) {
      if (pool->spec.namespace_() != ns || pool->spec.name() != function)
        continue;
      if (pool->bundle == nullptr || pool->bundle->dir.empty()) break;
      GpuProcletsOptions::FunctionInfo info;
      info.bundle_dir = pool->bundle->dir;
      info.memory_limit = pool->spec.gpu_memory_limit_bytes();
      info.min_memory = pool->spec.gpu_min_memory_bytes();
      info.preferred_memory = pool->spec.gpu_preferred_memory_bytes();
      info.compute_capability = pool->spec.gpu_compute_capability();
      return info;
    }
    return absl::NotFoundError(absl::StrCat(
        "function ", function, " (namespace ", ns,
        ") has no bundle on this node: only bundle functions have GPU "
        "proclets"));
  };
  return o;
}

absl::StatusOr<std::unique_ptr<Invoker>> Invoker::Start(
    const Options& options) {
  if (options.data_dir.empty())
    return absl::InvalidArgumentError("--data-dir is required");
  if (geteuid() != 0)
    return absl::PermissionDeniedError(
        "silt-invoker must run as root: instances run in namespaces and "
        "cgroups");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.worker_binary.empty()) {
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    impl->options.worker_binary = (self.parent_path() / "silt-worker").string();
  }
  if (access(impl->options.worker_binary.c_str(), X_OK) != 0)
    return absl::NotFoundError(
        absl::StrCat("silt-worker not found at ", impl->options.worker_binary));
  if (auto s = PrepareSeccomp(); !s.ok()) return s;
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir + "/bundles", ec);
  impl->bundles = std::make_unique<BundleCache>(
      options.data_dir + "/bundles",
      [p = impl.get()](const std::string& digest) {
        return p->FetchBundle(digest);
      });
  // Root's alone: images hold functions' memory, instances their secrets.
  // Sandboxes reach what they need through bind mounts, made as root.
  if (chmod(options.data_dir.c_str(), 0700) != 0)
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot make ", options.data_dir, " owner-only: ", strerror(errno)));
  // Sandboxes see a directory holding only silt-worker (CRIU cannot restore
  // file bind mounts, so the binary is not bound on its own).
  impl->worker_dir = options.data_dir + "/bin";
  std::filesystem::create_directories(impl->worker_dir, ec);
  std::filesystem::copy_file(
      impl->options.worker_binary, impl->worker_dir + "/silt-worker.tmp",
      std::filesystem::copy_options::overwrite_existing, ec);
  if (!ec)
    std::filesystem::rename(impl->worker_dir + "/silt-worker.tmp",
                            impl->worker_dir + "/silt-worker", ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot copy silt-worker into ", impl->worker_dir, ": ", ec.message()));
  }
  chmod(impl->worker_dir.c_str(), 0755);
  // silt-gpu-host (installed next to silt-worker) runs GPU proclets.
  {
    std::string gpu_host =
        (std::filesystem::path(impl->options.worker_binary).parent_path() /
         "silt-gpu-host")
            .string();
    std::error_code gec;
    std::filesystem::copy_file(
        gpu_host, impl->worker_dir + "/silt-gpu-host.tmp",
        std::filesystem::copy_options::overwrite_existing, gec);
    if (!gec)
      std::filesystem::rename(impl->worker_dir + "/silt-gpu-host.tmp",
                              impl->worker_dir + "/silt-gpu-host", gec);
    if (gec)
      fprintf(stderr,
              "silt-invoker: no GPU proclets here (silt-gpu-host: %s)\n",
              gec.message().c_str());
  }
  // silt-restorer (installed next to silt-worker) restores most images
  // without CRIU; without it every restore is CRIU's.
  std::string restorer =
      (std::filesystem::path(impl->options.worker_binary).parent_path() /
       "silt-restorer")
          .string();
  if (options.fast_restore && access(restorer.c_str(), X_OK) == 0) {
    std::filesystem::copy_file(
        restorer, impl->worker_dir + "/silt-restorer.tmp",
        std::filesystem::copy_options::overwrite_existing, ec);
    if (!ec)
      std::filesystem::rename(impl->worker_dir + "/silt-restorer.tmp",
                              impl->worker_dir + "/silt-restorer", ec);
    impl->fast_restore_on = !ec;
  }
  std::filesystem::remove_all(options.data_dir + "/instances",
                              ec);  // from a dead invoker
  std::filesystem::create_directories(options.data_dir + "/instances", ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat("data dir: ", ec.message()));

  {
    ProcletHostOptions po;
    po.data_listen = options.listen.substr(0, options.listen.rfind(':')) + ":0";
    Impl* p = impl.get();
    po.resolve =
        [p](const std::string& ns, const std::string& name, pv1::Kind kind,
            uint32_t initial_shards, uint64_t max_shard_bytes, bool create,
            const std::string& function) -> absl::StatusOr<pv1::Layout> {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
      pv1::Layout layout;
      grpc::Status st;
      if (create) {
        control::OpenStructureRequest req;
        req.set_namespace_(ns);
        req.set_name(name);
        req.set_kind(kind);
        req.set_initial_shards(initial_shards);
        req.set_max_shard_bytes(max_shard_bytes);
        req.set_function(function);
        st = p->control->OpenStructure(&ctx, req, &layout);
      } else {
        control::GetLayoutRequest req;
        req.set_namespace_(ns);
        req.set_name(name);
        st = p->control->GetLayout(&ctx, req, &layout);
      }
      if (!st.ok())
        return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                            st.error_message());
      return layout;
    };
    po.run_task = [p](const TaskTarget& t, std::string_view call) {
      return p->RunTask(t, call);
    };
    po.jobs = [p](const std::string& ns, const std::string& function,
                  std::string_view req) {
      if (!p->executor)
        return Error(wire::StateCode::kUnavailable, "the node is starting");
      return p->executor->Handle(ns, function, req);
    };
    po.gpu = [p](const std::string& ns, const std::string& function,
                 std::string_view req) {
      if (!p->gpu_proclets)
        return Error(wire::StateCode::kUnavailable, "the node is starting");
      return p->gpu_proclets->Serve(ns, function, req);
    };
    po.gpu_peer.serve = [p](wire::Reader& frame) {
      if (!p->gpu_proclets)
        return Error(wire::StateCode::kUnavailable, "the node is starting");
      return p->gpu_proclets->ServePeer(frame);
    };
    po.gpu_peer.adopt = [p](wire::Reader& frame, PeerStream& stream) {
      if (!p->gpu_proclets) return std::string();
      return p->gpu_proclets->AdoptPeer(frame, stream);
    };
    auto host = ProcletHost::Start(std::move(po));
    if (!host.ok()) return host.status();
    impl->proclet_host = *std::move(host);
    impl->proclet_service = std::make_unique<ProcletService>(
        impl->proclet_host.get(), [p] { return p->gpu_proclets.get(); });
  }
  {
    Impl* p = impl.get();
    auto port = CallPort::Listen(
        options.listen.substr(0, options.listen.rfind(':')) + ":0",
        impl->proclet_host->data_key(),
        [p](call_wire::Request& req, RequestBody* body, call_wire::Reply* reply,
            ReplyStream& stream) { p->Call(req, body, reply, stream); });
    if (!port.ok()) return port.status();
    impl->call_port = *std::move(port);
    auto leases = LeasePort::Listen(
        absl::StrCat("silt-leases-", getpid(), "-", RandomId(8)),
        impl->proclet_host->data_key(),
        {.lend =
             [p](uint64_t conn, const call_wire::LeaseAsk& ask) {
               return p->Lend(conn, ask);
             },
         .take_back =
             [p](uint64_t conn, const call_wire::Return& ret) {
               return p->TakeBack(conn, ret);
             },
         .closed = [p](uint64_t conn) { p->LeasesClosed(conn); }});
    if (!leases.ok()) return leases.status();
    impl->lease_port = *std::move(leases);
  }

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(),
                           &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // see nodes.cc
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  // Invoke handlers block while their instance works: keep the handler threads
  // instead of letting gRPC's sync server create and destroy one per burst
  // (measured: thread churn was the invoker's largest cost under concurrent
  // load).
  builder.SetSyncServerOption(
      grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(
      grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 256);
  builder.RegisterService(impl.get());
  builder.RegisterService(impl->proclet_service.get());
  impl->server = builder.BuildAndStart();
  if (!impl->server || port == 0)
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen));
  impl->address = options.listen.substr(0, options.listen.rfind(':')) + ":" +
                  std::to_string(port);
  impl->node_name = options.node_name;
  if (impl->node_name.empty()) {
    char host[64] = {0};
    gethostname(host, sizeof(host) - 1);
    impl->node_name = absl::StrCat(absl::AsciiStrToLower(host), "-", port);
  }
  // Cgroups are named after this data dir's stable id, not the node name: a
  // restarted invoker finds (and cleans up) exactly what its predecessor left,
  // and two invokers on one machine never touch each other's instances.
  {
    std::string id_file = options.data_dir + "/node-id";
    std::ifstream in(id_file);
    std::getline(in, impl->cgroup_id);
    if (impl->cgroup_id.empty()) {
      impl->cgroup_id = RandomId(12);
      std::ofstream(id_file) << impl->cgroup_id << "\n";
    }
  }
  CleanupStaleCgroups("silt/" + impl->cgroup_id);
  {
    auto cg =
        NodeCgroup::Create("silt/" + impl->cgroup_id, options.memory_bytes,
                           uint64_t{options.cpus} * 1000);
    if (!cg.ok())
      return absl::Status(
          cg.status().code(),
          absl::StrCat("cannot enforce the node's capacity (--cpus, --memory) "
                       "on its instances: ",
                       cg.status().message()));
    impl->node_cgroup = *std::move(cg);
    if (options.cpus > 0 || options.memory_bytes > 0)
      fprintf(stderr,
              "silt-invoker: instances limited together to %s CPU(s) and %s "
              "MiB of memory (cgroup %s)\n",
              options.cpus > 0 ? std::to_string(options.cpus).c_str() : "all",
              options.memory_bytes > 0
                  ? std::to_string(options.memory_bytes >> 20).c_str()
                  : "all",
              impl->node_cgroup->memory_dir().c_str());
  }
  if (auto favored = FavorCgroupMoves(); favored.ok())
    fprintf(stderr, "silt-invoker: fast cgroup moves (favordynmods) on %s\n",
            favored->c_str());
  else
    fprintf(stderr,
            "silt-invoker: cgroup moves may wait for RCU (each instance start "
            "can take milliseconds longer): %s\n",
            std::string(favored.status().message()).c_str());
  impl->images = std::make_unique<ImageCatalog>(
      options.data_dir + "/snapshots", options.data_dir + "/working-sets");
  impl->root_skeleton = options.data_dir + "/root";
  if (auto s = PrepareRootSkeleton(impl->root_skeleton); !s.ok()) return s;
  impl->dev_dir = options.data_dir + "/dev";
  if (auto s = PrepareDevDir(impl->dev_dir); s.ok()) {
    impl->bind_dev_tmp = true;
  } else {
    fprintf(stderr, "silt-invoker: no instance can start: %s\n",
            std::string(s.message()).c_str());
  }
  impl->gpu_dev_dir = impl->dev_dir;
  if (options.gpu_backend != "host" && impl->bind_dev_tmp) {
    const std::string gpu_dev = options.data_dir + "/gpu-dev";
    auto copied = PrepareGpuDevDir(gpu_dev);
    if (!copied.ok())
      fprintf(stderr, "silt-invoker: GPU proclets get no GPU device: %s\n",
              std::string(copied.status().message()).c_str());
    else if (*copied > 0)
      impl->gpu_dev_dir = gpu_dev;
  }
  impl->gpu_proclets = std::make_unique<GpuProclets>(impl->GpuProcletsHere());
  if (options.snapshots) {
    auto v = snapshot::CriuVersion();
    if (v.ok()) {
      impl->criu_version = *v;
      impl->snapshots_on = true;
      impl->images->Load();
      // (where container checkpoints were kept before they were images)
      std::error_code ec;
      std::filesystem::remove_all(options.data_dir + "/container-checkpoints",
                                  ec);
    } else {
      fprintf(stderr,
              "silt-invoker: snapshots off (instances always boot): %s\n",
              std::string(v.status().message()).c_str());
    }
  }
  impl->collector = std::make_unique<LogCollector>(&impl->logs);
  if (auto sl = SeccompLog::Start(); sl.ok())
    impl->seccomp_log = *std::move(sl);
  else
    fprintf(stderr,
            "silt-invoker: instances killed by seccomp after a restore or "
            "fork are reported as killed: %s\n",
            std::string(sl.status().message()).c_str());
  if (options.gpu_backend != "host")
    if (auto devices = gpu::ListDevices(); devices.ok() && !devices->empty()) {
      impl->gpus = static_cast<uint32_t>(devices->size());
      impl->gpu_model = (*devices)[0].name;
      impl->gpu_memory = (*devices)[0].total_memory_bytes;
      impl->gpu_compute = static_cast<uint32_t>(
          (*devices)[0].compute_major * 10 + (*devices)[0].compute_minor);
    }

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  impl->gateway_channel = grpc::CreateCustomChannel(
      options.gateway, grpc::InsecureChannelCredentials(), args);
  impl->control = control::Control::NewStub(impl->gateway_channel);
  Impl* p = impl.get();
  {
    ContainerImages::Options co;
    co.containerd_socket = options.containerd;
    co.dir = options.data_dir + "/containerd";
    co.fetch = [p](const std::string& digest, const std::string& path) {
      return p->FetchArchive(digest, path);
    };
    co.changed = [p] {
      std::lock_guard<std::mutex> l(p->stop_mu);
      p->stop_cv.notify_all();
    };
    co.replaced = [p](const std::string& name) { p->ImageReplaced(name); };
    impl->container_images = std::make_unique<ContainerImages>(co);
    auto cb = std::make_shared<Bundle>();
    cb->dir = options.data_dir + "/container-bundle";  // empty
    std::filesystem::create_directories(cb->dir, ec);
    chmod(cb->dir.c_str(), 0755);
    cb->manifest.kind = "container";
    cb->manifest.mode = "http";
    cb->manifest.upstream_url =
        absl::StrCat("http://127.0.0.1:", kWatchdogPort);
    impl->container_bundle = std::move(cb);
  }
  {
    ExecutorOptions eo;
    eo.node_name = impl->node_name;
    eo.data_address = impl->proclet_host->data_address();
    eo.run_local = [p](const TaskTarget& t, std::string_view call) {
      return p->RunTask(t, call);
    };
    eo.state = [p](const std::string& ns, const std::string& function,
                   std::string_view req) {
      return p->proclet_host->Serve(ns, function, req);
    };
    eo.layout = [p](const std::string& ns,
                    const std::string& name) -> absl::StatusOr<pv1::Layout> {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
      control::GetLayoutRequest req;
      req.set_namespace_(ns);
      req.set_name(name);
      pv1::Layout layout;
      grpc::Status st = p->control->GetLayout(&ctx, req, &layout);
      if (!st.ok())
        return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                            st.error_message());
      return layout;
    };
    eo.hello = [p] { return p->proclet_host->Hello(); };
    eo.target = [p](const std::string& ns, const std::string& function) {
      return p->TargetOf(ns, function);
    };
    eo.view = &impl->cluster;
    impl->executor = std::make_unique<Executor>(std::move(eo));
  }
  impl->connector = std::thread([p] { p->ConnectLoop(); });
  impl->reaper = std::thread([p] { p->ReapLoop(); });
  impl->tender = std::thread([p] { p->TendLoop(); });
  return std::unique_ptr<Invoker>(new Invoker(std::move(impl)));
}

std::string Invoker::listen_address() const { return impl_->address; }
std::string Invoker::node_name() const { return impl_->node_name; }

absl::Status Invoker::Drain(std::chrono::milliseconds timeout) {
  Impl& im = *impl_;
  uint64_t n = 0, bytes = 0;  // proclets held here
  auto count_held = [&] {
    n = bytes = 0;
    for (const auto& s : im.proclet_host->Shards()) {
      ++n;
      bytes += s.bytes();
    }
  };
  count_held();
  fprintf(stderr,
          "silt-invoker: draining: asking the gateway to move the %llu "
          "proclet(s) held here (%llu bytes) to other nodes (at most %lld "
          "ms)\n",
          static_cast<unsigned long long>(n),
          static_cast<unsigned long long>(bytes),
          static_cast<long long>(timeout.count()));
  auto start = Clock::now();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  {
    std::lock_guard<std::mutex> l(im.stop_mu);
    if (im.stopping) return absl::CancelledError("the invoker is stopping");
    im.drain_ctx = &ctx;
  }
  control::DrainRequest req;
  req.set_node_name(im.node_name);
  control::DrainReply res;
  grpc::Status st = im.control->Drain(&ctx, req, &res);
  {
    std::lock_guard<std::mutex> l(im.stop_mu);
    im.drain_ctx = nullptr;
  }
  double ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  // What is still here is what the node takes with it.
  count_held();
  absl::Status out;
  if (!st.ok()) {
    out = absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                       absl::StrCat("the gateway did not drain this node: ",
                                    st.error_message()));
  } else if (n > 0) {
    out = res.reason_code() != 0
              ? absl::Status(static_cast<absl::StatusCode>(res.reason_code()),
                             res.reason())
              : absl::UnavailableError("proclets are still held here");
  }
  if (out.ok()) {
    fprintf(stderr,
            "silt-invoker: drained: %u proclet(s) (%llu bytes) moved to other "
            "nodes in %.0f ms; none left here\n",
            res.moved(), static_cast<unsigned long long>(res.moved_bytes()),
            ms);
  } else if (n == 0) {
    fprintf(stderr, "silt-invoker: drain: %s (no proclets held here)\n",
            std::string(out.message()).c_str());
    out = absl::OkStatus();  // nothing to lose
  } else {
    fprintf(stderr,
            "silt-invoker: drain incomplete after %.0f ms: %u proclet(s) "
            "moved; %llu proclet(s) (%llu bytes) are still here and WILL BE "
            "LOST when this node stops: %s\n",
            ms, res.moved(), static_cast<unsigned long long>(n),
            static_cast<unsigned long long>(bytes),
            std::string(out.message()).c_str());
  }
  return out;
}

void Invoker::Wait() {
  std::unique_lock<std::mutex> l(impl_->stop_mu);
  impl_->stop_cv.wait(l, [this] { return impl_->stopping; });
}

void Invoker::Shutdown() {
  {
    std::lock_guard<std::mutex> l(impl_->stop_mu);
    impl_->stopping = true;
    if (impl_->drain_ctx) impl_->drain_ctx->TryCancel();
  }
  if (impl_->proclet_host) impl_->proclet_host->StopMoves();
  impl_->stop_cv.notify_all();
}

}  // namespace silt::invoker
