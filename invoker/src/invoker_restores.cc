// Restore tiers: staged silt-restorers, fast restore, CRIU restore, fork
// templates and their clones.
#include "invoker_impl.h"

namespace silt::invoker {

absl::StatusOr<std::unique_ptr<Instance>> Invoker::Impl::SpawnRestorer(
    Pool& pool, bool populate) {
  auto plan = images->Plan(pool.snapshot_id);
  if (!plan.ok()) return plan.status();
  auto inst = NewInstance(pool.spec);
  inst->tier = call_wire::StartTier::kRestore;
  int chan[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) != 0)
    return absl::InternalError("socketpair failed");
  int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  SandboxSpec sb;
  absl::Status s = SandboxFor(pool.spec, *pool.bundle, *inst,
                              /*snapshot_ready=*/true, &sb);
  if (s.ok()) {
    sb.argv = {absl::StrCat(kSandboxWorkerDir, "/silt-restorer")};
    sb.env = {"GLIBC_TUNABLES=glibc.pthread.rseq=0"};
    sb.channel_fd = chan[1];
    sb.stdout_fd = null;
    sb.stderr_fd = null;
    auto proc = Spawn(sb);
    if (proc.ok())
      inst->proc = *std::move(proc);
    else
      s = proc.status();
  }
  close(chan[1]);
  close(null);
  inst->channel = chan[0];
  if (!s.ok()) return s;
  auto listener = ListenIn(inst->base_dir + "/run", inst->host_id);
  if (!listener.ok()) return listener.status();
  inst->listener = *listener;
  if (auto st = StageRestorer(*inst, **plan, populate); !st.ok()) {
    images->RefuseFast(pool.snapshot_id);
    return st;
  }
  return inst;
}

absl::Status Invoker::Impl::StageRestorer(Instance& inst,
                                          const snapshot::FastPlan& plan,
                                          bool populate) {
  int pages = open(plan.pages_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (pages < 0)
    return absl::InternalError(absl::StrCat("cannot open ", plan.pages_file));
  absl::Status s = SendFds(inst.channel, &pages, 1);
  close(pages);
  uint32_t len = static_cast<uint32_t>(plan.bytes.size());
  std::string msg(1, populate ? 'P' : 'M');
  msg.append(reinterpret_cast<const char*>(&len), 4);
  msg += plan.bytes;
  for (size_t off = 0; s.ok() && off < msg.size();) {
    ssize_t n = write(inst.channel, msg.data() + off, msg.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) s = absl::UnavailableError("the restorer went away");
    off += n > 0 ? static_cast<size_t>(n) : 0;
  }
  if (!s.ok()) return s;
  // 'K': staged; 'E' and why: it cannot restore this image.
  pollfd p{inst.channel, POLLIN, 0};
  if (poll(&p, 1, 10000) != 1)
    return absl::DeadlineExceededError("the restorer did not answer");
  char reply[512];
  ssize_t n = read(inst.channel, reply, sizeof(reply));
  if (n <= 0 || reply[0] != 'K')
    return absl::FailedPreconditionError(
        n > 1 ? std::string(reply + 1, static_cast<size_t>(n - 1))
              : "the restorer quit");
  return absl::OkStatus();
}

void Invoker::Impl::TendLoop() {
  for (uint64_t tick = 0;; ++tick) {
    {
      std::unique_lock<std::mutex> l(stop_mu);
      if (stop_cv.wait_for(l, std::chrono::milliseconds(100),
                           [&] { return stopping || tend_kick; }) &&
          stopping)
        return;
      tend_kick = false;
    }
    if (tick % 10 == 0) {  // once a second
      MeasureResident();
      std::vector<std::shared_ptr<Template>> dropped;
      std::lock_guard<std::mutex> l(mu);
      MakeRoomLocked(nullptr, 0, &dropped);
      // (the lock goes before `dropped`, declared first, ends templates)
    }
    TendRestorers();
    TendStagedContainers();
  }
}

void Invoker::Impl::KickTender() {
  {
    std::lock_guard<std::mutex> l(stop_mu);
    tend_kick = true;
  }
  stop_cv.notify_all();
}

void Invoker::Impl::TendRestorers() {
  if (!fast_restore_on) return;
  std::shared_ptr<Pool> chosen;
  bool populate = true;
  std::vector<std::shared_ptr<Template>> dropped;
  {
    std::lock_guard<std::mutex> l(mu);
    std::vector<std::shared_ptr<Pool>> candidates;
    for (auto& [key, pool] : pools) {
      if (pool->restorer || pool->restorer_starting || !pool->snapshot_wanted ||
          !images->Has(pool->snapshot_id) ||
          images->FastRefused(pool->snapshot_id))
        continue;
      candidates.push_back(pool);
    }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const auto& a, const auto& b) {
                       return a->last_start > b->last_start;
                     });
    // One per pass, the most recently started function's first: a
    // function whose restorer was just used never waits behind a long
    // list (each takes a sandbox start); the next pass comes at once.
    // Populated while those take at most half the budget (and there is
    // room), else only mapped: many functions each get a restorer that
    // saves the sandbox start, the most recent also their page faults.
    for (auto& pool : candidates) {
      populate = true;
      uint64_t whole = RestorerBytesLocked(*pool, true);
      if (!MakeFullRoomLocked(*pool, whole, &dropped) ||
          !MakeRoomLocked(pool.get(), whole, &dropped)) {
        populate = false;
        if (!MakeRoomLocked(pool.get(), RestorerBytesLocked(*pool, false),
                            &dropped))
          continue;
      }
      pool->restorer_starting = true;
      pool->restorer_populated = populate;
      chosen = pool;
      break;
    }
  }
  dropped.clear();
  if (chosen == nullptr) return;
  auto r = SpawnRestorer(*chosen, populate);
  bool staged = r.ok();
  {
    std::lock_guard<std::mutex> l(mu);
    chosen->restorer_starting = false;
    if (r.ok()) chosen->restorer = *std::move(r);
  }
  if (staged) KickTender();  // (a failed one is tried again in 100 ms)
}

