// Leases: warm instances lent to a gateway on this machine, which calls them
// itself (invoker/call_wire.h, "Leases"; the transport is lease_port.h). A
// lent instance is one of its pool's busy ones until it comes back.
#include "invoker_impl.h"

namespace silt::invoker {

namespace {

// What may be lent: one call at a time, nothing to do after its calls (no
// working set to record), not a container's (its worker's replies need the
// container's state read).
bool Lendable(const Instance& inst) {
  return inst.concurrency <= 1 && !inst.mux && !inst.container.held() &&
         inst.proc && inst.record_working_set.empty();
}

}  // namespace

std::optional<LeasePort::Lent> Invoker::Impl::Lend(
    uint64_t conn, const call_wire::LeaseAsk& ask) {
  if (Stopping()) return std::nullopt;
  std::lock_guard<std::mutex> l(mu);
  auto it = pools.find(Key(ask.ns, ask.name));
  if (it == pools.end() || it->second->spec.generation() != ask.generation)
    return std::nullopt;
  std::shared_ptr<Pool> pool = it->second;
  // Calls waiting here come first.
  if (pool->waiting > 0) return std::nullopt;
  // The most recently used first (its pages are the warmest).
  auto idle = std::find_if(
      pool->idle.rbegin(), pool->idle.rend(),
      [](const std::unique_ptr<Instance>& inst) { return Lendable(*inst); });
  if (idle == pool->idle.rend()) return std::nullopt;
  std::unique_ptr<Instance> inst = std::move(*idle);
  pool->idle.erase(std::next(idle).base());
  LeasePort::Lent out{
      .lease = next_lease++,
      .instance = inst->id,
      .channel = inst->channel,
      // The function's exec_timeout, or the most there is.
      .timeout_ms = static_cast<uint32_t>(std::min<int64_t>(
          Timeout(pool->spec, UINT32_MAX).count(), UINT32_MAX))};
  Lease lease = LeaseLocked(*pool, std::move(inst));
  ++pool->lent;
  lent[out.lease] = LentInstance{
      .conn = conn, .pool = std::move(pool), .lease = std::move(lease)};
  return out;
}

call_wire::Returned Invoker::Impl::TakeBack(uint64_t conn,
                                            const call_wire::Return& ret) {
  using call_wire::ReturnHow;
  call_wire::Returned out;
  LentInstance back;
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = lent.find(ret.lease);
    if (it == lent.end() || it->second.conn != conn) {
      out.failure = call_wire::Failure::kCrash;
      out.text = "ended: its lease was not the gateway's";
      return out;
    }
    if (ret.how == ReturnHow::kCheck) {
      // Still lent: only this connection's thread gives it back meanwhile.
      Instance& inst = *it->second.lease;
      if (inst.proc->cgroup().NewOomKills() > 0) {
        out.text = "a process was killed: out of memory (memory limit reached)";
        logs.Append(Key(it->second.pool->spec.namespace_(),
                        it->second.pool->spec.name()),
                    inst.id,
                    absl::StrCat("silt: instance ", inst.id, " ", out.text));
      }
      return out;
    }
    back = std::move(it->second);
    lent.erase(it);
    --back.pool->lent;
  }
  lent_cv.notify_all();
  Pool& pool = *back.pool;
  Instance& inst = *back.lease;
  const std::string key = Key(pool.spec.namespace_(), pool.spec.name());
  switch (ret.how) {
    case ReturnHow::kIdle:
    case ReturnHow::kCheck: {
      // The gateway's event loop made the channel non-blocking (a flag of
      // the file both descriptors share); this side's frames block.
      int flags = fcntl(inst.channel, F_GETFL);
      if (flags >= 0 && (flags & O_NONBLOCK) != 0)
        fcntl(inst.channel, F_SETFL, flags & ~O_NONBLOCK);
      Release(pool, std::move(back.lease), /*keep=*/true);
      return out;
    }
    case ReturnHow::kBroken: {
      Death why;
      {
        std::lock_guard<std::mutex> l(inst.death_mu);
        why = DeathReason(inst);
      }
      out.failure = why.kind;
      out.text = why.text;
      break;
    }
    case ReturnHow::kTimedOut:
      out.text = "timed out";
      break;
    case ReturnHow::kCallerGone:
      out.text = "ended: its caller went away mid-stream";
      break;
    case ReturnHow::kLost:
      out.text = "its function server exited";
      logs.Append(key, inst.id,
                  absl::StrCat("silt: instance lost: ", out.text));
      Release(pool, std::move(back.lease), /*keep=*/false);
      return out;
  }
  logs.Append(key, inst.id,
              absl::StrCat("silt: instance ", inst.id, " ", out.text));
  Release(pool, std::move(back.lease), /*keep=*/false);
  return out;
}

void Invoker::Impl::LeasesClosed(uint64_t conn) {
  std::vector<LentInstance> back;
  {
    std::lock_guard<std::mutex> l(mu);
    for (auto it = lent.begin(); it != lent.end();) {
      if (it->second.conn != conn) {
        ++it;
        continue;
      }
      --it->second.pool->lent;
      back.push_back(std::move(it->second));
      it = lent.erase(it);
    }
  }
  lent_cv.notify_all();
  for (auto& b : back) {
    logs.Append(Key(b.pool->spec.namespace_(), b.pool->spec.name()),
                b.lease->id,
                absl::StrCat("silt: instance ", b.lease->id,
                             " stopped: the gateway that held it went away"));
    Release(*b.pool, std::move(b.lease), /*keep=*/false);
  }
}

void Invoker::Impl::RecallLeases(std::chrono::milliseconds wait) {
  if (!lease_port) return;
  std::vector<std::pair<uint64_t, uint64_t>> recalls;  // conn, lease
  std::unique_lock<std::mutex> l(mu);
  for (auto& [id, li] : lent) {
    if (li.recalled) continue;
    li.recalled = true;
    recalls.emplace_back(li.conn, id);
  }
  l.unlock();
  for (auto [conn, lease] : recalls) lease_port->Recall(conn, lease);
  l.lock();
  lent_cv.wait_for(l, wait, [this] { return lent.empty(); });
}

bool Invoker::Impl::RecallOneLocked(Pool& pool,
                                    std::unique_lock<std::mutex>& l) {
  if (pool.lent == 0 || !lease_port) return false;
  for (auto& [id, li] : lent) {
    if (li.pool.get() != &pool || li.recalled) continue;
    li.recalled = true;
    const uint64_t conn = li.conn, lease = id;
    l.unlock();
    lease_port->Recall(conn, lease);
    l.lock();
    return true;
  }
  return false;
}

}  // namespace silt::invoker
