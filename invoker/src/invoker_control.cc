// The control stream to the gateway: assignments, load reports and pulses,
// filling pools to their minimum, reaping idle instances.
#include "invoker_impl.h"

namespace silt::invoker {

void Invoker::Impl::ApplyAssignment(const control::Assignment& a) {
  if (!a.data_key().empty() && proclet_host)
    proclet_host->SetDataKey(a.data_key());
  std::vector<std::pair<FunctionSpec, uint32_t>> wanted;
  // Pools no longer assigned: their instances stop (a container's through
  // containerd) after the lock goes.
  std::vector<std::shared_ptr<Pool>> gone;
  {
    std::lock_guard<std::mutex> l(mu);
    std::set<std::string> keys;
    for (const auto& spec : a.functions()) {
      std::string key = Key(spec.namespace_(), spec.name());
      keys.insert(key);
      auto it = pools.find(key);
      if (it != pools.end() &&
          it->second->spec.generation() == spec.generation()) {
        if (spec.min_instances() < it->second->min_instances)
          it->second->trim = true;
        it->second->min_instances = spec.min_instances();
      }
      wanted.emplace_back(spec, spec.min_instances());
    }
    // Functions no longer assigned here (deleted or updated): drop their idle
    // instances.
    for (auto it = pools.begin(); it != pools.end();) {
      if (!keys.contains(it->first)) {
        gone.push_back(std::move(it->second));
        it = pools.erase(it);
      } else {
        ++it;
      }
    }
    have_assignment = true;
  }
  // Snapshots of versions that no longer exist go.
  std::set<std::string> ids;
  for (const auto& spec : a.functions()) ids.insert(SnapshotIdOf(spec));
  CollectImages(ids);
  for (auto& [spec, min] : wanted) {
    auto bundle = BundleFor(spec);
    if (!bundle.ok()) {
      logs.Append(Key(spec.namespace_(), spec.name()), "invoker",
                  absl::StrCat("silt: ", bundle.status().message()));
      continue;
    }
    auto pool = PoolFor(spec, *bundle);
    std::lock_guard<std::mutex> l(mu);
    if (min < pool->min_instances) pool->trim = true;
    pool->min_instances = min;  // the reaper loop starts what is missing
  }
}

void Invoker::Impl::DeleteSnapshots(const control::DeleteSnapshots& d) {
  for (const auto& id : d.ids()) DropImage(id, "");
}

void Invoker::Impl::Fill(std::shared_ptr<Pool> pool) {
  while (!Stopping()) {
    {
      std::lock_guard<std::mutex> l(mu);
      int total =
          pool->busy + pool->starting + static_cast<int>(pool->idle.size());
      if (total >= static_cast<int>(pool->min_instances) ||
          total >= MaxInstances(pool->spec))
        return;
      ++pool->starting;
      ++pool->filling;
    }
    auto inst = StartFresh(pool);
    std::lock_guard<std::mutex> l(mu);
    --pool->starting;
    --pool->filling;
    if (!inst.ok()) {
      pool->cv.notify_all();
      logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), "invoker",
                  absl::StrCat("silt: ", inst.status().message()));
      return;
    }
    (*inst)->last_used = Clock::now();
    pool->idle.push_back(*std::move(inst));
    pool->cv.notify_one();
  }
}

std::chrono::milliseconds Invoker::Impl::IdleTimeout(const FunctionSpec& spec) {
  if (auto it = spec.labels().find("com.openfaas.scale.zero-duration");
      it != spec.labels().end())
    if (auto d = ParseDuration(it->second)) return *d;
  return options.idle_timeout;
}

