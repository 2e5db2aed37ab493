#include "gpu_proclets.h"

#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "frames.h"
#include "random_id.h"
#include "sandbox.h"
#include "silt/gpu_wire.h"

namespace silt::invoker {

using wire::GpuOp;
using wire::StateCode;

namespace {

// How long a proclet that moved away is remembered (late callers are sent
// after it).
constexpr std::chrono::seconds kMovedKept{120};
// Requests that follow a proclet from node to node before giving up.
constexpr int kMaxHops = 8;

absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }

std::string Reply(StateCode code, std::string_view message = {}) {
  std::string r(1, static_cast<char>(code));
  r.append(message);
  return r;
}

std::string MovedReply(const std::string& address) {
  std::string r(1, static_cast<char>(StateCode::kMoved));
  wire::Writer w(&r);
  w.Str(address);
  w.U64(0);
  return r;
}

StateCode CodeOf(std::string_view reply) {
  return reply.empty() ? StateCode::kInternal
                       : static_cast<StateCode>(static_cast<uint8_t>(reply[0]));
}

bool ReadFull(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

std::string ProcletKey(std::string_view ns, std::string_view function,
                       std::string_view name) {
  return absl::StrCat(Sv(ns), "/", Sv(function), "/", Sv(name));
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - t)
      .count();
}

bool ParseInfo(std::string_view reply, GpuProcletInfo* i) {
  if (CodeOf(reply) != StateCode::kOk) return false;
  wire::Reader r(reply.substr(1));
  std::string_view backend, device;
  if (!r.Str(&backend) || !r.Str(&device) || !r.U64(&i->memory_limit) ||
      !r.U64(&i->memory_used) || !r.U64(&i->launches))
    return false;
  i->backend = backend;
  i->device = device;
  return true;
}

}  // namespace

// One proclet held here: its process. `mu` serialises its requests (a
// launch is queued in order behind the ones before it) and a move.
struct GpuProclets::Proclet {
  std::string ns, function, name;
  std::string dir;  // DATA_DIR/gpu/<id>: its /tmp and (empty) bundle dir
  uint64_t memory_limit = 0;
  absl::Mutex mu;
  std::unique_ptr<SandboxedProcess> proc ABSL_GUARDED_BY(mu);
  int channel ABSL_GUARDED_BY(mu) = -1;
  // Its process ended (set under mu; read without it: never take mu under
  // GpuProclets::mu_, a move holds mu while it takes mu_).
  std::atomic<bool> lost{false};
  std::string moved_to ABSL_GUARDED_BY(mu);      // it moved there
  absl::Mutex info_mu;                           // after mu
  GpuProcletInfo last ABSL_GUARDED_BY(info_mu);  // as last asked

  ~Proclet() {
    {
      absl::MutexLock lock(&mu);
      EndLocked();
    }
    if (!dir.empty()) {
      umount2((dir + "/tmp").c_str(), MNT_DETACH);
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }

  void EndLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (channel >= 0) close(channel);
    channel = -1;
    proc.reset();  // kills and reaps
  }

  std::string Exchange(std::string_view request) {
    absl::MutexLock lock(&mu);
    return ExchangeLocked(request);
  }

  // One request and its reply; kMoved once it moved, kLost once its process
  // ended.
  std::string ExchangeLocked(std::string_view request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!moved_to.empty()) return MovedReply(moved_to);
    if (lost || proc == nullptr)
      return Reply(StateCode::kLost,
                   "the GPU proclet's process ended; its buffers are lost");
    uint64_t n = request.size();
    uint64_t m = 0;
    std::string reply;
    if (WriteFull(channel, &n, sizeof(n)) &&
        WriteFull(channel, request.data(), request.size()) &&
        ReadFull(channel, &m, sizeof(m)) && m < (uint64_t{1} << 40)) {
      reply.resize(m);
      if (ReadFull(channel, reply.data(), m) && !reply.empty()) return reply;
    }
    lost = true;
    int status = proc->Kill();
    std::string why = proc->cgroup().OomKilled() ? "out of memory"
                      : WIFSIGNALED(status)
                          ? absl::StrCat("killed by signal ", WTERMSIG(status),
                                         WTERMSIG(status) == SIGSYS
                                             ? " (a forbidden system call)"
                                             : "")
                          : absl::StrCat("exit status ", WEXITSTATUS(status));
    return Reply(StateCode::kLost,
                 absl::StrCat("the GPU proclet ", name, " of ", function,
                              " ended (", why, "); its buffers are lost"));
  }

  // What it holds: asked now (kInfo), or as last asked while a request or a
  // move holds it (a report never waits for a kernel).
  GpuProcletInfo Info() {
    if (mu.TryLock()) {
      GpuProcletInfo i;
      if (moved_to.empty() && !lost &&
          ParseInfo(ExchangeLocked(std::string(1, char(GpuOp::kInfo))), &i)) {
        absl::MutexLock l(&info_mu);
        last = i;
      }
      mu.Unlock();
    }
    absl::MutexLock l(&info_mu);
    return last;
  }
};

