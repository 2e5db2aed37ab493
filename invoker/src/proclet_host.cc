#include "proclet_host.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <thread>
#include <utility>
#include <variant>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "frames.h"
#include "proclets/shard.h"
#include "silt/state_wire.h"
#include "state_loop.h"

namespace silt::invoker {
namespace {

using Clock = std::chrono::steady_clock;
using proclets::MapShard;
using proclets::QueueShard;
using proclets::VectorShard;
using wire::StateCode;
using wire::StateKind;
using wire::StateOp;

constexpr uint64_t kOpenEnd = std::numeric_limits<uint64_t>::max();
constexpr int kMaxAttempts = 6;
// A migration stops pre-copying when one round leaves less than this dirty.
constexpr uint64_t kFinalRoundBytes = 128 * 1024;
// Past this many dirty bytes pre-copy goes on even when rounds stop
// shrinking: the final round's bytes are the write pause.
constexpr uint64_t kMaxFinalRoundBytes = 256 * 1024;
constexpr int kMaxPrecopyRounds = 30;
constexpr size_t kChunkBytes = 1 << 20;

// Frames on the data port.
enum class PeerOp : uint8_t {
  kShardOp = 1,        // u64 id, u64 hint, then a StateOp and its arguments
  kMigrateBegin = 2,   // str ShardInfo; no reply
  kMigrateChunk = 3,   // u64 offset, u64 new_used, str bytes; no reply
  kMigrateCommit = 4,  // u64 new_used -> code
  kMigrateSync = 5,    // -> code, once every earlier chunk is applied
  kHello = 6,          // str key: the first frame of every connection
};

std::string Reply(StateCode code, std::string_view payload = {}) {
  std::string r;
  r.reserve(1 + payload.size());
  r.push_back(static_cast<char>(code));
  r.append(payload);
  return r;
}

std::string Error(StateCode code, absl::string_view message) {
  return Reply(code, std::string_view(message.data(), message.size()));
}

StateCode CodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
      return StateCode::kNotFound;
    case absl::StatusCode::kResourceExhausted:
      return StateCode::kTooLarge;
    case absl::StatusCode::kInvalidArgument:
      return StateCode::kInvalid;
    case absl::StatusCode::kFailedPrecondition:
      return StateCode::kWrongKind;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return StateCode::kUnavailable;
    default:
      return StateCode::kInternal;
  }
}

pv1::Kind ProtoKind(StateKind k) { return static_cast<pv1::Kind>(k); }

const char* KindName(pv1::Kind k) {
  switch (k) {
    case pv1::KIND_MAP:
      return "map";
    case pv1::KIND_VECTOR:
      return "vector";
    case pv1::KIND_QUEUE:
      return "queue";
    default:
      return "unknown";
  }
}

absl::StatusOr<std::pair<std::string, uint16_t>> SplitHostPort(
    const std::string& addr) {
  size_t colon = addr.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(addr.substr(colon + 1), &port) || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("bad address \"", addr, "\" (want host:port)"));
  return std::make_pair(addr.substr(0, colon), static_cast<uint16_t>(port));
}

absl::StatusOr<int> Dial(const std::string& addr) {
  auto hp = SplitHostPort(addr);
  if (!hp.ok()) return hp.status();
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(hp->second);
  if (inet_pton(AF_INET, hp->first.c_str(), &sa.sin_addr) != 1)
    return absl::InvalidArgumentError(absl::StrCat("bad IPv4 address ", addr));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", addr, ": ", strerror(err)));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// The function whose instance the current thread serves (directory
// listings show which functions use a structure).
thread_local std::string t_function;

// One shard held here.
struct HostedShard {
  absl::Mutex mu;
  pv1::ShardInfo info ABSL_GUARDED_BY(mu);
  std::unique_ptr<MapShard> map ABSL_GUARDED_BY(mu);
  std::unique_ptr<VectorShard> vec ABSL_GUARDED_BY(mu);
  std::unique_ptr<QueueShard> queue ABSL_GUARDED_BY(mu);
  bool frozen ABSL_GUARDED_BY(mu) = false;  // final round of a migration
  bool gone ABSL_GUARDED_BY(mu) = false;    // moved or dropped
  std::string moved_to ABSL_GUARDED_BY(mu);
  uint64_t moved_epoch ABSL_GUARDED_BY(mu) = 0;
  // Halves split off this shard: requests whose hint is >= at go there.
  std::vector<std::pair<uint64_t, std::shared_ptr<HostedShard>>> splits
      ABSL_GUARDED_BY(mu);
  bool closing ABSL_GUARDED_BY(mu) = false;  // the host is stopping
  // While a migration's pre-copy does not converge, writes wait this long
  // first (auto-converge: the rounds shrink, and so does the final pause).
  std::atomic<uint32_t> throttle_us{0};
  // Set when merged into the shard below it: that one serves its range now.
  std::shared_ptr<HostedShard> merged_into ABSL_GUARDED_BY(mu);

  proclets::Arena* arena() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (map) return &map->arena();
    if (vec) return &vec->arena();
    if (queue) return &queue->arena();
    return nullptr;
  }
  // Opens or closes what instances on this node may read of a map shard
  // straight from its arena (they get its memory file: ShareMap): open only
  // while this copy is authoritative for info's range and nothing is moving.
  void Publish(bool open) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (map) map->arena().SetWindow(info.lo(), info.hi(), open);
  }
  uint64_t count() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (map) return map->count();
    if (vec) return vec->count();
    if (queue) return queue->count();
    return 0;
  }
};

// A pooled connection to a peer's data port.
struct PeerConn {
  int fd = -1;
  std::unique_ptr<FrameReader> reader;
  ~PeerConn() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

// Frees what it is given on its own thread: the arenas of shards that moved
// away (unmapping and truncating tens of MiB takes milliseconds, which would
// otherwise be part of every move).
class Reaper {
 public:
  Reaper() : thread_([this] { Run(); }) {}
  ~Reaper() {
    {
      absl::MutexLock l(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }
  void Free(std::shared_ptr<void> garbage) {
    if (!garbage) return;
    absl::MutexLock l(&mu_);
    queue_.push_back(std::move(garbage));
  }

 private:
  void Run() {
    while (true) {
      std::vector<std::shared_ptr<void>> batch;
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(
            +[](Reaper* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
              return r->stopping_ || !r->queue_.empty();
            },
            this));
        batch.swap(queue_);
        if (batch.empty() && stopping_) return;
      }
      batch.clear();
    }
  }
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<void>> queue_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

struct ProcletHost::Impl {
  ProcletHostOptions options;
  Reaper reaper;
  std::string address;
  std::atomic<uint64_t> ops{0};  // shard operations executed (metrics)
  int listener = -1;
  std::thread acceptor;

  absl::Mutex mu;  // shards and tombstones
  std::map<uint64_t, std::shared_ptr<HostedShard>> shards ABSL_GUARDED_BY(mu);

  absl::Mutex key_mu;
  std::string data_key ABSL_GUARDED_BY(key_mu);

  // The first frame of a connection to a peer; empty until the key is known.
  std::string Hello() {
    absl::MutexLock l(&key_mu);
    if (data_key.empty()) return "";
    std::string frame;
    wire::Writer w(&frame);
    w.U8(static_cast<uint8_t>(PeerOp::kHello));
    w.Str(data_key);
    return frame;
  }

  bool KeyMatches(std::string_view key) {
    absl::MutexLock l(&key_mu);
    if (data_key.empty() || key.size() != data_key.size()) return false;
    unsigned char diff = 0;  // constant time
    for (size_t i = 0; i < key.size(); ++i) diff |= key[i] ^ data_key[i];
    return diff == 0;
  }

  absl::Mutex layouts_mu;
  std::map<std::string, std::shared_ptr<const pv1::Layout>> layouts
      ABSL_GUARDED_BY(layouts_mu);

  absl::Mutex peers_mu;
  std::map<std::string, std::vector<std::unique_ptr<PeerConn>>> idle_peers
      ABSL_GUARDED_BY(peers_mu);

