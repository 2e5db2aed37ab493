#include "data_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "conn_server.h"
#include "frames.h"
#include "hosted_shard.h"
#include "silt/state_wire.h"

namespace silt::invoker {
namespace {

using proclets::MapShard;
using proclets::QueueShard;
using proclets::VectorShard;
using wire::StateCode;

// Takes a migrated shard. Its bytes come from a peer that proved the
// cluster's key and served them itself: only their header is checked.
absl::Status Install(ShardTable& shards, const pv1::ShardInfo& info,
                     proclets::Arena arena) {
  constexpr auto kCheck = proclets::AdoptCheck::kHeader;
  auto hs = std::make_shared<HostedShard>();
  {
    absl::MutexLock l(&hs->mu);
    hs->info = info;
    switch (info.kind()) {
      case pv1::KIND_MAP: {
        auto m = MapShard::Adopt(std::move(arena), kCheck);
        if (!m.ok()) return m.status();
        hs->map = *std::move(m);
        hs->Publish(true);  // the source froze: this copy is the one now
        break;
      }
      case pv1::KIND_VECTOR: {
        auto v = VectorShard::Adopt(std::move(arena), kCheck);
        if (!v.ok()) return v.status();
        hs->vec = *std::move(v);
        break;
      }
      case pv1::KIND_QUEUE: {
        auto q = QueueShard::Adopt(std::move(arena), kCheck);
        if (!q.ok()) return q.status();
        hs->queue = *std::move(q);
        break;
      }
      default:
        return absl::InvalidArgumentError("unknown shard kind");
    }
  }
  shards.Put(info.id(), std::move(hs));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPort>> DataPort::Listen(
    const std::string& data_listen, ShardTable& shards, const DataKey& key,
    TaskRunner run_task, GpuPeerHandlers gpu) {
  std::unique_ptr<DataPort> port(
      new DataPort(shards, key, std::move(run_task), std::move(gpu)));
  auto server = ConnServer::Listen(
      data_listen, [p = port.get()](int fd) { p->ServePeer(fd); });
  if (!server.ok()) return server.status();
  port->server_ = *std::move(server);
  return port;
}

DataPort::DataPort(ShardTable& shards, const DataKey& key, TaskRunner run_task,
                   GpuPeerHandlers gpu)
    : shards_(shards),
      key_(key),
      run_task_(std::move(run_task)),
      gpu_(std::move(gpu)) {}

DataPort::~DataPort() {
  if (!server_) return;  // Listen failed
  Shutdown();
  Join();
}

void DataPort::StartAccepting() { server_->StartAccepting(); }
void DataPort::Shutdown() { server_->Shutdown(); }
void DataPort::Join() { server_->Join(); }

void DataPort::ServePeer(int fd) {
  FrameReader reader(fd, wire::kMaxFrameBytes + 4096);
  std::string req, batch;
  auto flush = [&] {
    bool ok = WriteAll(fd, batch).ok();
    batch.clear();
    return ok;
  };
  auto respond = [&](std::string_view reply) {
    AppendFrame(&batch, reply);
    return batch.size() < (256 << 10) || flush();
  };
  // Only members of the cluster: the first frame carries its key.
  {
    std::string hello;
    if (!reader.Next(&hello).ok()) return;
    wire::Reader r(hello);
    uint8_t op;
    std::string_view key;
    if (!r.U8(&op) || op != static_cast<uint8_t>(PeerOp::kHello) ||
        !r.Str(&key) || !key_.Matches(key))
      return;
  }
  // A migration into this node, while one is being received here.
  std::optional<pv1::ShardInfo> incoming;
  std::optional<proclets::Arena> arena;
  std::optional<MigrationPriority> priority;  // while receiving one
  std::optional<RealtimeSection> realtime;    // its final rounds
  while (true) {
    if (!batch.empty() && !reader.HasFrame() && !flush()) return;
    if (!arena) {  // no move under way (the last one's answer is sent)
      realtime.reset();
      priority.reset();
    }
    if (!reader.Next(&req).ok()) return;
    wire::Reader r(req);
    uint8_t op;
    if (!r.U8(&op)) return;
    switch (static_cast<PeerOp>(op)) {
      case PeerOp::kShardOp: {
        std::string reply;
        try {
          reply = shards_.HandleShardOp(r);
        } catch (const std::exception& e) {
          fprintf(stderr, "silt-invoker: shard request: %s\n", e.what());
          reply = Error(StateCode::kInternal, "internal error");
        }
        if (!respond(reply)) return;
        break;
      }
      case PeerOp::kRunTask: {  // blocks this connection until it is done
        TaskTarget target;
        std::string_view call;
        if (!run_task_ || !ReadRunTask(r, &target, &call)) return;
        if (!batch.empty() && !flush()) return;
        std::string reply;
        try {
          reply = run_task_(target, call);
        } catch (const std::exception& e) {
          fprintf(stderr, "silt-invoker: task request: %s\n", e.what());
          reply = Error(StateCode::kInternal, "internal error");
        }
        if (!respond(reply)) return;
        break;
      }
      case PeerOp::kGpu: {  // blocks this connection until it is done
        if (!gpu_.serve) return;
        if (!batch.empty() && !flush()) return;
        std::string reply;
        try {
          reply = gpu_.serve(r);
        } catch (const std::exception& e) {
          fprintf(stderr, "silt-invoker: GPU request: %s\n", e.what());
          reply = Error(StateCode::kInternal, "internal error");
        }
        if (!respond(reply)) return;
        break;
      }
      case PeerOp::kGpuAdopt: {
        if (!gpu_.adopt) return;
        if (!batch.empty() && !flush()) return;
        std::string reply;
        try {
          PeerStream stream{
              [&reader](std::string* f) { return reader.Next(f); },
              [&reader](char* dst, size_t n) { return reader.ReadRaw(dst, n); },
              [fd](std::string_view reply) {
                return WriteBytesFrame(fd, reply);
              }};
          reply = gpu_.adopt(r, stream);
        } catch (const std::exception& e) {
          fprintf(stderr, "silt-invoker: GPU proclet move: %s\n", e.what());
          return;
        }
        if (reply.empty() || !respond(reply)) return;
        break;
      }
      case PeerOp::kMigrateBegin: {
        std::string_view info;
        pv1::ShardInfo parsed;
        uint64_t size = 0;
        if (!r.Str(&info) || !parsed.ParseFromArray(info.data(), info.size()))
          return;
        (void)r.U64(&size);  // absent from older peers
        priority.emplace();
        // Backed by memory before the bytes come (not a fault per page as
        // they do), ahead of time where possible.
        auto a = spare_.Take(size);
        if (!a.ok()) return;
        incoming = parsed;
        arena.emplace(*std::move(a));
        break;
      }
      case PeerOp::kMigrateBytes: {  // the bytes follow the frame
        uint64_t off, used, len;
        if (!arena || !r.U64(&off) || !r.U64(&used) || !r.U64(&len)) return;
        auto dst = arena->Receive(off, len, used);
        if (!dst.ok() || !reader.ReadRaw(*dst, len).ok()) return;
        break;
      }
      case PeerOp::kMigrateSync:
        if (!respond(Reply(arena ? StateCode::kOk : StateCode::kInternal)))
          return;
        // What follows is the move's last pre-copy round and its final one:
        // writes are (about to be) held.
        if (arena && !realtime) realtime.emplace();
        break;
      case PeerOp::kMigrateCommit: {
        uint64_t used;
        std::string reply;
        if (!arena || !r.U64(&used) || used != arena->used()) {
          reply = Error(StateCode::kInternal, "migration bytes incomplete");
        } else {
          absl::Status s = Install(shards_, *incoming, std::move(*arena));
          reply = s.ok() ? Reply(StateCode::kOk)
                         : Error(StateCode::kInternal, s.message());
        }
        arena.reset();
        incoming.reset();
        if (!respond(reply)) return;
        break;
      }
      default:
        return;
    }
  }
}

}  // namespace silt::invoker