GpuProclets::GpuProclets(GpuProcletsOptions options)
    : options_(std::move(options)),
      peers_([this] { return options_.hello ? options_.hello() : ""; }, 4) {}

GpuProclets::~GpuProclets() {
  std::map<std::string, std::shared_ptr<Proclet>> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(proclets_);
  }
}

absl::StatusOr<std::shared_ptr<GpuProclets::Proclet>> GpuProclets::Start(
    const std::string& ns, const std::string& function, const std::string& name,
    uint64_t memory_limit, const std::string& backend) {
  auto p = std::make_shared<Proclet>();
  p->ns = ns;
  p->function = function;
  p->name = name;
  p->memory_limit = memory_limit;
  const std::string id = RandomId(12);
  p->dir = absl::StrCat(options_.data_dir, "/gpu/", id);
  std::error_code ec;
  for (const char* sub : {"/tmp", "/secrets", "/bundle"})
    std::filesystem::create_directories(p->dir + sub, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("making ", p->dir, ": ", ec.message()));
  if (auto s = MountTmp(p->dir + "/tmp", 64 << 20); !s.ok()) return s;
  int chan[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) != 0)
    return absl::InternalError("socketpair failed");
  SandboxSpec sb;
  sb.root_dir = options_.root_dir;
  sb.bundle_dir = p->dir + "/bundle";
  sb.secrets_dir = p->dir + "/secrets";
  sb.worker_dir = options_.worker_dir;
  sb.dev_dir = options_.dev_dir;
  sb.tmp_dir = p->dir + "/tmp";
  sb.host_id = HostIdOf(ns, function);
  sb.hostname = function;
  sb.cgroup = absl::StrCat(options_.cgroup_prefix, "/gpu-", id);
  // On the host backend its buffers are process memory: the limit, and room
  // for the process and its modules.
  sb.memory_limit_bytes = memory_limit > 0 ? memory_limit + (256u << 20) : 0;
  sb.argv = {
      absl::StrCat(kSandboxWorkerDir, "/silt-gpu-host"),
      absl::StrCat("--backend=", backend.empty() ? options_.backend : backend),
      absl::StrCat("--memory-limit=", memory_limit)};
  sb.env = {"PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"};
  sb.channel_fd = chan[1];
  sb.stdout_fd = STDERR_FILENO;
  sb.stderr_fd = STDERR_FILENO;
  auto proc = Spawn(sb);
  close(chan[1]);
  if (!proc.ok()) {
    close(chan[0]);
    return proc.status();
  }
  absl::MutexLock plock(&p->mu);
  p->proc = *std::move(proc);
  p->channel = chan[0];
  return p;
}

absl::StatusOr<GpuProclets::Held> GpuProclets::Hold(const std::string& ns,
                                                    const std::string& function,
                                                    const std::string& name,
                                                    uint64_t memory_limit,
                                                    bool create) {
  const std::string key = ProcletKey(ns, function, name);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = proclets_.find(key); it != proclets_.end()) {
      if (!it->second->lost) return Held{it->second, ""};
      proclets_.erase(it);  // a fresh one below
    } else if (auto m = moved_.find(key); m != moved_.end()) {
      if (Clock::now() - m->second.second < kMovedKept)
        return Held{nullptr, m->second.first};
      moved_.erase(m);
    }
  }
  if (!create)
    return absl::NotFoundError(absl::StrCat("no GPU proclet ", name, " of ",
                                            function, " is held here"));
  auto p = Start(ns, function, name, memory_limit, "");
  if (!p.ok()) return p.status();
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = proclets_.emplace(key, *p);
  return Held{it->second, ""};  // a racing first request may have won
}

std::string GpuProclets::ServeHere(const std::string& ns,
                                   const std::string& function,
                                   const std::string& name,
                                   uint64_t memory_limit, bool placed,
                                   std::string_view op_request) {
  auto held = Hold(ns, function, name, memory_limit, /*create=*/placed);
  // Not here, and the caller's idea of where it is came from a cache (it
  // moved away long ago, or this node restarted): back to the directory,
  // never a second proclet.
  if (!placed && absl::IsNotFound(held.status())) return MovedReply("");
  if (!held.ok())
    return Reply(
        StateCode::kUnavailable,
        absl::StrCat("starting the GPU proclet: ", held.status().message()));
  if (!held->moved_to.empty()) return MovedReply(held->moved_to);
  return held->proclet->Exchange(op_request);
}

