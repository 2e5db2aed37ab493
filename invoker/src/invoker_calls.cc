// The call path: pools, taking and giving back instances, running a call or
// a compute share in one, the Invoker service's logs.
#include "invoker/worker_call.h"
#include "invoker_impl.h"

namespace silt::invoker {

auto Invoker::Impl::PoolFor(const FunctionSpec& spec,
                            std::shared_ptr<const Bundle> bundle)
    -> std::shared_ptr<Pool> {
  std::shared_ptr<Pool> old;  // replaced: its instances stop off the lock
  std::lock_guard<std::mutex> l(mu);
  auto& p = pools[Key(spec.namespace_(), spec.name())];
  if (!p || p->spec.generation() != spec.generation()) {
    auto fresh = std::make_shared<Pool>();
    fresh->spec = spec;
    fresh->snapshot_id = SnapshotIdOf(spec);
    // A container's state is not the worker's: never checkpointed or forked.
    const bool container = bundle->manifest.kind == "container";
    fresh->snapshot_wanted =
        snapshots_on && SnapshotsWanted(spec) && !container;
    fresh->forkable =
        !(bundle->manifest.kind == "exec" && bundle->manifest.mode == "http") &&
        !container;
    fresh->bundle = std::move(bundle);
    if (p) fresh->min_instances = p->min_instances;
    old = std::move(p);
    p = fresh;  // the old pool's instances stop as their calls end
  }
  return p;
}

int Invoker::Impl::MaxInstances(const FunctionSpec& spec) {
  int max = options.max_instances_per_function;
  if (auto it = spec.labels().find("com.openfaas.scale.max");
      it != spec.labels().end()) {
    int v = 0;
    if (absl::SimpleAtoi(it->second, &v) && v > 0) max = std::min(max, v);
  }
  return max;
}

Instance* Invoker::Impl::OpenLocked(Pool& pool) {
  Instance* best = nullptr;
  for (const auto& inst : pool.sharing) {
    if (inst->retired || inst->calls >= static_cast<int>(inst->concurrency))
      continue;
    if (best == nullptr || inst->calls > best->calls) best = inst.get();
  }
  return best;
}

Lease Invoker::Impl::LeaseLocked(Pool& pool, std::unique_ptr<Instance> inst) {
  ++pool.busy;
  if (inst->concurrency <= 1) return Lease{.own = std::move(inst)};
  inst->calls = 1;
  Instance* shared = inst.get();
  pool.sharing.push_back(std::move(inst));
  return Lease{.shared = shared};
}

absl::StatusOr<Lease> Invoker::Impl::Acquire(std::shared_ptr<Pool> pool_ptr,
                                             Clock::time_point deadline,
                                             call_wire::StartTier* tier,
                                             int headroom) {
  Pool& pool = *pool_ptr;
  std::unique_lock<std::mutex> l(mu);
  bool recalled = false;
  while (true) {
    if (Instance* open = OpenLocked(pool)) {
      ++open->calls;
      *tier = call_wire::StartTier::kWarm;
      return Lease{.shared = open};
    }
    if (!pool.idle.empty()) {
      auto inst = std::move(pool.idle.back());
      pool.idle.pop_back();
      *tier = call_wire::StartTier::kWarm;
      Lease lease = LeaseLocked(pool, std::move(inst));
      // Calls queued meanwhile (say, while it was checkpointed) may share
      // it: a Release wakes only one of them.
      if (lease.shared && pool.waiting > 0) pool.cv.notify_all();
      return lease;
    }
    int total = pool.busy + pool.starting + static_cast<int>(pool.idle.size());
    // Start an instance for this call unless one that the pool is filling in
    // (for its minimum) will be free for it.
    if (total < MaxInstances(pool.spec) + headroom &&
        pool.filling <= pool.waiting) {
      ++pool.starting;
      l.unlock();
      auto inst = StartFresh(pool_ptr);
      l.lock();
      --pool.starting;
      if (!inst.ok()) {
        pool.cv.notify_all();
        return inst.status();
      }
      *tier = (*inst)->tier;
      Lease lease = LeaseLocked(pool, *std::move(inst));
      // The calls that waited may share it.
      if (lease.shared) pool.cv.notify_all();
      return lease;
    }
    // An instance lent to the gateway comes back for this call (once: the
    // next waiter recalls the next one).
    if (!recalled && RecallOneLocked(pool, l)) {
      recalled = true;
      continue;
    }
    if (pool.waiting >= options.max_queue_per_function) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "function ", pool.spec.name(), " is at capacity: ", pool.busy,
          " instances busy and ", pool.waiting, " calls queued"));
    }
    ++pool.waiting;
    bool ok = pool.cv.wait_until(l, deadline, [&] {
      return !pool.idle.empty() || OpenLocked(pool) != nullptr ||
             (pool.busy + pool.starting + static_cast<int>(pool.idle.size()) <
                  MaxInstances(pool.spec) + headroom &&
              pool.filling < pool.waiting);
    });
    --pool.waiting;
    if (!ok)
      return absl::DeadlineExceededError(
          "timed out waiting for a free instance");
  }
}