  // Instances' state connections (see state_loop.h).
  std::unique_ptr<StateLoop> loop;

  absl::Mutex conns_mu;
  bool stopping ABSL_GUARDED_BY(conns_mu) = false;
  uint64_t next_conn ABSL_GUARDED_BY(conns_mu) = 0;
  std::map<uint64_t, int> conn_fds ABSL_GUARDED_BY(conns_mu);
  std::map<uint64_t, std::thread> conn_threads ABSL_GUARDED_BY(conns_mu);
  std::vector<uint64_t> finished ABSL_GUARDED_BY(conns_mu);

  ~Impl() {
    // No new peers (so no shard arrives from now on), then wake queue pops
    // waiting on shards here, then stop the state loop (its pool joins the
    // threads that served them).
    {
      absl::MutexLock l(&conns_mu);
      stopping = true;
      for (auto& [id, fd] : conn_fds) shutdown(fd, SHUT_RDWR);
    }
    if (listener >= 0) shutdown(listener, SHUT_RDWR);
    if (acceptor.joinable()) acceptor.join();
    {
      absl::MutexLock l(&mu);
      for (auto& [id, hs] : shards) {
        absl::MutexLock sl(&hs->mu);
        hs->closing = true;
      }
    }
    loop.reset();
    std::map<uint64_t, std::thread> threads;
    {
      absl::MutexLock l(&conns_mu);
      threads.swap(conn_threads);
    }
    for (auto& [id, t] : threads) t.join();
    if (listener >= 0) close(listener);
    // Wake queue waiters so nothing blocks on a dying host.
    absl::MutexLock l(&mu);
    shards.clear();
  }

  // ---- connections ----

  // Runs `serve(fd)` on a thread of its own until it returns; then closes fd.
  void Spawn(int fd, std::function<void(int)> serve) {
    absl::MutexLock l(&conns_mu);
    for (uint64_t id : finished) {
      auto it = conn_threads.find(id);
      if (it != conn_threads.end()) {
        it->second.join();
        conn_threads.erase(it);
      }
    }
    finished.clear();
    if (stopping) {
      close(fd);
      return;
    }
    uint64_t id = next_conn++;
    conn_fds[id] = fd;
    conn_threads[id] = std::thread([this, id, fd, serve = std::move(serve)] {
      serve(fd);
      absl::MutexLock l(&conns_mu);
      conn_fds.erase(id);
      close(fd);
      finished.push_back(id);
    });
  }

  void AcceptLoop() {
    while (true) {
      int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // shut down
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Spawn(fd, [this](int fd) { ServePeer(fd); });
    }
  }