std::string GpuProclets::Remote(const std::string& address,
                                const std::string& frame) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<PeerConn> c = peers_.Take(address);
    if (!c) break;
    if (!WriteBytesFrame(c->fd, frame).ok()) continue;  // not sent: retry
    std::string reply;
    if (c->reader->Next(&reply).ok() && !reply.empty()) {
      peers_.Give(address, std::move(c));
      return reply;
    }
    return Reply(StateCode::kUnavailable,
                 absl::StrCat("lost the connection to ", address,
                              " (holding the GPU proclet) during the "
                              "operation (it may or may not have run)"));
  }
  return {};  // not reachable: nothing was sent
}

std::string GpuProclets::Route(const std::string& ns,
                               const std::string& function,
                               const std::string& name, uint64_t memory_limit,
                               std::string_view op_request) {
  const std::string key = ProcletKey(ns, function, name);
  const std::string self = options_.data_address();
  for (int hop = 0; hop < kMaxHops; ++hop) {
    std::string address;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = where_.find(key); it != where_.end()) address = it->second;
    }
    // The directory just said so (it may be placed there now), or a cache.
    const bool placed = address.empty();
    if (address.empty()) {
      if (!options_.locate) {
        address = self;
      } else {
        auto located = options_.locate(ns, function, name, memory_limit);
        if (!located.ok())
          return Reply(StateCode::kUnavailable,
                       absl::StrCat("placing the GPU proclet: ",
                                    located.status().message()));
        address = *located;
      }
      absl::MutexLock lock(&mu_);
      where_[key] = address;
    }
    std::string reply;
    if (address == self) {
      reply = ServeHere(ns, function, name, memory_limit, placed, op_request);
    } else {
      std::string frame;
      wire::Writer w(&frame);
      w.U8(static_cast<uint8_t>(PeerOp::kGpu));
      w.Str(ns);
      w.Str(function);
      w.Str(name);
      w.U64(memory_limit);
      w.Str(op_request);
      w.U8(placed ? 1 : 0);
      reply = Remote(address, frame);
      if (reply.empty()) {  // its node is gone: ask the directory again
        absl::MutexLock lock(&mu_);
        where_.erase(key);
        if (hop + 1 < kMaxHops) continue;
        return Reply(StateCode::kUnavailable,
                     absl::StrCat("cannot reach ", address,
                                  ", which holds the GPU proclet"));
      }
    }
    if (CodeOf(reply) != StateCode::kMoved) return reply;
    wire::Reader r(std::string_view(reply).substr(1));
    std::string_view to;
    if (!r.Str(&to)) return Reply(StateCode::kInternal, "bad MOVED reply");
    absl::MutexLock lock(&mu_);
    if (to.empty())
      where_.erase(key);  // ask the directory
    else
      where_[key] = std::string(to);
  }
  return Reply(StateCode::kUnavailable,
               "the GPU proclet kept moving; try again");
}

std::string GpuProclets::Serve(const std::string& ns,
                               const std::string& function,
                               std::string_view request) {
  wire::Reader r(request);
  wire::StateOp op;
  wire::StateKind kind;
  std::string_view name_view;
  uint8_t gpu_op;
  if (!wire::ReadRequestHeader(&r, &op, &kind, &name_view) ||
      op != wire::StateOp::kGpu || !r.U8(&gpu_op))
    return Reply(StateCode::kInvalid, "malformed GPU request");
  if (!wire::ValidStructureName(name_view))
    return Reply(StateCode::kInvalid,
                 "a GPU proclet's name is 1-63 characters of [a-z0-9._-], "
                 "starting with a letter or digit");
  if (wire::IsInvokerOnly(static_cast<GpuOp>(gpu_op)))
    return Reply(StateCode::kInvalid,
                 "that GPU operation is the invoker's own");
  auto fn = options_.function(ns, function);
  if (!fn.ok())
    return Reply(StateCode::kUnavailable, std::string(fn.status().message()));
  const std::string name(name_view);
  // The request from its GpuOp on.
  std::string_view op_request =
      request.substr(request.size() - r.rest().size() - 1);
  std::string reply = Route(ns, function, name, fn->memory_limit, op_request);
  if (static_cast<GpuOp>(gpu_op) != GpuOp::kLoad ||
      CodeOf(reply) != StateCode::kNotFound)
    return reply;
  // The holder lacks the module: send it from the function's bundle.
  std::string_view module;
  if (!r.Str(&module) || !wire::ValidStructureName(module))
    return Reply(StateCode::kInvalid, "bad module name");
  const std::string base =
      absl::StrCat(fn->bundle_dir, "/kernels/", Sv(module));
  std::string ptx, host;
  const bool has_ptx = ReadFile(base + ".ptx", &ptx);
  const bool has_host = ReadFile(base + ".host.so", &host);
  if (!has_ptx && !has_host)
    return Reply(StateCode::kNotFound,
                 absl::StrCat("the function has no module ", Sv(module),
                              " (no ", Sv(module),
                              ".cu in its handler directory when it was "
                              "built)"));
  std::string load(1, static_cast<char>(GpuOp::kLoadImage));
  wire::Writer w(&load);
  w.Str(module);
  w.Str(ptx);
  w.Str(host);
  return Route(ns, function, name, fn->memory_limit, load);
}