void Invoker::Impl::Release(Pool& pool, Lease lease, bool keep,
                            control::InstanceCount* count) {
  std::unique_ptr<Instance> doomed;  // stops after the lock is let go
  {
    std::lock_guard<std::mutex> l(mu);
    std::unique_ptr<Instance> back;
    if (Instance* shared = lease.shared) {
      if (!keep) shared->retired = true;
      if (--shared->calls == 0) {
        auto it = std::find_if(
            pool.sharing.begin(), pool.sharing.end(),
            [shared](const auto& inst) { return inst.get() == shared; });
        back = std::move(*it);
        pool.sharing.erase(it);
        --pool.busy;
        keep = !back->retired;
      }
    } else {
      back = std::move(lease.own);
      --pool.busy;
    }
    if (back && keep) {
      back->last_used = Clock::now();
      pool.idle.push_back(std::move(back));
    } else {
      doomed = std::move(back);
    }
    if (count) *count = CountLocked(pool);
    pool.cv.notify_one();
  }
}

std::chrono::milliseconds Invoker::Impl::Timeout(const FunctionSpec& spec,
                                                 uint64_t requested_ms) {
  std::chrono::milliseconds t = requested_ms > 0
                                    ? std::chrono::milliseconds(requested_ms)
                                    : std::chrono::milliseconds(60000);
  if (auto it = spec.env().find("exec_timeout"); it != spec.env().end()) {
    if (auto d = ParseDuration(it->second); d && d->count() > 0)
      t = std::min(t, *d);
  }
  return t;
}

