// A function that does what its path asks: the integration tests' probe.
#include <sched.h>
#include <silt/function.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string Param(std::string_view query, std::string_view key) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    std::string_view kv = query.substr(
        pos, amp == std::string_view::npos ? query.npos : amp - pos);
    size_t eq = kv.find('=');
    if (kv.substr(0, eq) == key)
      return std::string(eq == kv.npos ? "" : kv.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    pos = amp + 1;
  }
  return "";
}

std::string init_state;
// STATE_MB of heap filled in init (the cold-start benchmark's state), and a
// checksum of it that calls recompute.
std::vector<char> state;
uint64_t state_sum = 0;
std::mt19937_64 engine;
int restores = 0;

uint64_t Sum(const std::vector<char>& v) {
  uint64_t s = 0;
  for (size_t i = 0; i < v.size(); i += 4096) s = s * 31 + v[i];
  return s;
}

void Init(silt::Context& ctx) {
  init_state = "initialized:" + std::string(ctx.function_name());
  if (const char* mb = getenv("STATE_MB")) {
    state.resize(std::strtoul(mb, nullptr, 10) << 20);
    for (size_t i = 0; i < state.size(); i += 4096)
      state[i] = static_cast<char>(i / 4096 * 7);
    state_sum = Sum(state);
  }
  engine.seed(std::random_device{}());
}

// What a function does in its after-restore hook: re-seed what it seeded in
// init, so that clones of one snapshot do not share a random stream.
void AfterRestore(silt::Context&) {
  engine.seed(std::random_device{}());
  ++restores;
}

// A state error as the test sees it: "<code name>: <message>".
silt::Response StateError(silt::StateCode c, const std::string& msg) {
  int status = c == silt::StateCode::kNotFound    ? 404
               : c == silt::StateCode::kInvalid   ? 400
               : c == silt::StateCode::kTooLarge  ? 413
               : c == silt::StateCode::kTimeout   ? 408
               : c == silt::StateCode::kWrongKind ? 409
                                                  : 503;
  return silt::Response::Text(
      status, std::string(silt::wire::StateCodeName(c)) + ": " + msg);
}