std::string GpuProclets::ServePeer(wire::Reader& r) {
  std::string_view ns, function, name, request;
  uint64_t memory_limit;
  if (!r.Str(&ns) || !r.Str(&function) || !r.Str(&name) ||
      !r.U64(&memory_limit) || !r.Str(&request) || request.empty() ||
      !wire::ValidStructureName(name))
    return Reply(StateCode::kInvalid, "malformed GPU request");
  uint8_t placed = 1;
  (void)r.U8(&placed);
  return ServeHere(std::string(ns), std::string(function), std::string(name),
                   memory_limit, placed != 0, request);
}

std::string GpuProclets::AdoptPeer(
    wire::Reader& r,
    const std::function<absl::Status(char*, size_t)>& read_state) {
  std::string_view ns, function, name, backend;
  uint64_t memory_limit, bytes;
  if (!r.Str(&ns) || !r.Str(&function) || !r.Str(&name) ||
      !r.U64(&memory_limit) || !r.Str(&backend) || !r.U64(&bytes) ||
      !wire::ValidStructureName(name) || bytes > (uint64_t{1} << 40))
    return {};  // malformed: the connection ends
  std::string inject(1, static_cast<char>(GpuOp::kInject));
  inject.resize(1 + bytes);
  if (!read_state(inject.data() + 1, bytes).ok()) return {};
  auto start = Clock::now();
  auto p = Start(std::string(ns), std::string(function), std::string(name),
                 memory_limit, std::string(backend));
  if (!p.ok())
    return Reply(
        StateCode::kUnavailable,
        absl::StrCat("starting the GPU proclet here: ", p.status().message()));
  std::string done = (*p)->Exchange(inject);
  if (CodeOf(done) != StateCode::kOk) return done;
  const double inject_ms = MsSince(start);
  GpuProcletInfo info = (*p)->Info();
  {
    const std::string key = ProcletKey(ns, function, name);
    absl::MutexLock lock(&mu_);
    proclets_[key] = *p;
    moved_.erase(key);
    where_[key] = options_.data_address();
  }
  std::string out(1, static_cast<char>(StateCode::kOk));
  wire::Writer w(&out);
  w.Str(info.backend);
  w.Str(info.device);
  w.U64(static_cast<uint64_t>(inject_ms * 1000));
  return out;
}

