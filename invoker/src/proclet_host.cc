#include "proclet_host.h"

#include <cstdio>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "data_port.h"
#include "hosted_shard.h"
#include "peer_wire.h"
#include "shard_mover.h"
#include "shard_router.h"
#include "shard_table.h"
#include "silt/state_wire.h"
#include "state_loop.h"

namespace silt::invoker {

using wire::StateCode;

// The shards held here (ShardTable) are reached by this node's instances
// through the router and the state loop's fast path, by peers through the
// data port, and leave through the mover. Each of them owns its own state
// under its own lock; the host only wires them together and stops them in
// order.
struct ProcletHost::Impl {
  DataKey key;
  ShardTable shards;
  std::unique_ptr<DataPort> port;
  std::unique_ptr<ShardRouter> router;
  std::unique_ptr<ShardMover> mover;
  // Instances' state connections (see state_loop.h).
  std::unique_ptr<StateLoop> loop;

  ~Impl() {
    // No new peers (so no shard arrives from now on), then wake queue pops
    // waiting on shards here, then stop the state loop (its pool joins the
    // threads that served them).
    if (port) port->Shutdown();
    shards.Close();
    loop.reset();
    if (port) port->Join();
    // Wake queue waiters so nothing blocks on a dying host.
    shards.Clear();
  }
};

ProcletHost::ProcletHost(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcletHost::~ProcletHost() = default;

void ProcletHost::StopMoves() { impl_->mover->Stop(); }

void ProcletHost::StopPeers() {
  impl_->port->Shutdown();
  impl_->port->Join();
}

absl::StatusOr<std::unique_ptr<ProcletHost>> ProcletHost::Start(
    ProcletHostOptions options) {
  auto impl = std::make_unique<Impl>();
  auto port = DataPort::Listen(options.data_listen, impl->shards, impl->key,
                               std::move(options.run_task),
                               std::move(options.gpu_peer));
  if (!port.ok()) return port.status();
  impl->port = *std::move(port);
  const std::string& address = impl->port->address();
  impl->router = std::make_unique<ShardRouter>(
      std::move(options.resolve), address, impl->shards, impl->key);
  impl->mover = std::make_unique<ShardMover>(address, impl->shards, impl->key);
  ShardRouter* router = impl->router.get();
  const DataKey* key = &impl->key;
  StateLoopBackend backend;
  backend.fast = [router](const std::string& ns, std::string_view req) {
    return router->Fast(ns, req);
  };
  backend.slow = [router, jobs = std::move(options.jobs),
                  gpu = std::move(options.gpu)](const std::string& ns,
                                                const std::string& function,
                                                std::string_view req) {
    try {
      if (!req.empty() && req[0] == static_cast<char>(wire::StateOp::kGpu)) {
        if (!gpu)
          return Error(StateCode::kUnavailable,
                       "this node hosts no GPU proclets");
        return gpu(ns, function, req);
      }
      if (!req.empty() &&
          (req[0] == static_cast<char>(wire::StateOp::kJobStart) ||
           req[0] == static_cast<char>(wire::StateOp::kJobWait))) {
        if (!jobs)
          return Error(StateCode::kUnavailable, "this node runs no jobs");
        return jobs(ns, function, req);
      }
      return router->HandleInstance(ns, function, req);
    } catch (const std::exception& e) {  // last line of defence
      fprintf(stderr, "silt-invoker: state request of namespace %s: %s\n",
              ns.c_str(), e.what());
      return Error(StateCode::kInternal, "internal error");
    }
  };
  backend.share = [router](const std::string& ns, std::string_view req) {
    return router->Share(ns, req);
  };
  backend.final_reply = [](std::string_view reply) {
    return ShardRouter::IsFinal(reply);
  };
  backend.broken_reply = [](const std::string& peer) {
    return Error(StateCode::kUnavailable,
                 absl::StrCat("lost the connection to ", peer,
                              " during the operation (it may or may not "
                              "have been applied)"));
  };
  backend.hello = [key] { return key->Hello(); };
  backend.internal_error = [] {
    return Error(StateCode::kInternal, "internal error");
  };
  auto loop = StateLoop::Start(std::move(backend), wire::kMaxFrameBytes);
  if (!loop.ok()) return loop.status();
  impl->loop = *std::move(loop);
  impl->port->StartAccepting();
  return std::unique_ptr<ProcletHost>(new ProcletHost(std::move(impl)));
}

std::string ProcletHost::data_address() const { return impl_->port->address(); }

void ProcletHost::SetDataKey(const std::string& key) { impl_->key.Set(key); }

const DataKey& ProcletHost::data_key() const { return impl_->key; }

void ProcletHost::Attach(int fd, const std::string& ns,
                         const std::string& function) {
  impl_->loop->Attach(fd, ns, function);
}

absl::Status ProcletHost::CreateShard(const pv1::ShardInfo& info) {
  return impl_->shards.Create(info);
}

void ProcletHost::DropShards(const std::vector<uint64_t>& ids) {
  impl_->shards.Drop(ids);
}

absl::StatusOr<pv1::MigrateShardResponse> ProcletHost::Migrate(
    uint64_t id, const std::string& target,
    std::chrono::system_clock::time_point deadline) {
  auto res = impl_->mover->Migrate(id, target, deadline);
  if (res.ok()) {
    // Keep the tombstone (it answers MOVED) but forget the shard's bytes.
    fprintf(stderr,
            "silt-invoker: shard %llu moved to %s (%llu bytes, %u rounds, "
            "%.2f ms, writes held %.3f ms)\n",
            static_cast<unsigned long long>(id), target.c_str(),
            static_cast<unsigned long long>(res->bytes()), res->rounds(),
            res->total_ms(), res->pause_ms());
  }
  return res;
}

absl::StatusOr<pv1::SplitShardResponse> ProcletHost::Split(uint64_t id,
                                                           uint64_t new_id) {
  return impl_->shards.Split(id, new_id);
}

absl::StatusOr<pv1::ShardInfo> ProcletHost::Merge(uint64_t keep_id,
                                                  uint64_t absorb_id) {
  return impl_->shards.Merge(keep_id, absorb_id);
}

std::string ProcletHost::Serve(const std::string& ns,
                               const std::string& function,
                               std::string_view request) {
  return impl_->router->HandleInstance(ns, function, request);
}

std::string ProcletHost::Hello() const { return impl_->key.Hello(); }

void ProcletHost::ForgetLayout(const std::string& ns, const std::string& name) {
  impl_->router->ForgetLayout(ns, name);
}

uint64_t ProcletHost::ops() const { return impl_->shards.ops(); }

uint64_t ProcletHost::spare_bytes() const { return impl_->port->spare_bytes(); }

std::vector<pv1::ShardInfo> ProcletHost::Shards() const {
  return impl_->shards.Infos();
}

uint64_t ProcletHost::shard_bytes() const {
  uint64_t n = 0;
  for (const auto& info : impl_->shards.Infos()) n += info.bytes();
  return n;
}

}  // namespace silt::invoker