// /kv/{get,put,erase,size,mput,mget}, /vec/{push,get,size}, /q/{push,pop}:
// the state SDK driven by query parameters (name, k, v, n, i, ms).
silt::Response StateCall(std::string_view path, const silt::Request& req,
                         silt::Context& ctx) {
  std::string name = Param(req.query, "name");
  if (name.empty()) name = "kv";
  if (path.substr(0, 4) == "/kv/") {
    silt::StateOptions o;  // &shards=N: a new map starts with N shards
    o.initial_shards = std::atoi(Param(req.query, "shards").c_str());
    auto m = ctx.Map<std::string, std::string>(name, o);
    std::string op(path.substr(4)), k = Param(req.query, "k");
    if (op == "get") {
      auto r = m.Get(k);
      return r.ok() ? silt::Response::Text(200, *r)
                    : StateError(r.code(), r.message());
    }
    if (op == "put") {
      std::string v =
          req.body.empty() ? Param(req.query, "v") : std::string(req.body);
      auto r = m.Put(k, v);
      return r.ok() ? silt::Response::Text(200, "ok")
                    : StateError(r.code(), r.message());
    }
    if (op == "erase") {
      auto r = m.Erase(k);
      return r.ok() ? silt::Response::Text(200, *r ? "erased" : "absent")
                    : StateError(r.code(), r.message());
    }
    if (op == "size") {
      auto r = m.Size();
      return r.ok() ? silt::Response::Text(200, std::to_string(*r))
                    : StateError(r.code(), r.message());
    }
    if (op == "watch") {
      // Reads k (an integer) until it reaches `until` or `ms` pass; answers
      // 500 if a read ever saw it go back. The body: reads, last value, and
      // whether the process maps a shard arena (reads served in place).
      long until = std::atol(Param(req.query, "until").c_str()), last = 0;
      auto deadline =
          std::chrono::steady_clock::now() +
          std::chrono::milliseconds(std::atoi(Param(req.query, "ms").c_str()));
      long reads = 0;
      while (last < until && std::chrono::steady_clock::now() < deadline) {
        auto r = m.Get(k);
        if (!r.ok()) return StateError(r.code(), r.message());
        long v = std::atol(r->c_str());
        ++reads;
        if (v < last)
          return silt::Response::Text(500, "went back from " +
                                               std::to_string(last) + " to " +
                                               std::to_string(v));
        last = v;
      }
      std::ifstream maps("/proc/self/maps");
      std::stringstream text;
      text << maps.rdbuf();
      return silt::Response::Text(
          200,
          "reads=" + std::to_string(reads) + " last=" + std::to_string(last) +
              " mapped=" +
              (text.str().find("silt-arena") != std::string::npos ? "1" : "0"));
    }
    if (op == "churn") {
      // For up to `ms` milliseconds and n keys: inserts p{i} (fillers of
      // varying length: the shard grows, its index is rebuilt) and rewrites
      // p{i/2} to v{i/2} (in place or moved). Answers "N R": N keys
      // inserted, the first R of them rewritten, every write acknowledged.
      int n = std::atoi(Param(req.query, "n").c_str());
      std::string p = Param(req.query, "p"), v = Param(req.query, "v");
      auto deadline =
          std::chrono::steady_clock::now() +
          std::chrono::milliseconds(std::atoi(Param(req.query, "ms").c_str()));
      int i = 0;
      for (; i < n && std::chrono::steady_clock::now() < deadline; ++i) {
        auto r = m.Put(p + std::to_string(i), std::string(20 + i % 100, 'o'));
        if (r.ok())
          r = m.Put(p + std::to_string(i / 2), v + std::to_string(i / 2));
        if (!r.ok()) return StateError(r.code(), r.message());
      }
      return silt::Response::Text(
          200,
          std::to_string(i) + " " + std::to_string(i == 0 ? 0 : (i + 1) / 2));
    }
    if (op == "mput") {  // n keys k0..k{n-1} with prefix p, value v
      int n = std::atoi(Param(req.query, "n").c_str());
      std::string p = Param(req.query, "p"), v = Param(req.query, "v");
      std::vector<std::pair<std::string, std::string>> kvs;
      for (int i = 0; i < n; ++i)
        kvs.emplace_back(p + std::to_string(i), v + std::to_string(i));
      auto r = m.MultiPut(kvs);
      return r.ok() ? silt::Response::Text(200, "ok")
                    : StateError(r.code(), r.message());
    }
    if (op == "scan") {  // "<entries seen> <distinct keys>" by Map::Scan
      auto scan = m.Scan();
      size_t seen = 0;
      std::set<std::string> keys;
      while (true) {
        auto batch = scan.Next();
        if (!batch.ok()) return StateError(batch.code(), batch.message());
        if (batch->empty()) break;
        for (const auto& [key, value] : *batch) {
          ++seen;
          keys.insert(key);
        }
      }
      return silt::Response::Text(
          200, std::to_string(seen) + " " + std::to_string(keys.size()));
    }
    if (op == "merase") {  // erases p0..p{n-1}; answers how many were there
      int n = std::atoi(Param(req.query, "n").c_str());
      std::string p = Param(req.query, "p");
      int erased = 0;
      for (int i = 0; i < n; ++i) {
        auto r = m.Erase(p + std::to_string(i));
        if (!r.ok()) return StateError(r.code(), r.message());
        erased += *r;
      }
      return silt::Response::Text(200, std::to_string(erased));
    }
    if (op == "mget") {  // how many of p0..p{n-1} hold v{i}
      int n = std::atoi(Param(req.query, "n").c_str());
      std::string p = Param(req.query, "p"), v = Param(req.query, "v");
      std::vector<std::string> keys;
      for (int i = 0; i < n; ++i) keys.push_back(p + std::to_string(i));
      auto r = m.MultiGet(keys);
      if (!r.ok()) return StateError(r.code(), r.message());
      int good = 0;
      for (int i = 0; i < n; ++i)
        good += (*r)[i].has_value() && *(*r)[i] == v + std::to_string(i);
      return silt::Response::Text(200, std::to_string(good));
    }
  }
  if (path.substr(0, 5) == "/vec/") {
    auto vec = ctx.Vector<int64_t>(name);
    std::string op(path.substr(5));
    if (op == "push") {
      auto r = vec.PushBack(std::atoll(Param(req.query, "v").c_str()));
      return r.ok() ? silt::Response::Text(200, std::to_string(*r))
                    : StateError(r.code(), r.message());
    }
    if (op == "get") {
      auto r =
          vec.Get(std::strtoull(Param(req.query, "i").c_str(), nullptr, 10));
      return r.ok() ? silt::Response::Text(200, std::to_string(*r))
                    : StateError(r.code(), r.message());
    }
    if (op == "size") {
      auto r = vec.Size();
      return r.ok() ? silt::Response::Text(200, std::to_string(*r))
                    : StateError(r.code(), r.message());
    }
  }
  if (path.substr(0, 3) == "/q/") {
    auto q = ctx.Queue<std::string>(name);
    std::string op(path.substr(3));
    if (op == "push") {
      auto r = q.Push(std::string(req.body));
      return r.ok() ? silt::Response::Text(200, "ok")
                    : StateError(r.code(), r.message());
    }
    if (op == "pop") {
      auto r = q.Pop(
          std::chrono::milliseconds(std::atoi(Param(req.query, "ms").c_str())));
      return r.ok() ? silt::Response::Text(200, *r)
                    : StateError(r.code(), r.message());
    }
  }
  return silt::Response::Text(404, "unknown state route");
}

