// Cold starts: which tier starts an instance, booting and checkpointing a
// first one, and what is held resident ahead of starts (resident_budget.h).
#include "invoker_impl.h"

namespace silt::invoker {

uint64_t Invoker::Impl::HeldBytesLocked(const Pool& pool, ResidentKind kind) {
  if (kind == ResidentKind::kRestorer)
    return RestorerBytesLocked(pool, pool.restorer_populated);
  if (kind == ResidentKind::kStaged)
    return pool.staged_bytes > 0 ? pool.staged_bytes : pool.staged_estimate;
  return pool.template_bytes > 0 ? pool.template_bytes : ImageBytesLocked(pool);
}

uint64_t Invoker::Impl::ImageBytesLocked(const Pool& pool) {
  return images->Bytes(pool.snapshot_id);
}

uint64_t Invoker::Impl::RestorerBytesLocked(const Pool& pool, bool populated) {
  uint64_t measured =
      populated ? pool.restorer_bytes : pool.light_restorer_bytes;
  if (measured > 0) return measured;
  return populated ? ImageBytesLocked(pool) : kMappedRestorerBytes;
}

void Invoker::Impl::MeasureResident() {
  struct Probe {
    std::shared_ptr<Pool> pool;
    ResidentKind kind;
    pid_t pid;
    bool populated = false;  // a restorer: as it was when probed
    // A staged instance: its container (read off the lock), as well as its
    // worker.
    const Instance* staged = nullptr;
    std::string container;
    uint64_t bytes = 0;
  };
  std::vector<Probe> probes;
  {
    std::lock_guard<std::mutex> l(mu);
    for (auto& [key, pool] : pools) {
      if (pool->restorer)
        probes.push_back({pool, ResidentKind::kRestorer,
                          pool->restorer->proc->pid(),
                          pool->restorer_populated});
      if (pool->tmpl)
        probes.push_back(
            {pool, ResidentKind::kTemplate, pool->tmpl->inst->proc->pid()});
      if (pool->staged)
        probes.push_back({.pool = pool,
                          .kind = ResidentKind::kStaged,
                          .pid = pool->staged->proc->pid(),
                          .staged = pool->staged.get(),
                          .container = pool->staged->id});
    }
  }
  // (Asked only with a container staged: Runtime starts containerd.)
  std::shared_ptr<ContainerRuntime> runtime;
  for (const auto& p : probes)
    if (!p.container.empty() && runtime == nullptr && container_images)
      if (auto r = container_images->Runtime(); r.ok()) runtime = *r;
  for (auto& p : probes) {
    p.bytes = ProportionalSetBytes(p.pid);
    if (!p.container.empty() && runtime != nullptr)
      for (pid_t pid : runtime->Pids(p.container))
        p.bytes += ProportionalSetBytes(pid);
  }
  std::lock_guard<std::mutex> l(mu);
  for (const auto& p : probes) {
    if (p.bytes == 0) continue;  // gone meanwhile
    if (p.kind == ResidentKind::kTemplate) {
      p.pool->template_bytes = p.bytes;
      continue;
    }
    if (p.kind == ResidentKind::kStaged) {
      if (p.pool->staged.get() == p.staged &&
          p.pool->staged->proc->pid() == p.pid)
        p.pool->staged_bytes = p.bytes;
      continue;
    }
    // Replaced, used or demoted meanwhile: not what is there now.
    const Pool& pool = *p.pool;
    if (!pool.restorer || pool.restorer->proc->pid() != p.pid ||
        pool.restorer_populated != p.populated)
      continue;
    (p.populated ? p.pool->restorer_bytes : p.pool->light_restorer_bytes) =
        p.bytes;
  }
}

auto Invoker::Impl::ResidentLocked() -> std::vector<Resident> {
  std::vector<Resident> out;
  for (auto& [key, pool] : pools) {
    if (pool->restorer)
      out.push_back({pool,
                     {ResidentKind::kRestorer,
                      HeldBytesLocked(*pool, ResidentKind::kRestorer),
                      pool->last_start}});
    if (pool->tmpl)
      out.push_back({pool,
                     {ResidentKind::kTemplate,
                      HeldBytesLocked(*pool, ResidentKind::kTemplate),
                      std::max(pool->last_start, pool->tmpl->last_used)}});
    if (pool->staged)
      out.push_back(
          {pool,
           {ResidentKind::kStaged,
            HeldBytesLocked(*pool, ResidentKind::kStaged), pool->last_start}});
  }
  return out;
}

bool Invoker::Impl::MakeRoomLocked(
    const Pool* pool, uint64_t need,
    std::vector<std::shared_ptr<Template>>* dropped) {
  std::vector<Resident> resident = ResidentLocked();
  std::vector<ResidentHolder> holders;
  for (const auto& r : resident) holders.push_back(r.holder);
  auto plan = PlanEviction(
      holders, options.resident_memory_bytes, need,
      pool != nullptr ? pool->last_start : Clock::time_point::max());
  if (!plan) return false;
  for (size_t i : *plan) {
    Pool& p = *resident[i].pool;
    const ResidentHolder& h = resident[i].holder;
    logs.Append(
        Key(p.spec.namespace_(), p.spec.name()), "invoker",
        absl::StrCat("silt: ", ResidentKindName(h.kind), " (", h.bytes >> 20,
                     " MiB) let go: the node's resident budget (",
                     options.resident_memory_bytes >> 20,
                     " MiB) went to functions started more "
                     "recently"));
    if (h.kind == ResidentKind::kRestorer) {
      if (p.restorer) graveyard.push_back(std::move(p.restorer));
    } else if (h.kind == ResidentKind::kStaged) {
      if (p.staged) graveyard.push_back(std::move(p.staged));
    } else if (p.tmpl) {
      dropped->push_back(std::move(p.tmpl));
      p.template_retry_after = Clock::now() + std::chrono::minutes(1);
    }
  }
  return true;
}

std::map<std::string, std::pair<uint64_t, bool>>
Invoker::Impl::ResidentByImageLocked() {
  std::map<std::string, std::pair<uint64_t, bool>> out;  // bytes, staged
  for (const auto& r : ResidentLocked()) {
    auto& [bytes, staged] = out[r.pool->snapshot_id];
    bytes += r.holder.bytes;
    staged |= r.holder.kind == ResidentKind::kRestorer ||
              r.holder.kind == ResidentKind::kStaged;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Instance>> Invoker::Impl::StartFresh(
    std::shared_ptr<Pool> pool, ColdStart force) {
  {
    std::lock_guard<std::mutex> l(mu);
    auto now = Clock::now();
    if (pool->restorer == nullptr && pool->last_start != Clock::time_point() &&
        now - pool->last_start < kBurstGap)
      pool->last_burst = now;
    pool->last_start = now;
  }
  if (pool->bundle->manifest.kind == "container") {
    // Its own tiers: its staged instance thawed (restore), a restore from
    // its checkpoint by runc and CRIU (criu), or a boot (StartContainer).
    if (force == ColdStart::kFork)
      return absl::FailedPreconditionError(absl::StrCat(
          "function ", pool->spec.name(),
          " is a container: its cold starts are boot, restore (its staged "
          "instance) and criu (runc's restore)"));
    if (force == ColdStart::kAny || force == ColdStart::kRestore)
      if (auto staged = TakeStaged(*pool)) return staged;
    return StartInstance(pool->spec, *pool->bundle, false, force);
  }
  if (force == ColdStart::kBoot || !pool->snapshot_wanted) {
    if (force != ColdStart::kAny && force != ColdStart::kBoot)
      return absl::FailedPreconditionError(absl::StrCat(
          "function ", pool->spec.name(), " does not use snapshots"));
    return StartInstance(pool->spec, *pool->bundle);
  }
  if (force == ColdStart::kCriu) {
    if (auto image = EnsureImage(*pool); !image.ok()) return image.status();
    return RestoreInstance(*pool, /*by_criu=*/true);
  }
  // A staged restorer is the fastest start (README, Benchmarks: restore
  // beats fork at every size); the template serves starts that find none.
  std::shared_ptr<Template> t;
  bool staged = false;
  {
    std::lock_guard<std::mutex> l(mu);
    t = pool->tmpl;
    staged = pool->restorer != nullptr;
  }
  if (t == nullptr && force == ColdStart::kFork) {
    if (!pool->forkable || options.resident_memory_bytes == 0)
      return absl::FailedPreconditionError(absl::StrCat(
          "function ", pool->spec.name(), " has no fork tier here"));
    if (auto s = EnsureTemplate(pool); !s.ok()) return s;
    std::lock_guard<std::mutex> l(mu);
    t = pool->tmpl;
    if (t == nullptr)
      return absl::UnavailableError("the template was dropped; try again");
  }
  if (t != nullptr &&
      (force == ColdStart::kFork || (force == ColdStart::kAny && !staged))) {
    auto inst = ForkInstance(*pool, t);
    if (inst.ok() || force == ColdStart::kFork) return inst;
    logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), "invoker",
                absl::StrCat("silt: fork failed (", inst.status().message(),
                             "); dropping the template"));
    std::lock_guard<std::mutex> l(mu);
    if (pool->tmpl == t) pool->tmpl.reset();
  }
  auto image = EnsureImage(*pool);
  if (image.ok()) {
    auto inst = RestoreInstance(*pool);
    if (inst.ok()) {
      std::lock_guard<std::mutex> l(mu);
      if (pool->forkable) pool->template_retry_after = Clock::time_point();
      return inst;
    }
    if (force == ColdStart::kRestore) return inst.status();
    // Never the same broken image twice: boot, and snapshot again.
    logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), "invoker",
                absl::StrCat("silt: restore failed (", inst.status().message(),
                             "); booting"));
    DropImage(pool->snapshot_id, std::string(inst.status().message()));
  } else if (force == ColdStart::kRestore) {
    return image.status();
  }
  return BootAndCheckpoint(pool);
}

