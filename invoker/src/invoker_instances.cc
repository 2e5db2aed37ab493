// Instances: fetching bundles, sandboxes, starting a worker in one, and
// why an instance died.
#include "invoker_impl.h"

namespace silt::invoker {

absl::StatusOr<std::string> Invoker::Impl::FetchBundle(
    const std::string& digest) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
  control::FetchBundleRequest req;
  req.set_digest(digest);
  auto reader = control->FetchBundle(&ctx, req);
  control::BundleChunk chunk;
  std::string tar;
  while (reader->Read(&chunk)) tar += chunk.data();
  grpc::Status st = reader->Finish();
  if (!st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot fetch bundle ", digest,
                     " from the gateway: ", st.error_message()));
  }
  return tar;
}

absl::Status Invoker::Impl::FetchArchive(const std::string& digest,
                                         const std::string& path) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(1));
  control::FetchArchiveRequest req;
  req.set_digest(digest);
  auto reader = control->FetchArchive(&ctx, req);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  control::BundleChunk chunk;
  while (reader->Read(&chunk))
    out.write(chunk.data().data(), chunk.data().size());
  grpc::Status st = reader->Finish();
  out.close();
  if (!st.ok())
    return absl::UnavailableError(
        absl::StrCat("cannot fetch image archive ", digest,
                     " from the gateway: ", st.error_message()));
  if (!out)
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot write image archive ", digest, " to ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Bundle>> Invoker::Impl::BundleFor(
    const FunctionSpec& spec) {
  if (!spec.container_image().empty()) return container_bundle;
  return bundles->Ensure(spec.bundle_digest());
}

std::unique_ptr<Instance> Invoker::Impl::NewInstance(const FunctionSpec& spec) {
  auto inst = std::make_unique<Instance>();
  inst->id = absl::StrCat(spec.name(), "-", RandomId(8));
  inst->base_dir = options.data_dir + "/instances/" + inst->id;
  std::error_code ec;
  for (const char* d : {"/secrets", "/run", "/work"})
    std::filesystem::create_directories(inst->base_dir + d, ec);
  // Only the function's own host id reads its secrets and uses its run dir.
  inst->host_id = HostIdOf(spec.namespace_(), spec.name());
  auto own = [&](const std::string& path, mode_t mode) {
    chmod(path.c_str(), mode);
    (void)!chown(path.c_str(), inst->host_id, inst->host_id);
  };
  chmod(inst->base_dir.c_str(), 0755);
  for (const auto& [name, value] : spec.secrets()) {
    if (name.find('/') != std::string::npos || name == ".." || name == ".")
      continue;
    std::string path = inst->base_dir + "/secrets/" + name;
    {
      std::ofstream out(path, std::ios::binary);
      out << value;
    }
    own(path, 0400);
  }
  own(inst->base_dir + "/secrets", 0500);
  own(inst->base_dir + "/run", 0700);
  return inst;
}

absl::Status Invoker::Impl::LogPipes(const FunctionSpec& spec,
                                     const std::string& id, int* out_w,
                                     int* err_w) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError("pipe failed");
  }
  std::string fn_key = Key(spec.namespace_(), spec.name());
  collector->Add(out[0], fn_key, id);
  collector->Add(err[0], fn_key, id);
  *out_w = out[1];
  *err_w = err[1];
  return absl::OkStatus();
}

absl::StatusOr<int> Invoker::Impl::StateSocket(const FunctionSpec& spec) {
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0)
    return absl::InternalError("socketpair failed");
  proclet_host->Attach(sp[0], spec.namespace_(), spec.name());
  return sp[1];
}

absl::Status Invoker::Impl::SandboxFor(const FunctionSpec& spec,
                                       const Bundle& bundle, Instance& inst,
                                       bool snapshot_ready, SandboxSpec* sb) {
  sb->root_dir = root_skeleton;  // shared: every mount on it is private
  sb->host_id = inst.host_id;
  sb->bundle_dir = bundle.dir;
  sb->secrets_dir = inst.base_dir + "/secrets";
  sb->worker_dir = worker_dir;
  sb->snapshot_ready = snapshot_ready;
  sb->run_dir = inst.base_dir + "/run";
  if (!bind_dev_tmp)
    return absl::FailedPreconditionError(absl::StrCat(
        "no device nodes for sandboxes in ", dev_dir, " (see the log)"));
  if (auto s = MountTmp(inst.base_dir + "/tmp", sb->tmp_bytes); !s.ok())
    return s;
  inst.tmp_mounted = true;
  sb->dev_dir = dev_dir;
  sb->tmp_dir = inst.base_dir + "/tmp";
  sb->hostname = spec.name();
  sb->cgroup = absl::StrCat("silt/", cgroup_id, "/", inst.id);
  sb->memory_limit_bytes = MemoryLimit(spec);
  sb->cpu_millis = CpuMillis(spec);
  return absl::OkStatus();
}