void Invoker::Impl::ReapLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> l(stop_mu);
      if (stop_cv.wait_for(l, std::chrono::milliseconds(100),
                           [&] { return stopping; }))
        return;
    }
    std::vector<std::unique_ptr<Instance>> doomed;
    {
      std::lock_guard<std::mutex> l(mu);
      doomed.swap(graveyard);
      auto now = Clock::now();
      for (auto& [key, pool] : pools) {
        auto idle_for = IdleTimeout(pool->spec);
        // Oldest-idle first; keep the pool's minimum.
        std::sort(pool->idle.begin(), pool->idle.end(),
                  [](const auto& a, const auto& b) {
                    return a->last_used > b->last_used;
                  });
        while (!pool->idle.empty() &&
               pool->idle.size() + pool->busy > pool->min_instances &&
               (pool->trim || now - pool->idle.back()->last_used > idle_for)) {
          doomed.push_back(std::move(pool->idle.back()));
          pool->idle.pop_back();
        }
        pool->trim = false;
        // Idle instances that died on their own are replaced on demand.
        for (auto it = pool->idle.begin(); it != pool->idle.end();) {
          if ((*it)->proc->Poll()) {
            logs.Append(
                key, (*it)->id,
                absl::StrCat("silt: idle instance ", (*it)->id, " ended"));
            doomed.push_back(std::move(*it));
            it = pool->idle.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    doomed.clear();  // kills outside the lock
    std::vector<std::shared_ptr<Pool>> short_pools;
    {
      std::lock_guard<std::mutex> l(mu);
      for (auto& [key, pool] : pools) {
        int total =
            pool->busy + pool->starting + static_cast<int>(pool->idle.size());
        if (total < static_cast<int>(pool->min_instances))
          short_pools.push_back(pool);
      }
    }
    for (auto& pool : short_pools) Fill(pool);
    TendTemplates();
  }
}

LoadPulse::Sample Invoker::Impl::PulseSample() {
  LoadPulse::Sample s;
  s.at = Clock::now();
  s.cores = Cores();
  s.cpu_nanos = node_cgroup->CpuUsageNanos();
  // Which part of it was not Silt's matters only on a busy node: below a
  // quarter of its cores, count it all as the instances' (reading every
  // instance's cgroup each sample is most of a pulse's cost).
  double secs = std::chrono::duration<double>(s.at - last_sample.at).count();
  bool loaded =
      last_sample.at == Clock::time_point() || secs <= 0 ||
      s.cpu_nanos < last_sample.cpu_nanos ||
      (s.cpu_nanos - last_sample.cpu_nanos) / 1e9 / secs > 0.25 * s.cores;
  s.instances_cpu_nanos = loaded ? node_cgroup->InstancesCpuNanos()
                                 : last_sample.instances_cpu_nanos +
                                       (s.cpu_nanos - last_sample.cpu_nanos);
  s.instances_cpu_nanos = std::min(s.instances_cpu_nanos, s.cpu_nanos);
  s.memory = MemoryCapacity();
  s.memory_used = node_cgroup->MemoryUsageBytes() +
                  proclet_host->shard_bytes() + proclet_host->spare_bytes();
  std::lock_guard<std::mutex> l(mu);
  s.tasks = std::exchange(tasks_peak_pulse, tasks_running);
  for (const auto& [key, pool] : pools)
    s.busy += static_cast<uint32_t>(pool->busy);
  last_sample = s;
  return s;
}

uint64_t Invoker::Impl::MemoryCapacity() const {
  struct sysinfo si;
  if (options.memory_bytes > 0) return options.memory_bytes;
  if (sysinfo(&si) == 0)
    return static_cast<uint64_t>(si.totalram) * si.mem_unit;
  return 0;
}

control::InstanceCount Invoker::Impl::CountLocked(const Pool& pool) {
  control::InstanceCount c;
  c.set_name(pool.spec.name());
  c.set_namespace_(pool.spec.namespace_());
  c.set_generation(pool.spec.generation());
  c.set_ready(static_cast<uint32_t>(pool.idle.size() + pool.busy));
  c.set_busy(static_cast<uint32_t>(pool.busy));
  return c;
}

control::LoadReport Invoker::Impl::Report(uint64_t seq) {
  control::LoadReport r;
  r.set_seq(seq);
  std::lock_guard<std::mutex> l(mu);
  uint64_t mem = 0;
  for (const auto& [key, pool] : pools) {
    *r.add_instances() = CountLocked(*pool);
    for (const auto& inst : pool->idle)
      mem += inst->proc->cgroup().MemoryUsage();
  }
  for (const auto& [key, pool] : pools)
    if (pool->tmpl) mem += pool->tmpl->inst->proc->cgroup().MemoryUsage();
  uint64_t shard_bytes = 0;
  for (auto& info : proclet_host->Shards()) {
    shard_bytes += info.bytes();
    *r.add_shards() = std::move(info);
  }
  r.set_shard_bytes(shard_bytes);
  r.set_state_ops(proclet_host->ops());
  r.set_tasks(std::exchange(tasks_peak_report, tasks_running));
  {
    uint64_t cpu = node_cgroup->CpuUsageNanos();
    auto now = Clock::now();
    double secs = std::chrono::duration<double>(now - cpu_sampled).count();
    if (cpu_sampled != Clock::time_point() && secs > 0 && cpu >= cpu_nanos)
      r.set_cpu_used((cpu - cpu_nanos) / 1e9 / secs);
    cpu_nanos = cpu;
    cpu_sampled = now;
  }
  // The spare arena counts too: placement must not promise it away.
  r.mutable_used()->set_memory_bytes(mem + shard_bytes +
                                     proclet_host->spare_bytes());
  std::set<std::string> resident;
  for (const auto& [key, pool] : pools)
    if (pool->tmpl) resident.insert(pool->tmpl->snapshot_id);
  auto held = ResidentByImageLocked();
  for (const auto& m : images->List()) {
    const std::string& id = m.id;
    auto* info = r.add_snapshots();
    info->set_id(id);
    info->set_name(m.function);
    info->set_namespace_(m.ns);
    info->set_generation(m.generation);
    info->set_bytes(m.bytes);
    info->set_created_unix(m.created_unix);
    info->set_checkpoint_ms(m.checkpoint_ms);
    info->set_template_resident(resident.contains(id));
    if (auto it = held.find(id); it != held.end()) {
      info->set_resident_bytes(it->second.first);
      info->set_restorer_staged(it->second.second);
    }
  }
  return r;
}

void Invoker::Impl::ConnectLoop() {
  int backoff_ms = 100;
  while (!Stopping()) {
    grpc::ClientContext ctx;
    {
      // Under stop_mu, as is clearing it below: ~Impl cancels the context
      // it finds here, and must never find one that is being destroyed.
      std::lock_guard<std::mutex> l(stop_mu);
      if (stopping) break;
      connect_ctx = &ctx;
    }
    auto stream = control->Connect(&ctx);
    control::NodeMessage hello;
    auto* reg = hello.mutable_register_();
    reg->set_node_name(node_name);
    reg->set_address(address);
    reg->set_data_address(proclet_host->data_address());
    reg->set_call_address(call_port->address());
    reg->set_call_socket(lease_port->address());
    reg->mutable_capacity()->set_cores(Cores());
    reg->mutable_capacity()->set_gpus(gpus);
    reg->mutable_capacity()->set_gpu_memory_bytes(gpu_memory);
    reg->mutable_capacity()->set_gpu_model(gpu_model);
    reg->mutable_capacity()->set_gpu_compute_capability(gpu_compute);
    reg->mutable_capacity()->set_memory_bytes(MemoryCapacity());
    if (stream->Write(hello)) {
      backoff_ms = 100;
      container_images->ResendReport();
      std::atomic<bool> done{false};
      std::thread reader([&] {
        control::GatewayMessage msg;
        while (stream->Read(&msg)) {
          if (msg.has_assignment()) ApplyAssignment(msg.assignment());
          if (msg.has_delete_snapshots())
            DeleteSnapshots(msg.delete_snapshots());
          if (msg.has_cluster()) SetCluster(msg.cluster());
          if (msg.has_images()) container_images->Want(msg.images());
        }
        done = true;
        std::lock_guard<std::mutex> l(stop_mu);
        stop_cv.notify_all();
      });
      uint64_t seq = 0;
      // CPU use over a CFS period (100 ms): a node cgroup at its CPU quota
      // is throttled for the rest of each period, and a shorter window can
      // read no use at all there (a hot node then looked cool for a
      // moment: RebalanceTest in CI with 20 ms).
      LoadPulse pulse(options.pulse_change, std::chrono::milliseconds(100));
      auto next_report = Clock::now();
      while (!done && !Stopping()) {
        auto now = Clock::now();
        bool pulses = options.pulse_interval > std::chrono::milliseconds(0);
        bool report = now >= next_report || !pulses;
        if (report) {
          control::NodeMessage m;
          *m.mutable_report() = Report(++seq);
          // (outside Impl::mu: each proclet answers for itself)
          if (gpu_proclets)
            for (const auto& g : gpu_proclets->List()) {
              auto* out = m.mutable_report()->add_gpu_proclets();
              out->set_namespace_(g.ns);
              out->set_function(g.function);
              out->set_name(g.name);
              out->set_backend(g.backend);
              out->set_device(g.device);
              out->set_memory_used(g.memory_used);
              out->set_memory_limit(g.memory_limit);
              out->set_launches(g.launches);
              out->set_busy_ns(g.busy_ns);
            }
          next_report = now + options.report_interval;
          if (!stream->Write(m)) break;
        }
        if (auto images = container_images->TakeReport()) {
          control::NodeMessage m;
          *m.mutable_images() = *std::move(images);
          if (!stream->Write(m)) break;
        }
        if (pulses) {
          if (auto p = pulse.Next(PulseSample(), /*force=*/report)) {
            control::NodeMessage m;
            *m.mutable_pulse() = *std::move(p);
            if (!stream->Write(m)) break;
          }
        }
        auto wait = pulses ? std::min<Clock::duration>(options.pulse_interval,
                                                       next_report - now)
                           : Clock::duration(options.report_interval);
        std::unique_lock<std::mutex> l(stop_mu);
        stop_cv.wait_for(l, wait, [&] { return stopping || done.load(); });
      }
      ctx.TryCancel();
      reader.join();
    }
    grpc::Status st = stream->Finish();
    {
      std::lock_guard<std::mutex> l(stop_mu);
      connect_ctx = nullptr;
    }
    if (!Stopping()) {
      fprintf(stderr,
              "silt-invoker: connection to the gateway at %s ended (%s); "
              "retrying in %d ms\n",
              options.gateway.c_str(), st.error_message().c_str(), backoff_ms);
    }
    std::unique_lock<std::mutex> l(stop_mu);
    stop_cv.wait_for(l, std::chrono::milliseconds(backoff_ms),
                     [&] { return stopping; });
    backoff_ms = std::min(backoff_ms * 2, 2000);
  }
}

}  // namespace silt::invoker
