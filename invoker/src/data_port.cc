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
    TaskRunner run_task) {
  auto hp = SplitHostPort(data_listen);
  if (!hp.ok()) return hp.status();
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(hp->second);
  if (inet_pton(AF_INET, hp->first.c_str(), &sa.sin_addr) != 1)
    return absl::InvalidArgumentError(
        absl::StrCat("bad data address ", data_listen));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      listen(fd, 128) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat(
        "cannot listen for data on ", data_listen, ": ", strerror(err)));
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  return std::unique_ptr<DataPort>(
      new DataPort(shards, key, std::move(run_task), fd,
                   absl::StrCat(hp->first, ":", ntohs(sa.sin_port))));
}

DataPort::DataPort(ShardTable& shards, const DataKey& key, TaskRunner run_task,
                   int listener, std::string address)
    : shards_(shards),
      key_(key),
      run_task_(std::move(run_task)),
      listener_(listener),
      address_(std::move(address)) {}

DataPort::~DataPort() {
  Shutdown();
  Join();
}

void DataPort::StartAccepting() {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

void DataPort::Shutdown() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    for (auto& [id, fd] : conn_fds_) shutdown(fd, SHUT_RDWR);
  }
  if (listener_ >= 0) shutdown(listener_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
}

void DataPort::Join() {
  std::map<uint64_t, std::thread> threads;
  {
    absl::MutexLock l(&mu_);
    threads.swap(conn_threads_);
  }
  for (auto& [id, t] : threads) t.join();
  if (listener_ >= 0) close(listener_);
  listener_ = -1;
}

void DataPort::AcceptLoop() {
  while (true) {
    int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Spawn(fd, [this](int fd) { ServePeer(fd); });
  }
}

void DataPort::Spawn(int fd, std::function<void(int)> serve) {
  absl::MutexLock l(&mu_);
  for (uint64_t id : finished_) {
    auto it = conn_threads_.find(id);
    if (it != conn_threads_.end()) {
      it->second.join();
      conn_threads_.erase(it);
    }
  }
  finished_.clear();
  if (stopping_) {
    close(fd);
    return;
  }
  uint64_t id = next_conn_++;
  conn_fds_[id] = fd;
  conn_threads_[id] = std::thread([this, id, fd, serve = std::move(serve)] {
    serve(fd);
    absl::MutexLock l(&mu_);
    conn_fds_.erase(id);
    close(fd);
    finished_.push_back(id);
  });
}

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