namespace {

// Sends the rest of a call's body to its instance as it arrives, one
// WORKER_OP_BODY frame per part. A body that breaks off ends the call as
// one whose caller went away.
template <typename Send>
absl::Status SendBody(RequestBody& body, uint64_t seq, const Send& send) {
  v1::WorkerCall part;
  part.set_op(v1::WORKER_OP_BODY);
  part.set_seq(seq);
  bool last = false;
  while (!last) {
    std::string_view bytes;
    if (absl::Status s = body.Next(&bytes, &last); !s.ok())
      return absl::CancelledError(s.message());
    part.set_body(bytes.data(), bytes.size());
    part.set_body_follows(!last);
    if (absl::Status s = send(part); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Invoker::Impl::CallInstance(
    Pool& pool, Instance& inst, v1::WorkerCall& call,
    Clock::time_point deadline, const char* role, v1::WorkerReply* reply,
    Death* why, const Parts& parts, int watch, RequestBody* body) {
  // A cold start may have used up the call's time: the call still goes
  // out, with 1 ms, and the read waits 100 ms more at most (ReadFrame
  // waits forever on a negative timeout: the call would run to its end).
  auto Left = [deadline] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - Clock::now()));
  };
  call.set_timeout_ms(static_cast<uint64_t>(Left().count()));
  // One of the calls of an instance that takes several at once gets its
  // frames through the mux; otherwise the channel is the call's alone.
  const uint64_t seq = inst.mux ? inst.mux->Begin() : 0;
  auto next_frame = [&](bool streaming) {
    const int caller = streaming ? watch : -1;
    const auto wait = Left() + std::chrono::milliseconds(100);
    if (inst.mux)
      return inst.mux->Next(seq, reply, Clock::now() + wait, caller);
    absl::Status s = absl::OkStatus();
    if (caller >= 0) s = AwaitFrame(inst.channel, caller, wait);
    return s.ok() ? ReadFrame(inst.channel, reply, wait) : s;
  };
  auto send = [&](v1::WorkerCall& frame) {
    return inst.mux ? inst.mux->Send(seq, frame)
                    : WriteFrame(inst.channel, frame);
  };
  call.set_body_follows(body != nullptr && !body->done());
  absl::Status s = send(call);
  if (s.ok() && call.body_follows()) s = SendBody(*body, seq, send);
  for (bool streaming = false; s.ok(); streaming = true) {
    s = next_frame(streaming);
    if (!s.ok() || !reply->more()) break;
    if (!parts || !parts(*reply))
      s = absl::CancelledError("the caller went away mid-stream");
  }
  if (inst.mux) inst.mux->End(seq);
  if (s.ok()) {
    // The instance lives, but the OOM killer may have ended one of its
    // processes (a classic fprocess): the failed call says why.
    if (reply->status() >= 500 && inst.proc &&
        inst.proc->cgroup().NewOomKills() > 0) {
      std::string oom =
          "a process was killed: out of memory (memory limit reached)";
      reply->set_body(absl::StrCat(reply->body(), "silt: ", oom, "\n"));
      logs.Append(Key(pool.spec.namespace_(), pool.spec.name()), inst.id,
                  absl::StrCat("silt: instance ", inst.id, " ", role, oom));
    }
    return s;
  }
  // One that takes several calls at once is not killed for one of them: it
  // takes no more and stops when the others end.
  const char* others =
      inst.mux ? ": it takes no more calls and stops when its others end" : "";
  std::string log;
  if (absl::IsDeadlineExceeded(s)) {
    *why = Death{.text = "timed out"};
    log = absl::StrCat(why->text, inst.mux ? " (a call of it)" : "", others);
  } else if (absl::IsCancelled(s)) {
    *why = Death{.kind = call_wire::Failure::kNone,
                 .text = inst.mux ? "lost a caller mid-stream"
                                  : "ended: its caller went away mid-stream"};
    log = absl::StrCat(why->text, others);
  } else {
    std::lock_guard<std::mutex> l(inst.death_mu);
    *why = DeathReason(inst);
    log = why->text;
  }
  logs.Append(Key(pool.spec.namespace_(), pool.spec.name()), inst.id,
              absl::StrCat("silt: instance ", inst.id, " ", role, log));
  return s;
}

void Invoker::Impl::Call(call_wire::Request& req, RequestBody* body,
                         call_wire::Reply* res, ReplyStream& stream) {
  using call_wire::Outcome;
  auto fail = [res](const absl::Status& s) {
    res->outcome = Outcome::kError;
    res->error_code = static_cast<uint8_t>(s.code());
    res->error = std::string(s.message());
  };
  std::shared_ptr<Pool> pool;
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = pools.find(Key(req.ns, req.name));
    if (it != pools.end() && it->second->spec.generation() == req.generation)
      pool = it->second;
  }
  if (!pool) {
    FunctionSpec spec;
    if (req.spec.empty() || !spec.ParseFromString(req.spec) ||
        spec.generation() != req.generation) {
      res->outcome = Outcome::kNeedSpec;
      return;
    }
    auto bundle = BundleFor(spec);
    if (!bundle.ok()) return fail(bundle.status());
    pool = PoolFor(spec, *bundle);
  }
  auto timeout = Timeout(pool->spec, req.timeout_ms);
  auto deadline = Clock::now() + timeout;
  call_wire::StartTier tier;
  const ColdStart force = req.cold_start;
  Lease inst;
  if (force != ColdStart::kAny) {
    // A forced start serves this call alone.
    auto fresh = StartFresh(pool, force);
    if (!fresh.ok()) return fail(fresh.status());
    tier = (*fresh)->tier;
    std::lock_guard<std::mutex> l(mu);
    ++pool->busy;
    inst.own = *std::move(fresh);
  } else {
    auto taken = Acquire(pool, deadline, &tier);
    if (!taken.ok()) return fail(taken.status());
    inst = *std::move(taken);
  }