// Compute tasks for the tests: one that breaks the sandbox's seccomp policy
// on its first element, and one that counts the elements it saw in a map.
void Forbidden(silt::Context&, uint64_t, const int64_t&) {
  syscall(SYS_unshare, CLONE_NEWUSER);  // not on the seccomp allow list
}
SILT_TASK(Forbidden);
void CountSeen(silt::Context& ctx, uint64_t index, const int64_t& v) {
  auto seen = ctx.Map<std::string, int64_t>("seen");
  seen.Put("i" + std::to_string(index), v).ok();
}
SILT_TASK(CountSeen);
int64_t Twice(const int64_t& v) { return 2 * v; }
SILT_TASK(Twice);
int64_t Twice2(const int64_t& v) { return 2 * v; }  // not registered
// Over a map: copies each entry it sees into "seen-entries"; appends "!".
void CopyEntry(silt::Context& ctx, const std::string& k, const std::string& v) {
  ctx.Map<std::string, std::string>("seen-entries").Put(k, v).ok();
}
SILT_TASK(CopyEntry);
std::string Exclaim(const std::string& v) { return v + "!"; }
SILT_TASK(Exclaim);

// /compute/{forbidden,count,twice,unregistered}?name=V[&out=W]: a job over
// vector V; answers "ok" or the job's error as StateError does.
// /compute/{map-copy,map-exclaim}?name=M[&out=N]: a job over map M; answers
// where it ran ("node=entries/shares ...").
silt::Response ComputeCall(std::string_view op, const silt::Request& req,
                           silt::Context& ctx) {
  if (op == "map-copy" || op == "map-exclaim") {  // jobs over map `name`
    auto in = ctx.Map<std::string, std::string>(Param(req.query, "name"));
    auto out = ctx.Map<std::string, std::string>(Param(req.query, "out"));
    auto job = op == "map-copy" ? ctx.ParallelFor(in, CopyEntry)
                                : ctx.Map(in, Exclaim, out);
    silt::Status st = job.Get();
    if (!st.ok()) return StateError(st.code(), st.message());
    std::string where;  // "node=entries/shares ..."
    for (const auto& p : job.placement())
      where += p.node + "=" + std::to_string(p.elements) + "/" +
               std::to_string(p.shares) + " ";
    return silt::Response::Text(200, where);
  }
  auto in = ctx.Vector<int64_t>(Param(req.query, "name"));
  auto out = ctx.Vector<int64_t>(Param(req.query, "out"));
  silt::Status st = silt::Status(silt::Done{});
  if (op == "forbidden")
    st = ctx.ParallelFor(in, Forbidden).Get();
  else if (op == "count")
    st = ctx.ParallelFor(in, CountSeen).Get();
  else if (op == "twice")
    st = ctx.Map(in, Twice, out).Get();
  else if (op == "unregistered")
    st = ctx.Map(in, Twice2, out).Get();
  else
    return silt::Response::Text(404, "unknown compute route");
  return st.ok() ? silt::Response::Text(200, "ok")
                 : StateError(st.code(), st.message());
}