absl::StatusOr<GpuMoveResult> GpuProclets::Migrate(const std::string& ns,
                                                   const std::string& function,
                                                   const std::string& name,
                                                   const std::string& target,
                                                   const std::string& backend) {
  auto held = Hold(ns, function, name, 0, /*create=*/false);
  if (!held.ok()) return held.status();
  if (!held->moved_to.empty())
    return absl::NotFoundError(absl::StrCat("GPU proclet ", name, " of ",
                                            function, " moved to ",
                                            held->moved_to, " already"));
  std::shared_ptr<Proclet> p = held->proclet;
  const std::string key = ProcletKey(ns, function, name);
  const bool here = target == options_.data_address();
  GpuMoveResult m;
  // Calls wait on the proclet's lock from here on: at a kernel boundary.
  absl::MutexLock lock(&p->mu);
  GpuProcletInfo from;
  if (!ParseInfo(p->ExchangeLocked(std::string(1, char(GpuOp::kInfo))), &from))
    return absl::FailedPreconditionError(
        "the GPU proclet does not answer (its process ended?)");
  m.from_backend = from.backend;
  m.bytes = from.memory_used;
  const auto start = Clock::now();
  std::string state =
      p->ExchangeLocked(std::string(1, static_cast<char>(GpuOp::kExtract)));
  if (CodeOf(state) != StateCode::kOk)
    return absl::InternalError(
        absl::StrCat("taking the GPU proclet's state: ",
                     Sv(std::string_view(state).substr(1))));
  m.extract_ms = MsSince(start);
  auto resume = [&](absl::Status why) {
    p->ExchangeLocked(std::string(1, static_cast<char>(GpuOp::kResume)));
    return why;
  };
  if (here) {
    // Onto another backend of this node: a second process, then swap.
    auto q = Start(ns, function, name, p->memory_limit, backend);
    if (!q.ok()) return resume(q.status());
    state[0] = static_cast<char>(GpuOp::kInject);
    auto inject_start = Clock::now();
    std::string done = (*q)->Exchange(state);
    if (CodeOf(done) != StateCode::kOk)
      return resume(absl::FailedPreconditionError(
          absl::StrCat("the target backend refused the state: ",
                       Sv(std::string_view(done).substr(1)))));
    m.inject_ms = MsSince(inject_start);
    GpuProcletInfo to = (*q)->Info();
    m.to_backend = to.backend;
    m.to_device = to.device;
    absl::MutexLock l(&mu_);
    proclets_[key] = *q;
  } else {
    std::string frame;
    wire::Writer w(&frame);
    w.U8(static_cast<uint8_t>(PeerOp::kGpuAdopt));
    w.Str(ns);
    w.Str(function);
    w.Str(name);
    w.U64(p->memory_limit);
    w.Str(backend);
    w.U64(state.size() - 1);
    std::unique_ptr<PeerConn> c = peers_.Take(target);
    if (!c)
      return resume(absl::UnavailableError(
          absl::StrCat("cannot reach the target node's data port ", target)));
    std::string reply;
    if (!WriteBytesFrame(c->fd, frame).ok() ||
        !WriteAll(c->fd, std::string_view(state).substr(1)).ok() ||
        !c->reader->Next(&reply).ok() || reply.empty())
      return resume(absl::UnavailableError(
          absl::StrCat("lost the connection to ", target, " while moving")));
    if (CodeOf(reply) != StateCode::kOk)
      return resume(absl::FailedPreconditionError(
          absl::StrCat("the target refused the GPU proclet: ",
                       Sv(std::string_view(reply).substr(1)))));
    wire::Reader r(std::string_view(reply).substr(1));
    std::string_view to_backend, to_device;
    uint64_t inject_us = 0;
    if (!r.Str(&to_backend) || !r.Str(&to_device) || !r.U64(&inject_us))
      return resume(absl::InternalError("bad reply from the target"));
    peers_.Give(target, std::move(c));
    m.to_backend = to_backend;
    m.to_device = to_device;
    m.inject_ms = inject_us / 1000.0;
    absl::MutexLock l(&mu_);
    if (auto it = proclets_.find(key); it != proclets_.end() && it->second == p)
      proclets_.erase(it);
    moved_[key] = {target, Clock::now()};
    where_[key] = target;
  }
  // Late callers waiting on this proclet follow it.
  p->moved_to = target;
  p->EndLocked();
  m.pause_ms = MsSince(start);
  return m;
}

std::vector<GpuProcletInfo> GpuProclets::List() {
  std::vector<std::shared_ptr<Proclet>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, p] : proclets_) all.push_back(p);
  }
  std::vector<GpuProcletInfo> out;
  for (auto& p : all) {
    GpuProcletInfo i = p->Info();
    if (i.backend.empty()) continue;  // never answered
    i.ns = p->ns;
    i.function = p->function;
    i.name = p->name;
    out.push_back(std::move(i));
  }
  return out;
}

void GpuProclets::DropFunction(const std::string& ns,
                               const std::string& function) {
  std::vector<std::shared_ptr<Proclet>> dropped;
  {
    absl::MutexLock lock(&mu_);
    const std::string prefix =
        function.empty() ? ns + "/" : ProcletKey(ns, function, "");
    for (auto it = proclets_.lower_bound(prefix);
         it != proclets_.end() && it->first.rfind(prefix, 0) == 0;) {
      dropped.push_back(it->second);
      it = proclets_.erase(it);
    }
    for (auto it = where_.lower_bound(prefix);
         it != where_.end() && it->first.rfind(prefix, 0) == 0;)
      it = where_.erase(it);
  }
  // Their processes end here, outside mu_.
}

}  // namespace silt::invoker