absl::StatusOr<std::unique_ptr<Instance>> Invoker::Impl::BootAndCheckpoint(
    std::shared_ptr<Pool> pool) {
  bool take = false;
  {
    std::lock_guard<std::mutex> l(mu);
    if (!pool->checkpointing && !images->Has(pool->snapshot_id)) {
      pool->checkpointing = true;
      take = true;
    }
  }
  auto inst = StartInstance(pool->spec, *pool->bundle, /*snapshot_ready=*/true);
  if (!take || !inst.ok()) {
    if (take) {
      std::lock_guard<std::mutex> l(mu);
      pool->checkpointing = false;
    }
    return inst;
  }
  auto start = Clock::now();
  absl::Status s = Checkpoint(*pool, **inst);
  {
    std::lock_guard<std::mutex> l(mu);
    pool->checkpointing = false;
  }
  if (!s.ok()) {
    fprintf(stderr, "silt-invoker: snapshot of %s failed: %s\n",
            pool->spec.name().c_str(), std::string(s.message()).c_str());
    logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), "invoker",
                absl::StrCat("silt: snapshot failed: ", s.message()));
    if ((*inst)->channel < 0) return s;  // it could not be resumed
  }
  (*inst)->start_ms +=
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return inst;
}

absl::Status Invoker::Impl::EnsureTemplate(std::shared_ptr<Pool> pool) {
  {
    std::unique_lock<std::mutex> l(mu);
    if (pool->template_starting) {
      pool->template_cv.wait(l, [&] { return !pool->template_starting; });
      return pool->tmpl
                 ? absl::OkStatus()
                 : absl::UnavailableError("the template could not be started");
    }
    if (pool->tmpl) return absl::OkStatus();
    pool->template_starting = true;
  }
  absl::StatusOr<std::shared_ptr<Template>> t =
      absl::UnavailableError("no image");
  if (auto image = EnsureImage(*pool); image.ok()) {
    auto inst = RestoreInstance(*pool, /*by_criu=*/false,
                                /*as_template=*/true);
    if (inst.ok())
      t = MakeTemplate(*pool, *std::move(inst));
    else
      t = inst.status();
  } else {
    t = image.status();
  }
  std::shared_ptr<Template> stale;
  absl::Status result = t.status();
  {
    std::lock_guard<std::mutex> l(mu);
    pool->template_starting = false;
    if (t.ok() && !images->Has(pool->snapshot_id)) {
      // Dropped while it started (damaged, deleted, or the function
      // changed): a template must not outlive its image.
      stale = *std::move(t);
      result = absl::NotFoundError("the image was dropped");
    } else if (!t.ok()) {
      pool->template_retry_after = Clock::now() + std::chrono::seconds(30);
    } else {
      pool->tmpl = *t;
    }
  }
  pool->template_cv.notify_all();
  return result;
}