  // A peer's connection: its requests are answered in order, and the answers
  // to requests that arrived together leave in one write.
  void ServePeer(int fd) {
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
          !r.Str(&key) || !KeyMatches(key))
        return;
    }
    // A migration into this node, while one is being received here.
    std::optional<pv1::ShardInfo> incoming;
    std::optional<proclets::Arena> arena;
    while (true) {
      if (!batch.empty() && !reader.HasFrame() && !flush()) return;
      if (!reader.Next(&req).ok()) return;
      wire::Reader r(req);
      uint8_t op;
      if (!r.U8(&op)) return;
      switch (static_cast<PeerOp>(op)) {
        case PeerOp::kShardOp: {
          std::string reply;
          try {
            reply = HandleShardOp(r);
          } catch (const std::exception& e) {
            fprintf(stderr, "silt-invoker: shard request: %s\n", e.what());
            reply = Error(StateCode::kInternal, "internal error");
          }
          if (!respond(reply)) return;
          break;
        }
        case PeerOp::kMigrateBegin: {
          std::string_view info;
          pv1::ShardInfo parsed;
          if (!r.Str(&info) || !parsed.ParseFromArray(info.data(), info.size()))
            return;
          auto a = proclets::Arena::Create();
          if (!a.ok()) return;
          incoming = parsed;
          arena.emplace(*std::move(a));
          break;
        }
        case PeerOp::kMigrateChunk: {
          uint64_t off, used;
          std::string_view bytes;
          if (!arena || !r.U64(&off) || !r.U64(&used) || !r.Str(&bytes)) return;
          if (!arena->WriteAt(off, bytes, used).ok()) return;
          break;
        }
        case PeerOp::kMigrateSync:
          if (!respond(Reply(arena ? StateCode::kOk : StateCode::kInternal)))
            return;
          break;
        case PeerOp::kMigrateCommit: {
          uint64_t used;
          std::string reply;
          if (!arena || !r.U64(&used) || used != arena->used()) {
            reply = Error(StateCode::kInternal, "migration bytes incomplete");
          } else {
            absl::Status s = Install(*incoming, std::move(*arena));
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

  // ---- shards held here ----

  // Takes a migrated shard. Its bytes come from a peer that proved the
  // cluster's key and served them itself: only their header is checked.
  absl::Status Install(const pv1::ShardInfo& info, proclets::Arena arena) {
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
    absl::MutexLock l(&mu);
    shards[info.id()] = std::move(hs);
    return absl::OkStatus();
  }

  std::shared_ptr<HostedShard> Find(uint64_t id) {
    absl::MutexLock l(&mu);
    auto it = shards.find(id);
    return it == shards.end() ? nullptr : it->second;
  }

  // The shard that holds `hint`, following splits made here. Returns it
  // locked, or null (with *moved set when it went elsewhere).
  // With would_block set, never waits: a frozen shard sets *would_block.
  HostedShard* Resolve(std::shared_ptr<HostedShard> hs, uint64_t hint,
                       std::shared_ptr<HostedShard>* keep, std::string* moved,
                       uint64_t* moved_epoch, bool* would_block = nullptr)
      ABSL_NO_THREAD_SAFETY_ANALYSIS {
    while (hs) {
      if (would_block) {
        if (!hs->mu.TryLock()) {  // held by a split, merge or migration
          *would_block = true;
          return nullptr;
        }
      } else {
        hs->mu.Lock();
      }
      if (would_block && hs->frozen && !hs->gone) {
        hs->mu.Unlock();
        *would_block = true;
        return nullptr;
      }
      // Wait out the final round of a migration (it is short).
      auto deadline = absl::Now() + absl::Seconds(2);
      while (hs->frozen && !hs->gone) {
        if (hs->mu.AwaitWithDeadline(
                absl::Condition(
                    +[](HostedShard* s)
                         ABSL_NO_THREAD_SAFETY_ANALYSIS { return !s->frozen; },
                    hs.get()),
                deadline))
          break;
        if (absl::Now() >= deadline) break;
      }
      if (hs->frozen && !hs->gone) {  // a stuck migration: retry later
        hs->mu.Unlock();
        moved->clear();
        return nullptr;
      }
      if (hs->gone) {
        *moved = hs->moved_to;
        *moved_epoch = hs->moved_epoch;
        hs->mu.Unlock();
        return nullptr;
      }
      std::shared_ptr<HostedShard> next = hs->merged_into;
      for (auto& [at, child] : hs->splits)
        if (hint >= at) next = child;
      if (!next && hint >= hs->info.lo() &&
          (hint < hs->info.hi() || hs->info.hi() == kOpenEnd)) {
        *keep = hs;
        return hs.get();
      }
      hs->mu.Unlock();
      if (!next) {
        moved->clear();  // not ours: ask the directory
        return nullptr;
      }
      hs = std::move(next);
    }
    return nullptr;
  }

  // One operation on a shard held here (a peer's, or this node's own). With
  // would_block set, returns "" and sets it instead of waiting for a
  // migration's final round or for a queue to fill.
  std::string HandleShardOp(wire::Reader r, bool* would_block = nullptr) {
    uint64_t id, hint;
    uint8_t op;
    if (!r.U64(&id) || !r.U64(&hint) || !r.U8(&op))
      return Error(StateCode::kInvalid, "malformed shard request");
    std::shared_ptr<HostedShard> hs = Find(id);
    if (!hs) return MovedReply("", 0);
    if (uint32_t wait = hs->throttle_us.load(std::memory_order_relaxed);
        wait > 0 && IsWrite(static_cast<StateOp>(op))) {
      if (would_block) {
        *would_block = true;
        return "";
      }
      std::this_thread::sleep_for(std::chrono::microseconds(wait));
    }
    std::shared_ptr<HostedShard> keep;
    std::string moved;
    uint64_t moved_epoch = 0;
    HostedShard* s =
        Resolve(hs, hint, &keep, &moved, &moved_epoch, would_block);
    if (would_block && *would_block) return "";
    if (s == nullptr) return MovedReply(moved, moved_epoch);
    std::string reply = Execute(*s, static_cast<StateOp>(op), r);
    ops.fetch_add(1, std::memory_order_relaxed);
    s->mu.Unlock();
    return reply;
  }

  static bool IsWrite(StateOp op) {
    switch (op) {
      case StateOp::kMapPut:
      case StateOp::kMapErase:
      case StateOp::kMapMultiPut:
      case StateOp::kVecPush:
      case StateOp::kVecSet:
      case StateOp::kQueuePush:
      case StateOp::kQueuePop:
        return true;
      default:
        return false;
    }
  }

  // In a multi-get reply: the key belongs to another shard.
  static constexpr uint8_t kNotHere = 2;

  static bool Covers(const pv1::ShardInfo& info, uint64_t hint) {
    return hint >= info.lo() && (hint < info.hi() || info.hi() == kOpenEnd);
  }

  static std::string MovedReply(const std::string& to, uint64_t epoch) {
    std::string p;
    wire::Writer w(&p);
    w.Str(to);
    w.U64(epoch);
    return Reply(StateCode::kMoved, p);
  }

  // Runs op on a locked shard.
  std::string Execute(HostedShard& s, StateOp op, wire::Reader& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    std::string out;
    wire::Writer w(&out);
    auto bad = [] {
      return Error(StateCode::kInvalid, "malformed request arguments");
    };
    if (s.map) {
      MapShard& m = *s.map;
      switch (op) {
        case StateOp::kMapGet: {
          std::string_view k;
          if (!r.Str(&k)) return bad();
          auto v = m.Get(k);
          if (!v.ok()) return Error(StateCode::kNotFound, "no such key");
          out.push_back(0);
          w.Str(*v);
          return out;
        }
        case StateOp::kMapPut: {
          std::string_view k, v;
          if (!r.Str(&k) || !r.Str(&v)) return bad();
          if (auto st = m.Put(k, v); !st.ok())
            return Error(CodeOf(st), st.message());
          return Reply(StateCode::kOk);
        }
        case StateOp::kMapErase:
        case StateOp::kMapContains: {
          std::string_view k;
          if (!r.Str(&k)) return bad();
          bool had = op == StateOp::kMapErase ? m.Erase(k) : m.Contains(k);
          out.push_back(0);
          w.U8(had ? 1 : 0);
          return out;
        }
        case StateOp::kMapSize:  // count, then who answered: id, lo, hi
          out.push_back(0);
          w.U64(m.count());
          w.U64(s.info.id());
          w.U64(s.info.lo());
          w.U64(s.info.hi());
          return out;
        // Keys this shard does not cover (it split since the caller's
        // layout was cached) come back marked, for the caller to re-route.
        case StateOp::kMapMultiGet: {
          uint32_t n;
          if (!r.U32(&n)) return bad();
          out.push_back(0);
          w.U32(n);
          for (uint32_t i = 0; i < n; ++i) {
            std::string_view k;
            if (!r.Str(&k)) return bad();
            if (!Covers(s.info, proclets::KeyHash(k))) {
              w.U8(kNotHere);
              w.Str({});
              continue;
            }
            auto v = m.Get(k);
            w.U8(v.ok() ? 1 : 0);
            w.Str(v.ok() ? *v : std::string_view());
          }
          return out;
        }
        case StateOp::kMapMultiPut: {  // -> u32 n, n indexes not put here
          uint32_t n;
          if (!r.U32(&n)) return bad();
          std::vector<uint32_t> elsewhere;
          for (uint32_t i = 0; i < n; ++i) {
            std::string_view k, v;
            if (!r.Str(&k) || !r.Str(&v)) return bad();
            if (!Covers(s.info, proclets::KeyHash(k))) {
              elsewhere.push_back(i);
              continue;
            }
            if (auto st = m.Put(k, v); !st.ok())
              return Error(CodeOf(st), st.message());
          }
          out.push_back(0);
          w.U32(static_cast<uint32_t>(elsewhere.size()));
          for (uint32_t i : elsewhere) w.U32(i);
          return out;
        }
        default:
          break;
      }
    } else if (s.vec) {
      VectorShard& v = *s.vec;
      switch (op) {
        case StateOp::kVecPush: {
          std::string_view val;
          if (!r.Str(&val)) return bad();
          auto i = v.PushBack(val);
          if (!i.ok()) return Error(CodeOf(i.status()), i.status().message());
          out.push_back(0);
          w.U64(*i);
          return out;
        }
        case StateOp::kVecGet: {
          uint64_t i;
          if (!r.U64(&i)) return bad();
          auto val = v.Get(i);
          if (!val.ok())
            return Error(StateCode::kNotFound,
                         absl::StrCat("index ", i, " is past the end"));
          out.push_back(0);
          w.Str(*val);
          return out;
        }
        case StateOp::kVecSet: {
          uint64_t i;
          std::string_view val;
          if (!r.U64(&i) || !r.Str(&val)) return bad();
          if (auto st = v.Set(i, val); !st.ok())
            return Error(CodeOf(st),
                         st.code() == absl::StatusCode::kOutOfRange
                             ? absl::StrCat("index ", i, " is past the end")
                             : std::string(st.message()));
          return Reply(StateCode::kOk);
        }
        case StateOp::kVecSize:  // the end of this shard's range
          out.push_back(0);
          w.U64(v.first() + v.count());
          return out;
        case StateOp::kVecRange: {
          uint64_t first, n;
          if (!r.U64(&first) || !r.U64(&n)) return bad();
          auto vals = v.Range(first, n);
          out.push_back(0);
          if (!vals.ok()) {
            w.U32(0);
            return out;
          }
          w.U32(static_cast<uint32_t>(vals->size()));
          for (auto& x : *vals) w.Str(x);
          return out;
        }
        default:
          break;
      }
    } else if (s.queue) {
      QueueShard& q = *s.queue;
      switch (op) {
        case StateOp::kQueuePush: {
          std::string_view val;
          if (!r.Str(&val)) return bad();
          if (auto st = q.Push(val); !st.ok())
            return Error(CodeOf(st), st.message());
          return Reply(StateCode::kOk);
        }
        case StateOp::kQueuePop: {
          uint32_t timeout_ms;
          if (!r.U32(&timeout_ms)) return bad();
          auto deadline = absl::Now() + absl::Milliseconds(timeout_ms);
          HostedShard* sp = &s;
          // Waiting releases the lock: the shard may be dropped or moved
          // meanwhile (its queue freed), so check that before the queue.
          while (!s.gone && !s.frozen && !s.closing && s.queue->count() == 0) {
            if (!s.mu.AwaitWithDeadline(
                    absl::Condition(
                        +[](HostedShard* h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                          return h->gone || h->frozen || h->closing ||
                                 (h->queue && h->queue->count() > 0);
                        },
                        sp),
                    deadline))
              break;
          }
          if (s.gone || s.frozen || !s.queue)  // moving: the caller retries
            return MovedReply(s.moved_to, s.moved_epoch);
          if (s.queue->count() == 0 && s.closing)
            return Error(StateCode::kUnavailable, "the node is stopping");
          auto v = s.queue->Pop();
          if (!v) return Error(StateCode::kTimeout, "the queue stayed empty");
          out.push_back(0);
          w.Str(*v);
          return out;
        }
        case StateOp::kQueueSize:
          out.push_back(0);
          w.U64(q.count());
          w.U64(s.info.id());
          w.U64(s.info.lo());
          w.U64(s.info.hi());
          return out;
        default:
          break;
      }
    }
    return Error(
        StateCode::kInvalid,
        absl::StrCat("operation ", static_cast<int>(op),
                     " does not apply to a ", KindName(s.info.kind())));
  }

  // ---- routing (instances' requests) ----

  static std::string LayoutKey(std::string_view ns, std::string_view name) {
    std::string key;
    key.reserve(ns.size() + 1 + name.size());
    key.append(ns).append("/").append(name);
    return key;
  }

  absl::StatusOr<std::shared_ptr<const pv1::Layout>> GetLayout(
      const std::string& ns, const std::string& name, StateKind kind,
      bool refresh) {
    std::string key = LayoutKey(ns, name);
    if (!refresh) {
      absl::MutexLock l(&layouts_mu);
      auto it = layouts.find(key);
      if (it != layouts.end()) return it->second;
    }
    if (!options.resolve)
      return absl::UnavailableError("no directory to resolve state with");
    auto layout = options.resolve(ns, name, ProtoKind(kind), 0, 0,
                                  /*create=*/true, t_function);
    if (!layout.ok()) return layout.status();
    auto shared = std::make_shared<const pv1::Layout>(*std::move(layout));
    absl::MutexLock l(&layouts_mu);
    layouts[key] = shared;
    return shared;
  }

  // After MOVED(to, epoch): patch the cached location without asking the
  // gateway.
  void Relocate(const std::string& ns, const std::string& name, uint64_t id,
                const std::string& to, uint64_t epoch) {
    absl::MutexLock l(&layouts_mu);
    auto it = layouts.find(LayoutKey(ns, name));
    if (it == layouts.end()) return;
    auto copy = std::make_shared<pv1::Layout>(*it->second);
    for (auto& s : *copy->mutable_shards()) {
      if (s.id() == id) {
        s.set_data_address(to);
        s.set_epoch(epoch);
      }
    }
    it->second = std::move(copy);
  }

  // Sends one shard request (already built) to loc. Sets *ambiguous when the
  // request left but no answer came: it may have been applied, so the caller
  // must not send it again.
  std::string Send(const pv1::ShardLocation& loc, const std::string& req,
                   bool* ambiguous) {
    if (loc.data_address() == address) {
      wire::Reader r(std::string_view(req).substr(1));
      return HandleShardOp(r);
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::unique_ptr<PeerConn> c = TakePeer(loc.data_address());
      if (!c) break;
      // Not sent: retry on a fresh connection.
      if (!WriteBytesFrame(c->fd, req).ok()) continue;
      std::string reply;
      if (c->reader->Next(&reply).ok()) {
        GivePeer(loc.data_address(), std::move(c));
        return reply;
      }
      *ambiguous = true;
      return Error(StateCode::kUnavailable,
                   absl::StrCat("lost the connection to node ", loc.node(),
                                " during the operation (it may or may not "
                                "have been applied)"));
    }
    return Error(
        StateCode::kUnavailable,
        absl::StrCat("cannot reach node ", loc.node(), " (", loc.data_address(),
                     ") holding shard ", loc.id()));
  }

  std::unique_ptr<PeerConn> TakePeer(const std::string& addr) {
    {
      absl::MutexLock l(&peers_mu);
      auto& pool = idle_peers[addr];
      while (!pool.empty()) {
        auto c = std::move(pool.back());
        pool.pop_back();
        // A pooled connection whose peer went away reads EOF or an error
        // right away: drop it rather than send on it.
        char b;
        ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return c;
      }
    }
    std::string hello = Hello();
    if (hello.empty()) return nullptr;
    auto fd = Dial(addr);
    if (!fd.ok()) return nullptr;
    auto c = std::make_unique<PeerConn>();
    c->fd = *fd;
    if (!WriteBytesFrame(c->fd, hello).ok()) return nullptr;
    c->reader = std::make_unique<FrameReader>(*fd, wire::kMaxFrameBytes + 64);
    return c;
  }

  void GivePeer(const std::string& addr, std::unique_ptr<PeerConn> c) {
    absl::MutexLock l(&peers_mu);
    auto& pool = idle_peers[addr];
    if (pool.size() < 64) pool.push_back(std::move(c));
  }

  static std::string ShardRequest(uint64_t id, uint64_t hint, StateOp op,
                                  std::string_view args) {
    std::string req;
    req.reserve(18 + args.size());
    wire::Writer w(&req);
    w.U8(static_cast<uint8_t>(PeerOp::kShardOp));
    w.U64(id);
    w.U64(hint);
    w.U8(static_cast<uint8_t>(op));
    w.Bytes(args);
    return req;
  }

  static const pv1::ShardLocation* Covering(const pv1::Layout& l,
                                            uint64_t hint) {
    for (const auto& s : l.shards())
      if (hint >= s.lo() && (hint < s.hi() || s.hi() == kOpenEnd)) return &s;
    return nullptr;
  }

  // Routes a request for the shard covering `hint`, following MOVED and
  // refreshing the layout as needed.
  std::string Route(const std::string& ns, const std::string& name,
                    StateKind kind, uint64_t hint, StateOp op,
                    std::string_view args) {
    bool refresh = false;
    std::string last;
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      auto layout = GetLayout(ns, name, kind, refresh);
      if (!layout.ok())
        return Error(CodeOf(layout.status()), layout.status().message());
      if ((*layout)->kind() != ProtoKind(kind))
        return Error(StateCode::kWrongKind,
                     absl::StrCat("state \"", name, "\" is a ",
                                  KindName((*layout)->kind()), ", not a ",
                                  KindName(ProtoKind(kind))));
      const pv1::ShardLocation* loc = Covering(**layout, hint);
      if (loc == nullptr)
        return Error(StateCode::kInternal,
                     absl::StrCat("no shard of \"", name, "\" covers ", hint));
      if (loc->state() == pv1::SHARD_LOST)
        return Error(StateCode::kLost,
                     absl::StrCat("shard ", loc->id(), " of \"", name,
                                  "\" was lost: node ", loc->node(),
                                  " stopped without handing it over"));
      bool ambiguous = false;
      std::string reply =
          Send(*loc, ShardRequest(loc->id(), hint, op, args), &ambiguous);
      if (ambiguous) return reply;
      auto code = static_cast<StateCode>(reply[0]);
      if (code == StateCode::kMoved) {
        wire::Reader r(std::string_view(reply).substr(1));
        std::string_view to;
        uint64_t epoch = 0;
        if (r.Str(&to) && r.U64(&epoch) && !to.empty()) {
          Relocate(ns, name, loc->id(), std::string(to), epoch);
          refresh = false;
        } else {
          refresh = true;
        }
        last = "the shard kept moving";
        continue;
      }
      if (code == StateCode::kUnavailable) {
        // Its node may have died or handed it over: ask the directory.
        refresh = true;
        last = reply.substr(1);
        continue;
      }
      return reply;
    }
    return Error(StateCode::kUnavailable,
                 absl::StrCat("state \"", name, "\": ", last));
  }

  // An answer the instance can have as it is (not MOVED, not a node that
  // could not be reached: those go the slow way, which follows them).
  static bool IsFinal(std::string_view reply) {
    if (reply.empty()) return false;
    auto code = static_cast<StateCode>(reply[0]);
    return code != StateCode::kMoved && code != StateCode::kUnavailable;
  }

  // The state loop's fast path: an operation on one shard whose location is
  // cached, answered here if the shard is here (without waiting), else
  // forwarded to its node. Everything else: kSlow (HandleInstance).
  // kShareMap: the memory files of ns/name's map shards held here, for the
  // instance to read them in place. Their windows say what it may answer.
  StateLoopBackend::Shared Share(const std::string& ns, std::string_view req) {
    constexpr size_t kMaxShared = 64;  // well under SCM_MAX_FD
    StateLoopBackend::Shared out;
    wire::Reader r(req);
    StateOp op;
    StateKind kind;
    std::string_view name;
    if (!wire::ReadRequestHeader(&r, &op, &kind, &name) ||
        kind != StateKind::kMap || !wire::ValidStructureName(name)) {
      out.reply = Error(StateCode::kInvalid, "malformed share request");
      return out;
    }
    std::vector<std::shared_ptr<HostedShard>> candidates;
    {
      absl::MutexLock l(&mu);
      for (auto& [id, hs] : shards) candidates.push_back(hs);
    }
    for (auto& hs : candidates) {
      if (out.fds.size() == kMaxShared) break;
      absl::MutexLock l(&hs->mu);
      if (hs->gone || !hs->map || hs->info.namespace_() != ns ||
          hs->info.structure() != name)
        continue;
      int fd = fcntl(hs->map->arena().memory_fd(), F_DUPFD_CLOEXEC, 0);
      if (fd >= 0) out.fds.push_back(fd);
    }
    out.reply = Reply(StateCode::kOk);
    return out;
  }

  StateLoopBackend::Fast Fast(const std::string& ns, std::string_view req) {
    using Path = StateLoopBackend::Fast::Path;
    StateLoopBackend::Fast f;
    wire::Reader r(req);
    StateOp op;
    StateKind kind;
    std::string_view name;
    if (!wire::ReadRequestHeader(&r, &op, &kind, &name)) return f;
    std::string_view args = r.rest();
    uint64_t hint = 0;
    switch (op) {
      case StateOp::kMapGet:
      case StateOp::kMapPut:
      case StateOp::kMapErase:
      case StateOp::kMapContains: {
        wire::Reader k(args);
        std::string_view key;
        if (!k.Str(&key) || key.size() > proclets::kMaxKeyBytes) return f;
        hint = proclets::KeyHash(key);
        break;
      }
      case StateOp::kVecGet:
      case StateOp::kVecSet: {
        wire::Reader a(args);
        if (!a.U64(&hint)) return f;
        break;
      }
      case StateOp::kVecPush:
        hint = kOpenEnd - 1;
        break;
      case StateOp::kQueuePush:
        hint = 0;
        break;
      default:
        return f;
    }
    std::shared_ptr<const pv1::Layout> layout;
    {
      absl::MutexLock l(&layouts_mu);
      auto it = layouts.find(LayoutKey(ns, name));
      if (it == layouts.end()) return f;
      layout = it->second;
    }
    if (layout->kind() != ProtoKind(kind)) return f;
    const pv1::ShardLocation* loc = Covering(*layout, hint);
    if (loc == nullptr || loc->state() == pv1::SHARD_LOST) return f;
    std::string frame = ShardRequest(loc->id(), hint, op, args);
    if (loc->data_address() != address) {
      f.path = Path::kForward;
      f.peer = loc->data_address();
      f.frame = std::move(frame);
      return f;
    }
    bool would_block = false;
    std::string reply = HandleShardOp(
        wire::Reader(std::string_view(frame).substr(1)), &would_block);
    if (would_block || !IsFinal(reply)) return f;
    f.path = Path::kReply;
    f.reply = std::move(reply);
    return f;
  }

  // Runs op on every shard of the structure and gives each reply to fn.
  // Sums a count over every shard of the structure (kMapSize, kQueueSize).
  // Each shard says which range it answered for; a layout gone stale (a split
  // or merge since it was cached) shows as a range counted twice or not at
  // all, and the sum starts over on a fresh layout.
  std::string SumOverShards(const std::string& ns, const std::string& name,
                            StateKind kind, StateOp op) {
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      auto layout = GetLayout(ns, name, kind, attempt > 0);
      if (!layout.ok())
        return Error(CodeOf(layout.status()), layout.status().message());
      std::vector<uint64_t> los;
      for (const auto& s : (*layout)->shards()) los.push_back(s.lo());
      std::map<uint64_t, std::pair<uint64_t, uint64_t>> seen;  // lo -> hi, n
      bool stale = false;
      for (uint64_t lo : los) {
        std::string reply = Route(ns, name, kind, lo, op, {});
        if (reply[0] != 0) return reply;
        wire::Reader r(std::string_view(reply).substr(1));
        uint64_t n, id, slo, shi;
        if (!r.U64(&n) || !r.U64(&id) || !r.U64(&slo) || !r.U64(&shi))
          return Error(StateCode::kInternal, "bad shard reply");
        if (slo != lo) stale = true;  // answered by a merged or split shard
        seen[slo] = {shi, n};
      }
      // The answers must tile [0, open end) exactly.
      uint64_t at = 0, total = 0;
      for (auto& [lo, hi_n] : seen) {
        if (lo != at) stale = true;
        at = hi_n.first;
        total += hi_n.second;
      }
      if (at != kOpenEnd) stale = true;
      if (stale) continue;
      std::string out(1, '\0');
      wire::Writer(&out).U64(total);
      return out;
    }
    return Error(StateCode::kUnavailable,
                 absl::StrCat("state \"", name,
                              "\": its shards kept splitting or moving"));
  }

  std::string HandleInstance(const std::string& ns, std::string_view req) {
    wire::Reader r(req);
    StateOp op;
    StateKind kind;
    std::string_view name_view;
    if (!wire::ReadRequestHeader(&r, &op, &kind, &name_view))
      return Error(StateCode::kInvalid, "malformed state request");
    const std::string name(name_view);
    if (!wire::ValidStructureName(name))
      return Error(StateCode::kInvalid,
                   absl::StrCat("invalid state name \"", name,
                                "\": use 1-63 characters of [a-z0-9._-], "
                                "starting with a letter or digit"));
    if (kind != StateKind::kMap && kind != StateKind::kVector &&
        kind != StateKind::kQueue)
      return Error(StateCode::kInvalid, "unknown structure kind");
    std::string_view args = r.rest();
    switch (op) {
      case StateOp::kOpen: {
        uint32_t shards;
        uint64_t max_bytes;
        if (!r.U32(&shards) || !r.U64(&max_bytes))
          return Error(StateCode::kInvalid, "malformed open request");
        if (!options.resolve)
          return Error(StateCode::kUnavailable, "no directory");
        auto layout = options.resolve(ns, name, ProtoKind(kind), shards,
                                      max_bytes, true, t_function);
        if (!layout.ok())
          return Error(CodeOf(layout.status()), layout.status().message());
        auto shared = std::make_shared<const pv1::Layout>(*std::move(layout));
        absl::MutexLock l(&layouts_mu);
        layouts[LayoutKey(ns, name)] = shared;
        return Reply(StateCode::kOk);
      }
      case StateOp::kMapGet:
      case StateOp::kMapPut:
      case StateOp::kMapErase:
      case StateOp::kMapContains: {
        wire::Reader k(args);
        std::string_view key;
        if (!k.Str(&key)) return Error(StateCode::kInvalid, "missing key");
        if (key.size() > proclets::kMaxKeyBytes)
          return Error(
              StateCode::kTooLarge,
              absl::StrCat("key of ", key.size(), " bytes; the limit is ",
                           proclets::kMaxKeyBytes));
        return Route(ns, name, kind, proclets::KeyHash(key), op, args);
      }
      case StateOp::kMapSize:
      case StateOp::kQueueSize:
        return SumOverShards(ns, name, kind, op);
      case StateOp::kMapMultiGet:
      case StateOp::kMapMultiPut:
        return MultiOp(ns, name, op, args);
      case StateOp::kVecPush:
      case StateOp::kVecSize:
        return Route(ns, name, kind, kOpenEnd - 1, op, args);
      case StateOp::kVecGet:
      case StateOp::kVecSet: {
        wire::Reader a(args);
        uint64_t index;
        if (!a.U64(&index)) return Error(StateCode::kInvalid, "missing index");
        return Route(ns, name, kind, index, op, args);
      }
      case StateOp::kVecRange:
        return RangeOp(ns, name, args);
      case StateOp::kQueuePush:
      case StateOp::kQueuePop:
        return Route(ns, name, kind, 0, op, args);
      case StateOp::kShareMap:  // the loop serves these itself
      case StateOp::kShareRing:
        break;
    }
    return Error(StateCode::kInvalid,
                 absl::StrCat("unknown operation ", static_cast<int>(op)));
  }

  // Multi-get/put: one request per shard holding some of the keys.
  std::string MultiOp(const std::string& ns, const std::string& name,
                      StateOp op, std::string_view args) {
    bool put = op == StateOp::kMapMultiPut;
    wire::Reader r(args);
    uint32_t n;
    if (!r.U32(&n)) return Error(StateCode::kInvalid, "missing count");
    if (n > args.size() / 4)  // each key takes at least its length prefix
      return Error(StateCode::kInvalid, "malformed multi request");
    struct Item {
      std::string_view key, value;
      uint64_t hash;
    };
    std::vector<Item> items(n);
    for (auto& it : items) {
      if (!r.Str(&it.key) || (put && !r.Str(&it.value)))
        return Error(StateCode::kInvalid, "malformed multi request");
      it.hash = proclets::KeyHash(it.key);
    }
    std::vector<std::string> values(n);
    std::vector<uint8_t> found(n, 0);
    std::vector<size_t> todo(n);
    for (size_t i = 0; i < n; ++i) todo[i] = i;
    for (int attempt = 0; !todo.empty(); ++attempt) {
      if (attempt == kMaxAttempts)
        return Error(StateCode::kUnavailable,
                     absl::StrCat("state \"", name,
                                  "\": its shards kept splitting or moving"));
      auto layout = GetLayout(ns, name, StateKind::kMap, attempt > 0);
      if (!layout.ok())
        return Error(CodeOf(layout.status()), layout.status().message());
      // Group by the shard (its lo) that the layout says holds each key.
      std::map<uint64_t, std::vector<size_t>> groups;
      for (size_t i : todo) {
        const pv1::ShardLocation* loc = Covering(**layout, items[i].hash);
        groups[loc ? loc->lo() : items[i].hash].push_back(i);
      }
      todo.clear();
      for (auto& [lo, idx] : groups) {
        std::string sub;
        wire::Writer w(&sub);
        w.U32(static_cast<uint32_t>(idx.size()));
        for (size_t i : idx) {
          w.Str(items[i].key);
          if (put) w.Str(items[i].value);
        }
        std::string reply =
            Route(ns, name, StateKind::kMap, items[idx[0]].hash, op, sub);
        if (reply[0] != 0) return reply;
        wire::Reader rr(std::string_view(reply).substr(1));
        uint32_t m;
        if (!rr.U32(&m)) return Error(StateCode::kInternal, "bad shard reply");
        if (put) {  // the indexes (into idx) that belong elsewhere
          for (uint32_t k = 0; k < m; ++k) {
            uint32_t at;
            if (!rr.U32(&at) || at >= idx.size())
              return Error(StateCode::kInternal, "bad shard reply");
            todo.push_back(idx[at]);
          }
          continue;
        }
        if (m != idx.size())
          return Error(StateCode::kInternal, "bad shard reply");
        for (size_t i : idx) {
          uint8_t st;
          std::string_view v;
          if (!rr.U8(&st) || !rr.Str(&v))
            return Error(StateCode::kInternal, "bad shard reply");
          if (st == kNotHere) {
            todo.push_back(i);
            continue;
          }
          found[i] = st;
          values[i] = std::string(v);
        }
      }
    }
    std::string out(1, '\0');
    if (put) return out;
    wire::Writer w(&out);
    w.U32(n);
    for (uint32_t i = 0; i < n; ++i) {
      w.U8(found[i]);
      w.Str(values[i]);
    }
    return out;
  }

  std::string RangeOp(const std::string& ns, const std::string& name,
                      std::string_view args) {
    wire::Reader r(args);
    uint64_t first, n;
    if (!r.U64(&first) || !r.U64(&n))
      return Error(StateCode::kInvalid, "malformed range request");
    n = std::min<uint64_t>(n, 1 << 20);
    std::vector<std::string> vals;
    uint64_t at = first;
    while (vals.size() < n) {
      std::string sub;
      wire::Writer w(&sub);
      w.U64(at);
      w.U64(n - vals.size());
      std::string reply =
          Route(ns, name, StateKind::kVector, at, StateOp::kVecRange, sub);
      if (reply[0] != 0) return reply;
      wire::Reader rr(std::string_view(reply).substr(1));
      uint32_t m;
      if (!rr.U32(&m)) return Error(StateCode::kInternal, "bad shard reply");
      for (uint32_t i = 0; i < m; ++i) {
        std::string_view v;
        if (!rr.Str(&v)) return Error(StateCode::kInternal, "bad shard reply");
        vals.emplace_back(v);
      }
      if (m == 0) break;  // past the end
      at += m;
    }
    std::string out(1, '\0');
    wire::Writer w(&out);
    w.U32(static_cast<uint32_t>(vals.size()));
    for (auto& v : vals) w.Str(v);
    return out;
  }

  // ---- migration (source side) ----

  absl::StatusOr<pv1::MigrateShardResponse> Migrate(
      uint64_t id, const std::string& target,
      std::chrono::system_clock::time_point deadline) {
    auto start = Clock::now();
    std::shared_ptr<HostedShard> hs = Find(id);
    if (!hs) return absl::NotFoundError(absl::StrCat("no shard ", id, " here"));
    if (target == address)
      return absl::InvalidArgumentError("the shard is already on that node");
    // However the move ends, writers stop waiting.
    struct Unthrottle {
      HostedShard* shard;
      ~Unthrottle() { shard->throttle_us.store(0, std::memory_order_relaxed); }
    } unthrottle{hs.get()};
    std::string hello = Hello();
    if (hello.empty())
      return absl::UnavailableError("no data-port key from the gateway yet");
    auto fd = Dial(target);
    if (!fd.ok()) return fd.status();
    PeerConn conn;
    conn.fd = *fd;
    if (auto s = WriteBytesFrame(conn.fd, hello); !s.ok()) return s;
    conn.reader = std::make_unique<FrameReader>(*fd, 4096);
    pv1::ShardInfo info;
    {
      absl::MutexLock l(&hs->mu);
      if (hs->gone) return absl::NotFoundError("the shard moved away");
      if (hs->arena() == nullptr) return absl::InternalError("empty shard");
      if (hs->frozen || hs->merged_into || hs->arena()->tracking())
        return absl::FailedPreconditionError("the shard is already moving");
      hs->arena()->TakeDirty();
      hs->arena()->TrackWrites(true);
      info = hs->info;
      info.set_epoch(info.epoch() + 1);
    }
    auto abort = [&](absl::Status s) {
      absl::MutexLock l(&hs->mu);
      if (hs->frozen && !hs->gone) hs->Publish(true);
      hs->frozen = false;
      if (auto* a = hs->arena()) a->TrackWrites(false);
      return s;
    };
    std::string begin;
    {
      wire::Writer w(&begin);
      w.U8(static_cast<uint8_t>(PeerOp::kMigrateBegin));
      w.Str(info.SerializeAsString());
    }
    if (auto s = WriteBytesFrame(conn.fd, begin); !s.ok()) return abort(s);

    // Appends the chunk frames for [off, off+len) of the arena to *out;
    // false when the shard was dropped meanwhile. Caller holds hs->mu.
    uint64_t sent = 0;
    auto frames = [&](uint64_t off, uint64_t len,
                      std::string* out) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      proclets::Arena* a = hs->arena();
      if (a == nullptr) return false;
      const uint64_t used = a->used(), end = off + len;
      for (; off < end; off += kChunkBytes) {
        uint64_t n = std::min<uint64_t>(kChunkBytes, end - off);
        uint64_t m = off < used ? std::min<uint64_t>(n, used - off) : 0;
        std::string chunk;
        wire::Writer w(&chunk);
        w.U8(static_cast<uint8_t>(PeerOp::kMigrateChunk));
        w.U64(off);
        w.U64(used);
        w.Str(std::string_view(a->data() + off, m));
        AppendFrame(out, chunk);
        sent += n;
      }
      return true;
    };
    // Sends [off, off+len), a chunk at a time, copying each chunk under the
    // shard's lock (writers wait at most one chunk's copy) and sending it
    // without.
    std::string batch;
    auto send_range = [&](uint64_t off, uint64_t len) -> absl::Status {
      for (uint64_t end = off + len; off < end; off += kChunkBytes) {
        batch.clear();
        {
          absl::MutexLock l(&hs->mu);
          if (!frames(off, std::min<uint64_t>(kChunkBytes, end - off), &batch))
            return absl::AbortedError("the shard was dropped");
        }
        if (auto s = WriteAll(conn.fd, batch); !s.ok()) return s;
      }
      return absl::OkStatus();
    };

    uint64_t used = 0;
    {
      absl::MutexLock l(&hs->mu);
      if (hs->arena()) used = hs->arena()->used();
    }
    if (auto s = send_range(0, used); !s.ok()) return abort(s);
    uint32_t rounds = 1;
    uint64_t last_round_bytes = used;
    while (rounds < kMaxPrecopyRounds) {
      std::vector<std::pair<uint64_t, uint64_t>> dirty;
      {
        absl::MutexLock l(&hs->mu);
        if (hs->arena() == nullptr) return abort(absl::AbortedError("dropped"));
        dirty = hs->arena()->TakeDirty();
      }
      uint64_t bytes = 0;
      for (auto& [o, n] : dirty) bytes += n;
      // Stop when little changed, or when writers dirty about as much per
      // round as a round sends (more rounds would not shrink the rest) and
      // what is left is still small.
      bool converging = rounds == 1 || bytes < last_round_bytes * 3 / 4;
      last_round_bytes = bytes;
      if (!converging) {  // slow the writers down, more each time
        uint32_t t = hs->throttle_us.load(std::memory_order_relaxed);
        hs->throttle_us.store(std::min<uint32_t>(std::max(2 * t, 100u), 3200),
                              std::memory_order_relaxed);
      }
      if (bytes < kFinalRoundBytes ||
          (!converging && bytes < kMaxFinalRoundBytes)) {
        // Put them back for the final round: simplest is to resend them
        // there.
        absl::MutexLock l(&hs->mu);
        if (hs->arena() == nullptr) return abort(absl::AbortedError("dropped"));
        for (auto& [o, n] : dirty) hs->arena()->MarkDirty(o, n);
        break;
      }
      ++rounds;
      for (auto& [o, n] : dirty)
        if (auto s = send_range(o, n); !s.ok()) return abort(s);
    }

    // Wait until the target has applied everything sent so far, so that the
    // pause below holds writes only for the last changes, not for the tail
    // of the copy still in flight.
    {
      std::string sync(1, static_cast<char>(PeerOp::kMigrateSync)), reply;
      absl::Status s = WriteBytesFrame(conn.fd, sync);
      if (s.ok()) s = conn.reader->Next(&reply);
      if (s.ok() && (reply.empty() || reply[0] != 0))
        s = absl::InternalError("target lost the migration");
      if (!s.ok()) return abort(s);
    }

    if (std::chrono::system_clock::now() > deadline)
      return abort(absl::DeadlineExceededError(
          absl::StrCat("moving shard ", id, " ran out of time; it stays")));

    // Final round: hold writes, send what changed and the final size, commit.
    Clock::time_point pause_start;
    absl::Status commit;
    std::unique_ptr<MapShard> old_map;
    std::unique_ptr<VectorShard> old_vec;
    std::unique_ptr<QueueShard> old_queue;
    // The last changes are copied under the lock and sent without it:
    // `frozen` keeps writers out (the state loop never waits for it).
    {
      absl::MutexLock l(&hs->mu);
      hs->frozen = true;
      hs->Publish(false);  // local readers ask the host, which waits
      pause_start = Clock::now();
      batch.clear();
      proclets::Arena* a = hs->arena();
      if (a == nullptr) {
        commit = absl::AbortedError("the shard was dropped");
      } else {
        for (auto& [o, n] : a->TakeDirty()) frames(o, n, &batch);
        std::string req;
        wire::Writer w(&req);
        w.U8(static_cast<uint8_t>(PeerOp::kMigrateCommit));
        w.U64(a->used());
        AppendFrame(&batch, req);
      }
    }
    std::string reply;
    if (commit.ok()) commit = WriteAll(conn.fd, batch);
    if (commit.ok()) commit = conn.reader->Next(&reply);  // the target installs
    if (commit.ok() && (reply.empty() || reply[0] != 0))
      commit = absl::InternalError(
          absl::StrCat("target refused the shard: ",
                       reply.empty() ? "empty reply" : reply.substr(1)));
    {
      absl::MutexLock l(&hs->mu);
      if (commit.ok() && (hs->gone || hs->arena() == nullptr))
        commit = absl::AbortedError("the shard was dropped during the move");
      if (commit.ok()) {
        hs->gone = true;
        hs->frozen = false;
        hs->moved_to = target;
        hs->moved_epoch = info.epoch();
        // Freed by the reaper, after the pause and off the mover's path.
        old_map = std::move(hs->map);
        old_vec = std::move(hs->vec);
        old_queue = std::move(hs->queue);
      }
    }
    if (!commit.ok()) return abort(commit);
    double pause_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - pause_start)
            .count();
    reaper.Free(std::move(old_map));
    reaper.Free(std::move(old_vec));
    reaper.Free(std::move(old_queue));
    pv1::MigrateShardResponse res;
    res.set_epoch(info.epoch());
    res.set_bytes(sent);
    res.set_rounds(rounds);
    res.set_pause_ms(pause_ms);
    res.set_total_ms(
        std::chrono::duration<double, std::milli>(Clock::now() - start)
            .count());
    return res;
  }
};

ProcletHost::ProcletHost(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcletHost::~ProcletHost() = default;

absl::StatusOr<std::unique_ptr<ProcletHost>> ProcletHost::Start(
    ProcletHostOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  auto hp = SplitHostPort(impl->options.data_listen);
  if (!hp.ok()) return hp.status();
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(hp->second);
  if (inet_pton(AF_INET, hp->first.c_str(), &sa.sin_addr) != 1)
    return absl::InvalidArgumentError(
        absl::StrCat("bad data address ", impl->options.data_listen));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      listen(fd, 128) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen for data on ",
                                               impl->options.data_listen, ": ",
                                               strerror(err)));
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  impl->listener = fd;
  impl->address = absl::StrCat(hp->first, ":", ntohs(sa.sin_port));
  Impl* raw = impl.get();
  StateLoopBackend backend;
  backend.fast = [raw](const std::string& ns, std::string_view req) {
    return raw->Fast(ns, req);
  };
  backend.slow = [raw](const std::string& ns, const std::string& function,
                       std::string_view req) {
    t_function = function;
    try {
      return raw->HandleInstance(ns, req);
    } catch (const std::exception& e) {  // last line of defence
      fprintf(stderr, "silt-invoker: state request of namespace %s: %s\n",
              ns.c_str(), e.what());
      return Error(StateCode::kInternal, "internal error");
    }
  };
  backend.share = [raw](const std::string& ns, std::string_view req) {
    return raw->Share(ns, req);
  };
  backend.final_reply = [](std::string_view reply) {
    return Impl::IsFinal(reply);
  };
  backend.broken_reply = [](const std::string& peer) {
    return Error(StateCode::kUnavailable,
                 absl::StrCat("lost the connection to ", peer,
                              " during the operation (it may or may not "
                              "have been applied)"));
  };
  backend.hello = [raw] { return raw->Hello(); };
  backend.internal_error = [] {
    return Error(StateCode::kInternal, "internal error");
  };
  auto loop = StateLoop::Start(std::move(backend), wire::kMaxFrameBytes);
  if (!loop.ok()) return loop.status();
  impl->loop = *std::move(loop);
  impl->acceptor = std::thread([raw] { raw->AcceptLoop(); });
  return std::unique_ptr<ProcletHost>(new ProcletHost(std::move(impl)));
}