// Calls inside this instance at once: /overlap?n=N waits (at most wait_ms,
// default 10 s) until N calls were inside together, then answers with the
// most it saw and the call id it ran under (each call has its own).
std::mutex overlap_mu;
std::condition_variable overlap_cv;
int overlap_inside = 0, overlap_most = 0;

silt::Response Overlap(const silt::Request& req, silt::Context& ctx) {
  int n = std::atoi(Param(req.query, "n").c_str());
  std::string wait = Param(req.query, "wait_ms");
  auto wait_ms =
      std::chrono::milliseconds(wait.empty() ? 10000 : std::atoi(wait.c_str()));
  std::unique_lock<std::mutex> l(overlap_mu);
  overlap_most = std::max(overlap_most, ++overlap_inside);
  overlap_cv.notify_all();
  overlap_cv.wait_for(l, wait_ms, [n] { return overlap_most >= n; });
  int most = overlap_most;
  --overlap_inside;
  l.unlock();
  return silt::Response::Text(
      200, "together=" + std::to_string(most) +
               " instance=" + std::string(ctx.instance_id()) +
               " call=" + std::string(ctx.call_id()));
}

// Thread-safe when its deployment says so (PROBE_CONCURRENCY=N: up to N calls
// at once per instance); one call at a time otherwise.
uint32_t ProbeConcurrency() {
  const char* n = getenv("PROBE_CONCURRENCY");
  return n != nullptr ? static_cast<uint32_t>(std::atoi(n)) : 1;
}

char StreamByte(uint64_t i) { return static_cast<char>((i * 131) ^ (i >> 16)); }