  v1::WorkerCall call = TakeWorkerCall(req);
  v1::WorkerReply reply;
  Death why;
  res->tier = tier;
  res->instance = inst->id;
  if (tier != call_wire::StartTier::kWarm)
    res->start_us = static_cast<uint32_t>(inst->start_ms * 1000);
  auto parts = [&stream, res](v1::WorkerReply& part) {
    if (stream.started()) return stream.Part(part.body());
    call_wire::Reply head;
    head.status = static_cast<uint16_t>(part.status());
    for (auto& h : *part.mutable_headers())
      head.headers.emplace_back(std::move(*h.mutable_name()),
                                std::move(*h.mutable_value()));
    head.body = std::move(*part.mutable_body());
    head.tier = res->tier;
    head.start_us = res->start_us;
    head.instance = res->instance;
    return stream.Head(head);
  };
  absl::Status s = CallInstance(*pool, *inst, call, deadline, "", &reply, &why,
                                parts, stream.fd(), body);
  if (!s.ok()) Release(*pool, std::move(inst), /*keep=*/false);
  if (s.ok() && stream.started() && !reply.error().empty()) {
    // The handler failed after its head was out: the body breaks off.
    logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), res->instance,
                absl::StrCat("silt: the streamed response of call ",
                             call.call_id(), " broke off: ", reply.error()));
    fail(absl::InternalError(reply.error()));
    reply.clear_body();
  } else if (!s.ok()) {
    if (absl::IsDeadlineExceeded(s))
      return fail(absl::DeadlineExceededError(absl::StrCat(
          "function ", req.name, " timed out after ", timeout.count(), " ms")));
    res->failure = why.kind;
    if (stream.started())  // the body breaks off
      return fail(absl::AbortedError(absl::StrCat(
          "function ", req.name, " instance ", res->instance, " ", why.text)));
    res->status = 502;
    res->body = absl::StrCat("function ", req.name, " instance ", res->instance,
                             " ", why.text, "\n");
    res->headers.emplace_back("Content-Type", "text/plain; charset=utf-8");
    return;
  }
  if (!stream.started()) {
    res->status = static_cast<uint16_t>(reply.status());
    res->headers.reserve(reply.headers_size());
    for (auto& h : *reply.mutable_headers())
      res->headers.emplace_back(std::move(*h.mutable_name()),
                                std::move(*h.mutable_value()));
  }
  res->body = std::move(*reply.mutable_body());
  if (reply.instance_lost()) {
    // Its container or server is gone (or going): the call says why, the
    // instance is replaced.
    std::string why = inst->container.held() ? inst->container.WhyLost()
                                             : "its function server exited";
    logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), res->instance,
                absl::StrCat("silt: instance lost: ", why));
    if (!stream.started())
      res->body = absl::StrCat("function ", req.name, " instance ",
                               res->instance, ": ", why, ": ", res->body);
    if (inst.own) {
      // Torn down by the reaper, after the answer is out.
      {
        std::lock_guard<std::mutex> l(mu);
        graveyard.push_back(std::move(inst.own));
      }
      Release(*pool, Lease{}, /*keep=*/false);
    } else {
      Release(*pool, std::move(inst), /*keep=*/false);
    }
    return;
  }
  // The first call after a lazy restore records what it touched: the
  // instance's first call to end, when it takes several at once.
  std::string record;
  if (inst.own) {
    inst->fresh = false;
    record = std::exchange(inst->record_working_set, "");
  } else {
    std::lock_guard<std::mutex> l(mu);
    record = std::exchange(inst->record_working_set, "");
  }
  if (!record.empty()) RecordWorkingSet(record, inst->proc->pid());
  control::InstanceCount count;
  if (force != ColdStart::kAny) {
    // A forced start serves one call; the reaper tears the instance down
    // after the answer is out.
    {
      std::lock_guard<std::mutex> l(mu);
      graveyard.push_back(std::move(inst.own));
    }
    Release(*pool, Lease{}, /*keep=*/false, &count);
  } else {
    Release(*pool, std::move(inst), /*keep=*/true, &count);
  }
  res->ready = count.ready();
  res->busy = count.busy();
}