std::string ProcletHost::data_address() const { return impl_->address; }

void ProcletHost::SetDataKey(const std::string& key) {
  absl::MutexLock l(&impl_->key_mu);
  impl_->data_key = key;
}

void ProcletHost::Attach(int fd, const std::string& ns,
                         const std::string& function) {
  impl_->loop->Attach(fd, ns, function);
}

absl::Status ProcletHost::CreateShard(const pv1::ShardInfo& info) {
  if (impl_->Find(info.id()))
    return absl::AlreadyExistsError(
        absl::StrCat("shard ", info.id(), " is already here"));
  auto arena = proclets::Arena::Create();
  if (!arena.ok()) return arena.status();
  auto hs = std::make_shared<HostedShard>();
  {
    absl::MutexLock l(&hs->mu);
    hs->info = info;
    switch (info.kind()) {
      case pv1::KIND_MAP: {
        auto m = MapShard::Create();
        if (!m.ok()) return m.status();
        hs->map = *std::move(m);
        hs->Publish(true);
        break;
      }
      case pv1::KIND_VECTOR: {
        auto v = VectorShard::Create(info.lo());
        if (!v.ok()) return v.status();
        hs->vec = *std::move(v);
        break;
      }
      case pv1::KIND_QUEUE: {
        auto q = QueueShard::Create();
        if (!q.ok()) return q.status();
        hs->queue = *std::move(q);
        break;
      }
      default:
        return absl::InvalidArgumentError("unknown shard kind");
    }
  }
  absl::MutexLock l(&impl_->mu);
  impl_->shards[info.id()] = std::move(hs);
  return absl::OkStatus();
}