bool Invoker::Impl::MakeFullRoomLocked(
    const Pool& pool, uint64_t need,
    std::vector<std::shared_ptr<Template>>* dropped) {
  const uint64_t share = options.resident_memory_bytes / 2;
  struct Full {
    Pool* pool;
    ResidentKind kind;
    uint64_t bytes;
    Clock::time_point used;
  };
  uint64_t held = 0, freeable = 0;
  std::vector<Full> older;
  for (const auto& [key, p] : pools) {
    std::vector<Full> mine;
    if (p->restorer && p->restorer_populated)
      mine.push_back({p.get(), ResidentKind::kRestorer,
                      RestorerBytesLocked(*p, true), p->last_start});
    if (p->tmpl)
      mine.push_back({p.get(), ResidentKind::kTemplate,
                      HeldBytesLocked(*p, ResidentKind::kTemplate),
                      std::max(p->last_start, p->tmpl->last_used)});
    for (const auto& f : mine) {
      held += f.bytes;
      if (f.used < pool.last_start) {
        freeable += f.bytes;
        older.push_back(f);
      }
    }
  }
  if (need > share || held - freeable + need > share) return false;
  std::sort(older.begin(), older.end(),
            [](const Full& a, const Full& b) { return a.used < b.used; });
  for (const Full& f : older) {
    if (held + need <= share) break;
    held -= f.bytes;
    if (f.kind == ResidentKind::kRestorer) {
      // Demoted in place: it keeps its sandbox and its mapping of the
      // image and gives back the pages ('D'; restorer.cc), which saves
      // the sandbox start of a new one that only maps.
      if (write(f.pool->restorer->channel, "D", 1) == 1)
        f.pool->restorer_populated = false;
      else
        graveyard.push_back(std::move(f.pool->restorer));
    } else {
      dropped->push_back(std::move(f.pool->tmpl));
      f.pool->template_retry_after = Clock::now() + std::chrono::minutes(1);
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<Instance>> Invoker::Impl::FastRestore(
    Pool& pool, bool as_template) {
  auto start = Clock::now();
  const std::string& id = pool.snapshot_id;
  std::unique_ptr<Instance> inst;
  bool populated = false;
  {
    std::lock_guard<std::mutex> l(mu);
    inst = std::move(pool.restorer);
    populated = inst != nullptr && pool.restorer_populated;
  }
  // Mapped lazily: what the last lazy restore touched is read ahead now,
  // or, with none recorded, this one's first call records it.
  bool record = false;
  if (!populated) {
    if (auto plan = images->Plan(id); plan.ok())
      record = !PrefetchWorkingSet(pool, **plan);
  }
  if (inst == nullptr) {
    auto r = SpawnRestorer(pool, /*populate=*/false);
    if (!r.ok()) return r.status();
    inst = *std::move(r);
  }
  if (write(inst->channel, "G", 1) != 1)
    return absl::UnavailableError("the restorer went away");
  close(inst->channel);
  inst->channel = -1;
  pid_t pid = inst->proc->pid();
  absl::Status resumed =
      WakeAndResume(pool.spec, *inst, pid, inst->listener, as_template);
  KickTender();  // the next one, now that this one is up
  close(inst->listener);
  inst->listener = -1;
  if (!resumed.ok()) {
    images->RefuseFast(id);
    return absl::InternalError(
        absl::StrCat(resumed.message(), ": ", DeathReason(*inst).text));
  }
  inst->start_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  inst->last_used = Clock::now();
  if (record && !as_template) inst->record_working_set = id;
  return inst;
}

absl::StatusOr<std::unique_ptr<Instance>> Invoker::Impl::CriuRestoreInstance(
    Pool& pool, bool by_criu, bool as_template) {
  auto start = Clock::now();
  std::string dir = images->Dir(pool.snapshot_id);
  auto inst = NewInstance(pool.spec);
  inst->tier = call_wire::StartTier::kRestore;
  if (auto s = PrepareRootSkeleton(inst->base_dir + "/root"); !s.ok()) return s;
  if (bind_dev_tmp) {
    if (auto s = MountTmp(inst->base_dir + "/tmp", 64 << 20); !s.ok()) return s;
    inst->tmp_mounted = true;
  }
  auto listener = ListenIn(inst->base_dir + "/run", inst->host_id);
  if (!listener.ok()) return listener.status();
  snapshot::RestoreOptions o;
  o.images_dir = dir;
  o.root_dir = inst->base_dir + "/root";
  o.work_dir = inst->base_dir + "/work";
  o.mounts = Mounts(*inst, *pool.bundle);
  std::vector<std::pair<std::string, std::string>> sources;
  for (const auto& m : o.mounts) sources.emplace_back(m.key, m.host_dir);
  auto binds = TraversableBinds::Make(inst->id, sources);
  if (!binds.ok()) {
    close(*listener);
    return binds.status();
  }
  for (auto& m : o.mounts) m.host_dir = (*binds)->PathOf(m.key);
  if (by_criu) inst->tier = call_wire::StartTier::kCriu;
  auto pid = snapshot::Restore(o);
  if (!pid.ok()) {
    close(*listener);
    return pid.status();
  }
  auto cg = Cgroup::Create(absl::StrCat("silt/", cgroup_id, "/", inst->id),
                           MemoryLimit(pool.spec), CpuMillis(pool.spec), 1024);
  if (!cg.ok()) {
    kill(*pid, SIGKILL);
    waitpid(*pid, nullptr, 0);
    close(*listener);
    return cg.status();
  }
  auto proc = SandboxedProcess::Adopt(*pid, *std::move(cg));
  if (!proc.ok()) {
    kill(*pid, SIGKILL);
    waitpid(*pid, nullptr, 0);
    close(*listener);
    return proc.status();
  }
  inst->proc = *std::move(proc);
  absl::Status s = LoopbackUp(*pid);
  if (s.ok()) s = WakeAndResume(pool.spec, *inst, *pid, *listener, as_template);
  close(*listener);
  if (!s.ok()) return s;
  inst->start_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  inst->last_used = Clock::now();
  return inst;
}

absl::StatusOr<std::shared_ptr<Template>> Invoker::Impl::MakeTemplate(
    Pool& pool, std::unique_ptr<Instance> inst) {
  v1::WorkerCall op;
  op.set_op(v1::WORKER_OP_TEMPLATE);
  v1::WorkerReply ok;
  if (auto s = WriteFrame(inst->channel, op); !s.ok()) return s;
  if (auto s = ReadFrame(inst->channel, &ok, std::chrono::seconds(10)); !s.ok())
    return s;
  auto t = std::make_shared<Template>();
  t->snapshot_id = pool.snapshot_id;
  t->inst = std::move(inst);
  t->last_used = Clock::now();
  return t;
}

absl::StatusOr<std::unique_ptr<Instance>> Invoker::Impl::ForkInstance(
    Pool& pool, std::shared_ptr<Template> t) {
  auto start = Clock::now();
  auto inst = std::make_unique<Instance>();
  inst->id = absl::StrCat(pool.spec.name(), "-", RandomId(8));
  inst->tier = call_wire::StartTier::kFork;
  int chan[2], out_w, err_w;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) != 0)
    return absl::InternalError("socketpair failed");
  inst->channel = chan[0];
  if (auto s = LogPipes(pool.spec, inst->id, &out_w, &err_w); !s.ok()) {
    close(chan[1]);
    return s;
  }
  auto state = StateSocket(pool.spec);
  if (!state.ok()) {
    close(chan[1]);
    close(out_w);
    close(err_w);
    return state.status();
  }
  v1::WorkerReply reply;
  absl::Status s;
  {
    std::lock_guard<std::mutex> l(t->fork_mu);
    int fds[4] = {chan[1], out_w, err_w, *state};
    s = SendFds(t->inst->channel, fds, 4);
    v1::WorkerCall fork;
    fork.set_op(v1::WORKER_OP_FORK);
    fork.set_instance_id(inst->id);
    fork.set_seed(Seed());
    if (s.ok()) s = WriteFrame(t->inst->channel, fork);
    if (s.ok())
      s = ReadFrame(t->inst->channel, &reply, std::chrono::seconds(10));
    t->last_used = Clock::now();
  }
  close(chan[1]);
  close(out_w);
  close(err_w);
  close(*state);
  if (!s.ok()) return s;
  if (reply.status() != 200)
    return absl::InternalError(absl::StrCat("fork failed: ", reply.body()));
  pid_t host = HostPidOfChild(t->inst->proc->pid(), reply.body());
  if (host <= 0)
    return absl::InternalError("cannot find the forked clone's process");
  auto cg = Cgroup::Create(absl::StrCat("silt/", cgroup_id, "/", inst->id),
                           MemoryLimit(pool.spec), CpuMillis(pool.spec), 1024);
  if (!cg.ok()) {
    kill(host, SIGKILL);
    return cg.status();
  }
  auto proc = SandboxedProcess::AdoptClone(host, *std::move(cg));
  if (!proc.ok()) {
    kill(host, SIGKILL);
    return proc.status();
  }
  inst->proc = *std::move(proc);
  inst->tmpl = std::move(t);
  v1::WorkerReady ready;
  if (auto r = ReadFrame(inst->channel, &ready, std::chrono::seconds(30));
      !r.ok() || !ready.ok())
    return absl::UnavailableError(
        absl::StrCat("forked instance ", inst->id, " did not start"));
  TakeReady(*inst, ready);
  inst->start_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  inst->last_used = Clock::now();
  return inst;
}

pid_t Invoker::Impl::HostPidOfChild(pid_t parent, const std::string& ns_pid) {
  for (pid_t c : ProcessTree(parent)) {
    if (c == parent) continue;
    std::ifstream status(absl::StrCat("/proc/", c, "/status"));
    std::string line;
    while (std::getline(status, line)) {
      if (!absl::StartsWith(line, "NSpid:")) continue;
      std::vector<std::string> parts =
          absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
      if (!parts.empty() && parts.back() == ns_pid) return c;
    }
  }
  return -1;
}

}  // namespace silt::invoker