uint64_t Invoker::Impl::MemoryLimit(const FunctionSpec& spec) const {
  uint64_t own = spec.memory_limit_bytes(), node = options.memory_bytes;
  return own > 0 && node > 0 ? std::min(own, node) : own;
}

uint64_t Invoker::Impl::CpuMillis(const FunctionSpec& spec) const {
  uint64_t own = spec.cpu_millis(), node = uint64_t{options.cpus} * 1000;
  return own > 0 && node > 0 ? std::min(own, node) : own;
}

absl::StatusOr<std::unique_ptr<Instance>> Invoker::Impl::StartInstance(
    const FunctionSpec& spec, const Bundle& bundle, bool snapshot_ready,
    ColdStart container_tier) {
  auto start = Clock::now();
  auto inst = NewInstance(spec);
  inst->tier = call_wire::StartTier::kBoot;
  int chan[2], out_w, err_w;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) != 0)
    return absl::InternalError("socketpair failed");
  if (auto s = LogPipes(spec, inst->id, &out_w, &err_w); !s.ok()) {
    close(chan[0]);
    close(chan[1]);
    return s;
  }

  SandboxSpec sb;
  absl::Status ready_sb = SandboxFor(spec, bundle, *inst, snapshot_ready, &sb);
  if (ready_sb.ok() && bundle.manifest.kind == "container")
    ready_sb = StartContainer(spec, *inst, &sb, container_tier);
  if (!ready_sb.ok()) {
    close(chan[0]);
    close(chan[1]);
    close(out_w);
    close(err_w);
    return ready_sb;
  }
  sb.argv = {kSandboxWorkerPath};
  sb.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8",
            absl::StrCat("HOSTNAME=", spec.name())};
  for (const auto& [k, v] : spec.env())
    sb.env.push_back(absl::StrCat(k, "=", v));
  if (!spec.env_process().empty() && !spec.env().contains("fprocess"))
    sb.env.push_back("fprocess=" + spec.env_process());
  sb.channel_fd = chan[1];
  sb.stdout_fd = out_w;
  sb.stderr_fd = err_w;
  auto proc = Spawn(sb);
  close(chan[1]);
  close(out_w);
  close(err_w);
  inst->channel = chan[0];
  if (!proc.ok()) return proc.status();
  inst->proc = *std::move(proc);

  auto state = StateSocket(spec);
  if (!state.ok()) return state.status();
  absl::Status sent = SendFds(inst->channel, &*state, 1);
  close(*state);
  if (!sent.ok())
    return absl::UnavailableError(
        absl::StrCat("instance ", inst->id, " died at start"));
  v1::WorkerConfig cfg;
  *cfg.mutable_spec() = spec;
  cfg.mutable_spec()->clear_secrets();
  cfg.set_instance_id(inst->id);
  cfg.set_bundle_dir(kSandboxBundleDir);
  cfg.set_kind(bundle.manifest.kind);
  cfg.set_entry(bundle.manifest.kind == "exec" && !spec.env_process().empty()
                    ? spec.env_process()
                    : bundle.manifest.entry);
  cfg.set_mode(bundle.manifest.mode);
  cfg.set_upstream_url(bundle.manifest.upstream_url);
  if (auto s = WriteFrame(inst->channel, cfg); !s.ok())
    return absl::UnavailableError(
        absl::StrCat("instance ", inst->id, " died at start"));
  v1::WorkerReady ready;
  if (auto s = ReadFrame(inst->channel, &ready, std::chrono::seconds(60));
      !s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "instance ", inst->id, " did not start: ", DeathReason(*inst).text));
  }
  if (!ready.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "function ", spec.name(), " failed to start: ", ready.error()));
  }
  TakeReady(*inst, ready);
  inst->start_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  inst->last_used = Clock::now();
  return inst;
}

auto Invoker::Impl::DeathReason(Instance& inst) -> Death {
  using call_wire::Failure;
  int st = inst.proc->Kill();
  if (inst.proc->cgroup().OomKilled())
    return {Failure::kOom, "killed: out of memory (memory limit reached)"};
  if (WIFSIGNALED(st)) {
    int sig = WTERMSIG(st);
    if (sig == SIGSYS)
      return {Failure::kSeccomp, "killed: forbidden system call (seccomp)"};
    // A clone's parent is inside its sandbox: the kernel's log says
    // whether seccomp killed it.
    if (sig == SIGKILL && seccomp_log && inst.proc->pid() > 0)
      if (auto nr =
              seccomp_log->KilledBy(inst.proc->pid(), absl::Milliseconds(200)))
        return {
            Failure::kSeccomp,
            absl::StrCat("killed: forbidden system call ", *nr, " (seccomp)")};
    if (sig == SIGKILL) return {Failure::kCrash, "killed (SIGKILL)"};
    return {Failure::kCrash, absl::StrCat("crashed with signal ", sig, " (",
                                          strsignal(sig), ")")};
  }
  if (WIFEXITED(st))
    return {Failure::kCrash,
            absl::StrCat("exited with status ", WEXITSTATUS(st))};
  return {Failure::kCrash, "ended"};
}

}  // namespace silt::invoker