void ProcletHost::DropShards(const std::vector<uint64_t>& ids) {
  std::vector<std::shared_ptr<HostedShard>> dropped;
  {
    absl::MutexLock l(&impl_->mu);
    for (uint64_t id : ids) {
      auto it = impl_->shards.find(id);
      if (it == impl_->shards.end()) continue;
      dropped.push_back(it->second);
      impl_->shards.erase(it);
    }
  }
  for (auto& hs : dropped) {
    absl::MutexLock l(&hs->mu);
    hs->gone = true;
    hs->moved_to.clear();
    hs->map.reset();
    hs->vec.reset();
    hs->queue.reset();
  }
}

absl::StatusOr<pv1::MigrateShardResponse> ProcletHost::Migrate(
    uint64_t id, const std::string& target,
    std::chrono::system_clock::time_point deadline) {
  auto res = impl_->Migrate(id, target, deadline);
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
  std::shared_ptr<HostedShard> hs = impl_->Find(id);
  if (!hs) return absl::NotFoundError(absl::StrCat("no shard ", id, " here"));
  if (impl_->Find(new_id))
    return absl::AlreadyExistsError(absl::StrCat("shard ", new_id, " exists"));
  auto child = std::make_shared<HostedShard>();
  pv1::SplitShardResponse res;
  {
    absl::MutexLock l(&hs->mu);
    if (hs->gone || hs->frozen || hs->merged_into || !hs->arena() ||
        hs->arena()->tracking())
      return absl::FailedPreconditionError("the shard is moving");
    uint64_t at = 0;
    absl::MutexLock cl(&child->mu);
    child->info = hs->info;
    child->info.set_id(new_id);
    if (hs->map) {
      auto mid = hs->map->MedianHash();
      if (!mid || *mid <= hs->info.lo())
        return absl::FailedPreconditionError("too few keys to split");
      at = *mid;
      hs->Publish(false);  // its range is about to shrink
      auto upper = hs->map->SplitOff(at);
      if (!upper.ok()) {
        hs->Publish(true);
        return upper.status();
      }
      child->map = *std::move(upper);
    } else if (hs->vec) {
      if (hs->vec->count() < 2)
        return absl::FailedPreconditionError("too few elements to split");
      at = hs->vec->first() + hs->vec->count() / 2;
      auto upper = hs->vec->SplitOff(at);
      if (!upper.ok()) return upper.status();
      child->vec = *std::move(upper);
    } else {
      return absl::FailedPreconditionError("queues do not split");
    }
    child->info.set_lo(at);
    child->info.set_hi(hs->info.hi());
    hs->info.set_hi(at);
    hs->Publish(true);
    child->Publish(true);
    hs->splits.emplace_back(at, child);
    *res.mutable_lower() = hs->info;
    *res.mutable_upper() = child->info;
    res.mutable_lower()->set_bytes(hs->arena()->used());
    res.mutable_upper()->set_bytes(child->arena()->used());
  }
  absl::MutexLock l(&impl_->mu);
  impl_->shards[new_id] = std::move(child);
  return res;
}