std::string Invoker::Impl::RunTask(const TaskTarget& t,
                                   std::string_view task_call) {
  std::shared_ptr<Pool> pool;
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = pools.find(Key(t.ns, t.function));
    if (it != pools.end() &&
        (t.generation == 0 || it->second->spec.generation() == t.generation))
      pool = it->second;
  }
  if (!pool)
    return Error(wire::StateCode::kRetry,
                 absl::StrCat("function ", t.function, " (version ",
                              t.generation, ") is not on node ", node_name));
  auto timeout = std::chrono::milliseconds(t.timeout_ms);
  auto deadline = Clock::now() + timeout;
  call_wire::StartTier tier;
  int headroom = static_cast<int>(std::max(1u, Cores()));
  auto taken = Acquire(pool, deadline, &tier, headroom);
  if (!taken.ok())
    return Error(absl::IsResourceExhausted(taken.status())
                     ? wire::StateCode::kRetry
                     : CodeOf(taken.status()),
                 taken.status().message());
  Lease inst = *std::move(taken);
  v1::WorkerCall call;
  call.set_op(v1::WORKER_OP_TASK);
  call.set_call_id(absl::StrCat("task-", RandomId(8)));
  call.set_body(std::string(task_call));
  {
    std::lock_guard<std::mutex> l(mu);
    task_channels.insert(inst->channel);
    ++tasks_running;
    tasks_peak_pulse = std::max(tasks_peak_pulse, tasks_running);
    tasks_peak_report = std::max(tasks_peak_report, tasks_running);
  }
  v1::WorkerReply reply;
  Death why;
  absl::Status s = CallInstance(*pool, *inst, call, deadline,
                                "(a compute proclet) ", &reply, &why);
  {
    std::lock_guard<std::mutex> l(mu);
    task_channels.erase(task_channels.find(inst->channel));
    --tasks_running;
  }
  if (!s.ok()) {
    std::string id = inst->id;
    Release(*pool, std::move(inst), /*keep=*/false);
    if (absl::IsDeadlineExceeded(s))
      return Error(
          wire::StateCode::kTimeout,
          absl::StrCat("its share took longer than ", timeout.count(), " ms"));
    return Error(wire::StateCode::kInternal,
                 absl::StrCat("instance ", id, " ", why.text));
  }
  if (inst.own) inst->fresh = false;
  Release(*pool, std::move(inst), /*keep=*/true);
  if (reply.body().empty())
    return Error(wire::StateCode::kInternal, "empty task reply");
  return std::move(*reply.mutable_body());
}

uint32_t Invoker::Impl::Cores() const {
  return options.cpus > 0 ? options.cpus : std::thread::hardware_concurrency();
}

TaskTarget Invoker::Impl::TargetOf(const std::string& ns,
                                   const std::string& function) {
  TaskTarget t;
  t.ns = ns;
  t.function = function;
  std::lock_guard<std::mutex> l(mu);
  auto it = pools.find(Key(ns, function));
  if (it != pools.end()) {
    t.generation = it->second->spec.generation();
    t.timeout_ms = static_cast<uint32_t>(Timeout(it->second->spec, 0).count());
  }
  return t;
}

void Invoker::Impl::SetCluster(const control::ClusterView& v) {
  ClusterView::Nodes nodes;
  for (const auto& n : v.nodes())
    nodes.push_back({n.name(), n.data_address(), n.cores(), n.cpu_used(),
                     n.draining(), n.tasks(), n.hot()});
  cluster.Set(std::move(nodes));
}

grpc::Status Invoker::Impl::Logs(grpc::ServerContext* ctx,
                                 const v1::LogsRequest* req,
                                 grpc::ServerWriter<v1::LogEntry>* writer) {
  logs.Read(
      Key(req->namespace_(), req->name()), req->since_unix_nanos(), req->tail(),
      req->follow(),
      [&](const LogLine& line) {
        v1::LogEntry e;
        e.set_name(req->name());
        e.set_namespace_(req->namespace_());
        e.set_instance(line.instance);
        e.set_timestamp_unix_nanos(line.ts);
        e.set_text(line.text);
        return writer->Write(e);
      },
      [&] { return ctx->IsCancelled() || Stopping(); });
  return grpc::Status::OK;
}

}  // namespace silt::invoker
