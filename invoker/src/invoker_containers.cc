// Container functions' instances: starting one (booted, or restored from
// its function's checkpoint by runc and CRIU, the first booted checkpointed
// for the next), and staging the next one ahead of need: restored and
// frozen, under the resident budget, so that a cold start only thaws it.
#include "containerd/archive.h"
#include "invoker_impl.h"

namespace silt::invoker {
absl::Status Invoker::Impl::StartContainer(const FunctionSpec& spec,
                                           Instance& inst, SandboxSpec* sb,
                                           ColdStart tier) {
  // Restored from the function's checkpoint on this node by runc and CRIU
  // when there is one and that is the faster (a failed restore drops it and
  // boots), else booted, and the first boot checkpointed for the next
  // (snapshots wanted: com.silt.snapshot). Checkpoints are snapshot images
  // like bundles' (the catalog, DATA_DIR/snapshots/<version>): sealed with
  // a manifest, checked before each restore, kept across restarts (nodes
  // do not fetch them from peers: each checkpoints its own first boot).
  const bool snapshots = snapshots_on && SnapshotsWanted(spec);
  const std::string version = SnapshotIdOf(spec);
  const std::string fn = Key(spec.namespace_(), spec.name());
  auto runtime = container_images->Runtime();
  if (!runtime.ok()) return runtime.status();
  // Not one that is damaged, nor one of the image as it was before it was
  // imported again under its name.
  bool have = snapshots && images->Has(version);
  if (have) {
    auto m = snapshot::Verify(images->Dir(version));
    absl::Status usable = m.status();
    if (m.ok())
      if (auto digest = (*runtime)->ImageDigest(spec.container_image());
          digest.ok() && *digest != m->bundle_digest)
        usable = absl::FailedPreconditionError(
            absl::StrCat("it is of image ", spec.container_image(),
                         " as it was (", m->bundle_digest, "), now ", *digest));
    if (!usable.ok()) {
      logs.Append(fn, "invoker",
                  absl::StrCat("silt: not restoring: ", usable.message()));
      DropImage(version, std::string(usable.message()));
      have = false;
    }
  }
  const bool must_restore =
      tier == ColdStart::kRestore || tier == ColdStart::kCriu;
  if (must_restore && !have)
    return absl::FailedPreconditionError(
        absl::StrCat("function ", spec.name(),
                     snapshots ? " has no checkpoint on this node yet"
                               : " does not use snapshots"));
  ContainerLaunch l;
  l.id = inst.id;
  l.image = spec.container_image();
  for (const auto& [k, v] : spec.env())
    l.env.push_back(absl::StrCat(k, "=", v));
  if (!spec.env_process().empty() && !spec.env().contains("fprocess"))
    l.env.push_back("fprocess=" + spec.env_process());
  l.secrets_dir = inst.base_dir + "/secrets";
  l.memory_limit_bytes = MemoryLimit(spec);
  l.cpu_millis = CpuMillis(spec);
  l.read_only_root = spec.read_only_root();
  // Its stdout and stderr, through a FIFO, are the instance's log lines. A
  // writer of ours keeps the FIFO from reading as ended until the
  // container's shim has opened it.
  l.log_path = inst.base_dir + "/container.log";
  if (mkfifo(l.log_path.c_str(), 0600) != 0)
    return absl::InternalError(
        absl::StrCat("mkfifo ", l.log_path, ": ", strerror(errno)));
  int r = open(l.log_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  int keep = r < 0 ? -1 : open(l.log_path.c_str(), O_WRONLY | O_CLOEXEC);
  if (r < 0 || keep < 0) {
    if (r >= 0) close(r);
    return absl::InternalError(
        absl::StrCat("opening ", l.log_path, ": ", strerror(errno)));
  }
  collector->Add(r, fn, inst.id);
  bool restore_faster = true;  // until measured
  {
    absl::MutexLock t(&container_times_mu);
    if (auto it = container_times.find(version); it != container_times.end())
      restore_faster = it->second.restore_ms == 0 || it->second.boot_ms == 0 ||
                       it->second.restore_ms < it->second.boot_ms;
  }
  auto timed_start = [&](double ContainerStartTimes::*field) {
    auto t0 = Clock::now();
    auto r = (*runtime)->Start(l, std::chrono::seconds(60));
    if (r.ok()) {
      absl::MutexLock t(&container_times_mu);
      container_times[version].*field =
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
    return r;
  };
  absl::StatusOr<RunningContainer> running =
      absl::UnavailableError("not started");
  if (have && (must_restore || (tier == ColdStart::kAny && restore_faster))) {
    l.restore_from = images->Dir(version);
    running = timed_start(&ContainerStartTimes::restore_ms);
    if (running.ok()) {
      inst.tier = call_wire::StartTier::kCriu;
    } else if (must_restore) {
      close(keep);
      return running.status();
    } else {
      logs.Append(fn, "invoker",
                  absl::StrCat("silt: restoring the container failed (",
                               running.status().message(),
                               "); dropping its checkpoint and booting"));
      DropImage(version, std::string(running.status().message()));
      l.restore_from.clear();
    }
  }
  if (!running.ok()) running = timed_start(&ContainerStartTimes::boot_ms);
  close(keep);
  if (!running.ok()) return running.status();
  if (have && tier == ColdStart::kAny && !restore_faster &&
      l.restore_from.empty()) {
    absl::MutexLock t(&container_times_mu);
    ContainerStartTimes& times = container_times[version];
    if (times.restore_ms > 0 && !std::exchange(times.told, true))
      logs.Append(fn, "invoker",
                  absl::StrFormat("silt: this container boots in %.0f ms and "
                                  "restores in %.0f ms here: its instances "
                                  "boot",
                                  times.boot_ms, times.restore_ms));
  }
  inst.container = ContainerLease(*runtime, inst.id);
  logs.Append(fn, inst.id,
              absl::StrCat("silt: container ",
                           l.restore_from.empty() ? "started" : "restored",
                           " (", running->phases, ")"));
  if (snapshots && !images->Has(version) && l.restore_from.empty())
    CheckpointContainer(spec, **runtime, inst.id, running->image_digest);
  sb->netns = running->netns;
  return absl::OkStatus();
}

void Invoker::Impl::CheckpointContainer(const FunctionSpec& spec,
                                        ContainerRuntime& runtime,
                                        const std::string& id,
                                        const std::string& image_digest) {
  const std::string version = SnapshotIdOf(spec);
  const std::string fn = Key(spec.namespace_(), spec.name());
  auto start = Clock::now();
  std::string tmp = images->Aside("tmp", version);
  absl::Status s = runtime.Checkpoint(id, tmp);
  const double ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (s.ok()) {
    snapshot::Manifest m;
    m.id = version;
    m.function = spec.name();
    m.ns = spec.namespace_();
    m.generation = spec.generation();
    m.bundle_digest = image_digest;
    m.kind = "container";
    m.kernel = snapshot::KernelRelease();
    m.criu_version = criu_version;
    m.created_unix = WallNanos() / 1000000000;
    m.checkpoint_ms = ms;
    s = snapshot::Seal(tmp, images->Dir(version), &m);
    if (s.ok()) images->Add(m);
  }
  std::error_code ec;
  if (!s.ok()) std::filesystem::remove_all(tmp, ec);
  if (s.ok())
    logs.Append(fn, id,
                absl::StrFormat("silt: container checkpointed in %.1f ms", ms));
  else if (!absl::IsAlreadyExists(s))
    logs.Append(
        fn, id,
        absl::StrCat("silt: no checkpoint of the container: ", s.message()));
}

void Invoker::Impl::ImageReplaced(const std::string& name) {
  std::vector<std::pair<std::string, std::string>> drop;  // function, image
  {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& [key, pool] : pools) {
      auto image = containerd::NormalizeImageName(pool->spec.container_image());
      if (image.ok() && *image == name && images->Has(pool->snapshot_id))
        drop.emplace_back(key, pool->snapshot_id);
    }
  }
  const std::string why = absl::StrCat("image ", name, " was imported again");
  for (const auto& [fn, id] : drop) {
    logs.Append(fn, "invoker",
                absl::StrCat("silt: ", why, ": its checkpoint goes"));
    DropImage(id, why);
  }
}

void Invoker::Impl::TendStagedContainers() {
  if (!snapshots_on || options.resident_memory_bytes == 0 ||
      container_images == nullptr)
    return;
  std::vector<std::shared_ptr<Pool>> candidates;
  {
    std::lock_guard<std::mutex> l(mu);
    auto now = Clock::now();
    for (auto& [key, pool] : pools)
      if (pool->bundle->manifest.kind == "container" && !pool->staged &&
          !pool->staging && SnapshotsWanted(pool->spec) &&
          now >= pool->staging_retry_after)
        candidates.push_back(pool);
  }
  // The most recently started function's first, one per pass (a restore
  // each): the next pass comes at once.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) {
                     return a->last_start > b->last_start;
                   });
  std::shared_ptr<Pool> chosen;
  for (auto& pool : candidates) {
    // Until it is measured, it holds about what its checkpoint does.
    std::vector<std::shared_ptr<Template>> dropped;
    std::lock_guard<std::mutex> l(mu);
    if (pool->staged || pool->staging || !images->Has(pool->snapshot_id))
      continue;  // (none yet on this node)
    pool->staged_estimate = images->Bytes(pool->snapshot_id);
    if (!MakeRoomLocked(pool.get(),
                        HeldBytesLocked(*pool, ResidentKind::kStaged),
                        &dropped))
      continue;
    pool->staging = true;
    chosen = pool;
    break;
  }
  if (chosen == nullptr) return;
  const std::string fn = Key(chosen->spec.namespace_(), chosen->spec.name());
  auto start = Clock::now();
  auto inst = StartInstance(chosen->spec, *chosen->bundle,
                            /*snapshot_ready=*/false, ColdStart::kCriu);
  absl::Status s = inst.status();
  const double ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::unique_ptr<Instance> late;  // stopped after the lock goes
  const bool stopping = Stopping();
  {
    std::lock_guard<std::mutex> l(mu);
    chosen->staging = false;
    auto it = pools.find(fn);
    // Frozen under the lock: what a cold start finds staged is frozen, and
    // it finds whatever is frozen (TakeStaged thaws it).
    // (Not one restored from an image dropped meanwhile: damaged, or of
    // an image imported again.)
    const bool current = it != pools.end() && it->second == chosen &&
                         !stopping && images->Has(chosen->snapshot_id);
    if (s.ok() && current) s = (*inst)->container.Freeze(true);
    if (!s.ok()) {
      chosen->staging_retry_after = Clock::now() + std::chrono::seconds(30);
      if (inst.ok()) late = *std::move(inst);
    } else if (!current) {
      late = *std::move(inst);  // removed or changed meanwhile
    } else {
      chosen->staged = *std::move(inst);
    }
  }
  if (!s.ok()) {
    // Never the same broken checkpoint twice: the next boot takes another.
    logs.Append(fn, "invoker",
                absl::StrCat("silt: no instance staged (", s.message(),
                             "); dropping the checkpoint"));
    DropImage(chosen->snapshot_id, std::string(s.message()));
  } else if (late == nullptr) {
    logs.Append(fn, "invoker",
                absl::StrFormat("silt: next instance staged (restored from "
                                "the checkpoint in %.0f ms, frozen)",
                                ms));
  }
  KickTender();  // the next function's
}

std::unique_ptr<Instance> Invoker::Impl::TakeStaged(Pool& pool) {
  auto start = Clock::now();
  std::unique_ptr<Instance> inst;
  {
    std::lock_guard<std::mutex> l(mu);
    inst = std::move(pool.staged);
  }
  if (inst == nullptr) return nullptr;
  KickTender();  // the next one
  absl::Status s = inst->container.Freeze(false);
  if (s.ok() && !Alive(inst->proc->pid()))
    s = absl::UnavailableError("its worker ended");
  if (s.ok() && inst->container.Pids().empty())
    s = absl::UnavailableError("its container has no process left");
  if (!s.ok()) {
    logs.Append(
        Key(pool.spec.namespace_(), pool.spec.name()), inst->id,
        absl::StrCat("silt: the staged instance is gone (", s.message(), ")"));
    std::lock_guard<std::mutex> l(mu);
    graveyard.push_back(std::move(inst));
    return nullptr;
  }
  inst->tier = call_wire::StartTier::kRestore;
  inst->start_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  inst->last_used = Clock::now();
  return inst;
}

}  // namespace silt::invoker