absl::StatusOr<pv1::ShardInfo> ProcletHost::Merge(uint64_t keep_id,
                                                  uint64_t absorb_id) {
  std::shared_ptr<HostedShard> keep = impl_->Find(keep_id);
  std::shared_ptr<HostedShard> absorb = impl_->Find(absorb_id);
  if (!keep || !absorb || keep == absorb)
    return absl::NotFoundError(absl::StrCat("shards ", keep_id, " and ",
                                            absorb_id, " are not both here"));
  // Lock order: by id.
  HostedShard* first = keep_id < absorb_id ? keep.get() : absorb.get();
  HostedShard* second = keep_id < absorb_id ? absorb.get() : keep.get();
  absl::MutexLock l1(&first->mu);
  absl::MutexLock l2(&second->mu);
  auto busy = [](HostedShard& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu) {
    return h.gone || h.frozen || h.merged_into || h.arena() == nullptr ||
           h.arena()->tracking();
  };
  if (busy(*keep) || busy(*absorb))
    return absl::FailedPreconditionError("one of the shards is moving");
  if (keep->info.hi() != absorb->info.lo() ||
      keep->info.kind() != absorb->info.kind())
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", absorb_id, " does not follow shard ", keep_id));
  absl::Status s = absl::FailedPreconditionError("queues do not merge");
  keep->Publish(false);
  absorb->Publish(false);
  if (keep->map && absorb->map) s = keep->map->Absorb(*absorb->map);
  if (keep->vec && absorb->vec) s = keep->vec->Absorb(*absorb->vec);
  if (!s.ok()) {
    keep->Publish(true);
    absorb->Publish(true);
    return s;
  }
  // Children split off into what is keep's range again no longer apply.
  std::erase_if(keep->splits, [&](const auto& split) {
    return split.first >= keep->info.hi() && split.first < absorb->info.hi();
  });
  keep->info.set_hi(absorb->info.hi());
  keep->Publish(true);
  absorb->map.reset();
  absorb->vec.reset();
  absorb->merged_into = keep;
  pv1::ShardInfo out = keep->info;
  out.set_bytes(keep->arena()->used());
  out.set_count(keep->count());
  return out;
}

void ProcletHost::ForgetLayout(const std::string& ns, const std::string& name) {
  absl::MutexLock l(&impl_->layouts_mu);
  impl_->layouts.erase(Impl::LayoutKey(ns, name));
}

uint64_t ProcletHost::ops() const {
  return impl_->ops.load(std::memory_order_relaxed);
}

std::vector<pv1::ShardInfo> ProcletHost::Shards() const {
  std::vector<std::shared_ptr<HostedShard>> all;
  {
    absl::MutexLock l(&impl_->mu);
    for (auto& [id, hs] : impl_->shards) all.push_back(hs);
  }
  std::vector<pv1::ShardInfo> out;
  for (auto& hs : all) {
    absl::MutexLock l(&hs->mu);
    if (hs->gone || hs->merged_into) continue;
    pv1::ShardInfo info = hs->info;
    proclets::Arena* a = hs->arena();
    info.set_bytes(a ? a->used() : 0);
    info.set_count(hs->count());
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace silt::invoker