silt::Response Handle(const silt::Request& req, silt::Context& ctx) {
  std::string_view path = req.path;
  if (path.substr(0, 9) == "/compute/")
    return ComputeCall(path.substr(9), req, ctx);
  if (path.substr(0, 4) == "/kv/" || path.substr(0, 5) == "/vec/" ||
      path.substr(0, 3) == "/q/")
    return StateCall(path, req, ctx);
  if (path == "/env") {
    const char* v = getenv(Param(req.query, "name").c_str());
    return silt::Response::Text(200, v ? v : "<unset>");
  }
  if (path == "/secret") {
    return silt::Response::Text(
        200, ctx.Secret(Param(req.query, "name")).value_or("<none>"));
  }
  if (path == "/alloc") {
    size_t mb = std::strtoul(Param(req.query, "mb").c_str(), nullptr, 10);
    std::vector<char*> blocks;
    for (size_t i = 0; i < mb; ++i) {
      char* b = static_cast<char*>(malloc(1 << 20));
      memset(b, 1, 1 << 20);
      blocks.push_back(b);
    }
    for (char* b : blocks) free(b);
    return silt::Response::Text(200,
                                "allocated " + std::to_string(mb) + " MiB");
  }
  if (path == "/forbidden") {
    syscall(SYS_unshare, CLONE_NEWUSER);  // not on the seccomp allow list
    return silt::Response::Text(200, "still alive?");
  }
  if (path == "/events") {
    // Server-sent events, each written only once the queue `q` has an item
    // (the test pushes one after reading the event before): an event that
    // reached the caller only at the end would stall this for good.
    int n = std::atoi(Param(req.query, "n").c_str());
    auto go = ctx.Queue<std::string>(Param(req.query, "q"));
    if (!ctx.BeginResponse(200, {{"Content-Type", "text/event-stream"},
                                 {"Cache-Control", "no-cache"}}))
      return {};
    for (int i = 1; i <= n; ++i) {
      if (!ctx.Write("data: event " + std::to_string(i) + "\n\n")) return {};
      if (i < n && !go.Pop(std::chrono::seconds(30)).ok())
        return {200, {}, "data: nobody said go\n\n"};
    }
    return {200, {}, "data: end\n\n"};
  }
  if (path == "/count") {
    // The body's size and how many of its bytes are not StreamByte(i).
    uint64_t wrong = 0;
    for (size_t i = 0; i < req.body.size(); ++i)
      wrong += req.body[i] != StreamByte(i);
    return silt::Response::Text(200, "size=" + std::to_string(req.body.size()) +
                                         " wrong=" + std::to_string(wrong));
  }
  if (path == "/stream") {
    // `mb` MiB in parts of 64 KiB: byte i is StreamByte(i).
    uint64_t total = std::strtoull(Param(req.query, "mb").c_str(), nullptr, 10)
                     << 20;
    ctx.BeginResponse(200, {{"Content-Type", "application/octet-stream"}});
    std::string part(64 << 10, '\0');
    for (uint64_t at = 0; at < total; at += part.size()) {
      for (size_t j = 0; j < part.size(); ++j) part[j] = StreamByte(at + j);
      if (!ctx.Write(part)) return {};
    }
    return {};
  }
  if (path == "/throw-midway") {
    ctx.BeginResponse(200, {{"Content-Type", "text/plain"}});
    ctx.Write("first part\n");
    throw std::runtime_error("failed after its first part");
  }
  if (path == "/sleep") {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::stoi(Param(req.query, "ms"))));
    return silt::Response::Text(200, "slept");
  }
  if (path == "/crash") abort();
  if (path == "/log") {
    ctx.Log(Param(req.query, "text"));
    return silt::Response::Text(200, "logged");
  }
  if (path == "/redirect") return {302, {{"Location", "/elsewhere"}}, ""};
  if (path == "/state") return silt::Response::Text(200, init_state);
  if (path == "/heap") {
    bool ok = Sum(state) == state_sum;
    return silt::Response::Text(ok ? 200 : 500,
                                std::to_string(state.size() >> 20) +
                                    (ok ? " MiB intact" : " MiB CORRUPTED"));
  }
  if (path == "/maps") {  // how the process's memory is backed
    std::ifstream in("/proc/self/maps");
    std::stringstream ss;
    ss << in.rdbuf();
    return silt::Response::Text(200, ss.str());
  }
  if (path == "/random") {
    return silt::Response::Text(200, std::to_string(engine()) + " " +
                                         std::to_string(random()) + " " +
                                         std::to_string(restores));
  }
  if (path == "/whoami") {  // ids here, and the host id uid 0 maps to
    std::ifstream in("/proc/self/uid_map");
    unsigned long inside = 0, host = 0, count = 0;
    in >> inside >> host >> count;
    return silt::Response::Text(
        200, "uid=" + std::to_string(getuid()) + " gid=" +
                 std::to_string(getgid()) + " maps " + std::to_string(inside) +
                 "->" + std::to_string(host) + "x" + std::to_string(count));
  }
  if (path == "/read") {  // can this instance read a file?
    std::string file = Param(req.query, "path");
    FILE* f = fopen(file.c_str(), "r");
    if (f == nullptr)
      return silt::Response::Text(403,
                                  std::string("denied: ") + strerror(errno));
    fclose(f);
    return silt::Response::Text(200, "readable");
  }
  if (path == "/identity")
    return silt::Response::Text(200, std::string(ctx.instance_id()));
  if (path == "/overlap") return Overlap(req, ctx);
  // Echo: what the function saw.
  silt::Response res;
  res.status = 200;
  res.headers.emplace_back("X-Method", std::string(req.method));
  res.headers.emplace_back("X-Path", std::string(req.path));
  res.headers.emplace_back("X-Query", std::string(req.query));
  res.headers.emplace_back("X-Seen-Call-Id",
                           std::string(req.Header("X-Call-Id")));
  res.headers.emplace_back("X-Seen-Forwarded-For",
                           std::string(req.Header("X-Forwarded-For")));
  res.headers.emplace_back("X-Seen-Custom",
                           std::string(req.Header("X-Custom")));
  res.headers.emplace_back("X-Call-Id-In-Context", std::string(ctx.call_id()));
  res.body = std::string(req.body);
  return res;
}

}  // namespace

SILT_INIT(Init)
SILT_HANDLER(Handle)
SILT_AFTER_RESTORE(AfterRestore)
SILT_CONCURRENCY(ProbeConcurrency())