void Invoker::Impl::TendTemplates() {
  if (!snapshots_on || options.resident_memory_bytes == 0) return;
  std::vector<std::shared_ptr<Pool>> want;
  std::vector<std::shared_ptr<Template>> evicted;
  {
    std::lock_guard<std::mutex> l(mu);
    MakeRoomLocked(nullptr, 0, &evicted);
    uint64_t admitted = 0;  // templates of this round, not resident yet
    auto now = Clock::now();
    for (auto& [key, pool] : pools) {
      if (!pool->snapshot_wanted || !pool->forkable || pool->tmpl ||
          pool->template_starting || !images->Has(pool->snapshot_id) ||
          now < pool->template_retry_after)
        continue;
      // With staged restorers, only functions that had a burst lately: a
      // template for every function started once would cost a restore
      // (and a restorer) each, and evict another's.
      if (fast_restore_on && (pool->last_burst == Clock::time_point() ||
                              now - pool->last_burst > kTemplateAfterBurst))
        continue;
      uint64_t need = HeldBytesLocked(*pool, ResidentKind::kTemplate);
      if (!MakeFullRoomLocked(*pool, admitted + need, &evicted) ||
          !MakeRoomLocked(pool.get(), admitted + need, &evicted))
        continue;
      admitted += need;
      want.push_back(pool);
    }
  }
  evicted.clear();  // (clones keep theirs alive until they end)
  for (auto& pool : want) {
    if (Stopping()) return;
    if (auto s = EnsureTemplate(pool); !s.ok())
      logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), "invoker",
                  absl::StrCat("silt: no fork template: ", s.message()));
  }
}

}  // namespace silt::invoker
