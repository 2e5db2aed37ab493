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
// A move's pre-copy: bytes per part (what a call may wait behind, once), and
// passes over what was written meanwhile before the pause.
constexpr uint64_t kPrecopyPartBytes = 8u << 20;
constexpr int kPrecopyPasses = 3;
// A proclet process's own memory besides its buffers (its modules, a GPU
// context's host side).
constexpr uint64_t kProcessOverhead = 256u << 20;

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

// A kPrecopy request for the next part.
std::string PrecopyRequest(bool restart) {
  std::string request(1, static_cast<char>(GpuOp::kPrecopy));
  wire::Writer w(&request);
  w.U8(restart ? 1 : 0);
  w.U64(kPrecopyPartBytes);
  return request;
}

// Clears a flag when it goes out of scope (a proclet's `moving`).
struct ClearOnExit {
  std::atomic<bool>& flag;
  ~ClearOnExit() { flag = false; }
};

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
      !r.U64(&i->memory_used) || !r.U64(&i->launches) ||
      !r.U64(&i->generation) || !r.U64(&i->pending_limit) ||
      !r.U64(&i->busy_ns))
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
  std::atomic<uint64_t> memory_limit{0};  // its allocation
  absl::Mutex mu;
  std::unique_ptr<SandboxedProcess> proc ABSL_GUARDED_BY(mu);
  int channel ABSL_GUARDED_BY(mu) = -1;
  // Its process ended (set under mu; read without it: never take mu under
  // GpuProclets::mu_, a move holds mu while it takes mu_).
  std::atomic<bool> lost{false};
  std::string moved_to ABSL_GUARDED_BY(mu);      // it moved there
  std::atomic<bool> moving{false};               // a move is under way
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

  std::string Exchange(std::string_view request, std::string_view more = {}) {
    absl::MutexLock lock(&mu);
    return ExchangeLocked(request, more);
  }

  // One request (`request` then `more`, unjoined) and its reply; kMoved once
  // it moved, kLost once its process ended.
  std::string ExchangeLocked(std::string_view request,
                             std::string_view more = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!moved_to.empty()) return MovedReply(moved_to);
    if (lost || proc == nullptr)
      return Reply(StateCode::kLost,
                   "the GPU proclet's process ended; its buffers are lost");
    uint64_t n = request.size() + more.size();
    uint64_t m = 0;
    std::string reply;
    if (WriteFull(channel, &n, sizeof(n)) &&
        WriteFull(channel, request.data(), request.size()) &&
        WriteFull(channel, more.data(), more.size()) &&
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
  sb.memory_limit_bytes =
      memory_limit > 0 ? memory_limit + kProcessOverhead : 0;
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

absl::StatusOr<GpuProclets::Held> GpuProclets::Hold(
    const std::string& ns, const std::string& function, const std::string& name,
    uint64_t memory_limit, bool create, const std::string& backend) {
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
  auto p = Start(ns, function, name, memory_limit, backend);
  if (!p.ok()) return p.status();
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = proclets_.emplace(key, *p);
  return Held{it->second, ""};  // a racing first request may have won
}

absl::StatusOr<std::shared_ptr<GpuProclets::Proclet>>
GpuProclets::HoldForChange(const std::string& ns, const std::string& function,
                           const std::string& name) {
  auto held = Hold(ns, function, name, 0, /*create=*/false);
  if (!held.ok()) return held.status();
  if (!held->moved_to.empty())
    return absl::NotFoundError(absl::StrCat("GPU proclet ", name, " of ",
                                            function, " moved to ",
                                            held->moved_to, " already"));
  if (held->proclet->moving.exchange(true))
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU proclet ", name, " of ", function, " is being moved or resized"));
  return held->proclet;
}

std::string GpuProclets::ServeHere(const std::string& ns,
                                   const std::string& function,
                                   const std::string& name,
                                   uint64_t memory_limit, bool placed,
                                   const std::string& backend,
                                   std::string_view op_request) {
  auto held =
      Hold(ns, function, name, memory_limit, /*create=*/placed, backend);
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
                               const std::string& name,
                               const GpuProcletsOptions::FunctionInfo& fn,
                               std::string_view op_request) {
  const std::string key = ProcletKey(ns, function, name);
  const std::string self = options_.data_address();
  for (int hop = 0; hop < kMaxHops; ++hop) {
    std::string address;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = where_.find(key); it != where_.end()) address = it->second;
    }
    // The directory just said so (it may be placed there now, with this
    // allocation), or a cache.
    const bool placed = address.empty();
    uint64_t memory_limit = fn.memory_limit;
    std::string backend;  // where the directory placed it: its GPU or CPU
    if (address.empty()) {
      if (!options_.locate) {
        address = self;
      } else {
        auto located = options_.locate(ns, function, name, fn);
        if (!located.ok())
          return Reply(StateCode::kUnavailable,
                       absl::StrCat("placing the GPU proclet: ",
                                    located.status().message()));
        address = located->data_address;
        memory_limit = located->memory_limit;
        backend = located->backend;
      }
      absl::MutexLock lock(&mu_);
      where_[key] = address;
    }
    std::string reply;
    if (address == self) {
      reply = ServeHere(ns, function, name, memory_limit, placed, backend,
                        op_request);
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
      w.Str(backend);
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
  // The op itself, inside a kSince (the SDK's reconfiguration check).
  std::string_view op_request =
      request.substr(request.size() - r.rest().size() - 1);
  if (static_cast<GpuOp>(gpu_op) == GpuOp::kSince) {
    uint64_t seen;
    if (!r.U64(&seen) || !r.U8(&gpu_op))
      return Reply(StateCode::kInvalid, "malformed GPU request");
  }
  if (wire::IsInvokerOnly(static_cast<GpuOp>(gpu_op)) ||
      static_cast<GpuOp>(gpu_op) == GpuOp::kSince)
    return Reply(StateCode::kInvalid,
                 "that GPU operation is the invoker's own");
  auto fn = options_.function(ns, function);
  if (!fn.ok())
    return Reply(StateCode::kUnavailable, std::string(fn.status().message()));
  const std::string name(name_view);
  std::string reply = Route(ns, function, name, *fn, op_request);
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
  return Route(ns, function, name, *fn, load);
}

std::string GpuProclets::ServePeer(wire::Reader& r) {
  std::string_view ns, function, name, request;
  uint64_t memory_limit;
  if (!r.Str(&ns) || !r.Str(&function) || !r.Str(&name) ||
      !r.U64(&memory_limit) || !r.Str(&request) || request.empty() ||
      !wire::ValidStructureName(name))
    return Reply(StateCode::kInvalid, "malformed GPU request");
  uint8_t placed = 1;
  std::string_view backend;
  if (!r.U8(&placed) || !r.Str(&backend)) backend = {};
  if (!backend.empty() && backend != "cuda" && backend != "host")
    return Reply(StateCode::kInvalid, "malformed GPU request (backend)");
  return ServeHere(std::string(ns), std::string(function), std::string(name),
                   memory_limit, placed != 0, std::string(backend), request);
}

std::string GpuProclets::AdoptPeer(wire::Reader& r, PeerStream& stream) {
  std::string_view ns, function, name, backend;
  uint64_t memory_limit;
  if (!r.Str(&ns) || !r.Str(&function) || !r.Str(&name) ||
      !r.U64(&memory_limit) || !r.Str(&backend) ||
      !wire::ValidStructureName(name))
    return {};  // malformed: the connection ends
  auto p = Start(std::string(ns), std::string(function), std::string(name),
                 memory_limit, std::string(backend));
  if (!p.ok())
    return Reply(
        StateCode::kUnavailable,
        absl::StrCat("starting the GPU proclet here: ", p.status().message()));
  if (!stream.reply(Reply(StateCode::kOk)).ok()) return {};
  // Its state's parts, each into the process as it comes; the first failure
  // is the commit's answer. Until then nobody calls it, and it ends (with
  // *p) if the source gives up.
  std::string failed, frame, part;
  double inject_ms = 0;
  for (;;) {
    if (!stream.next(&frame).ok()) return {};
    wire::Reader f(frame);
    uint8_t step;
    uint64_t n;
    if (!f.U8(&step) || !f.U64(&n) || n > (uint64_t{1} << 40) ||
        (step != static_cast<uint8_t>(GpuAdoptStep::kPart) &&
         step != static_cast<uint8_t>(GpuAdoptStep::kCommit) &&
         step != static_cast<uint8_t>(GpuAdoptStep::kFlush)))
      return {};
    if (step == static_cast<uint8_t>(GpuAdoptStep::kFlush)) {
      if (n != 0 ||
          !stream.reply(failed.empty() ? Reply(StateCode::kOk) : failed).ok())
        return {};
      continue;
    }
    part.resize(1 + n);
    part[0] = static_cast<char>(GpuOp::kInject);
    if (!stream.read_raw(part.data() + 1, n).ok()) return {};
    const auto start = Clock::now();
    if (failed.empty()) {
      std::string done = (*p)->Exchange(part);
      if (CodeOf(done) != StateCode::kOk) failed = std::move(done);
    }
    if (step == static_cast<uint8_t>(GpuAdoptStep::kPart)) continue;
    if (!failed.empty()) return failed;
    inject_ms = MsSince(start);
    break;
  }
  GpuProcletInfo info = (*p)->Info();
  {
    const std::string key = ProcletKey(ns, function, name);
    absl::MutexLock lock(&mu_);
    if (auto it = proclets_.find(key);
        it != proclets_.end() && !it->second->lost)
      return Reply(StateCode::kUnavailable,
                   "this node holds that GPU proclet already");
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

// Where a move sends the proclet's state: a second process here (onto
// another backend of this node), or a peer's data port (kGpuAdopt).
struct GpuProclets::MoveTarget {
  std::string address;
  std::shared_ptr<Proclet> local;
  std::unique_ptr<PeerConn> conn;
  absl::Status failed;  // the first part the local process refused
};

absl::Status GpuProclets::BeginMove(const Proclet& p, const std::string& target,
                                    const std::string& backend,
                                    MoveTarget* to) {
  to->address = target;
  if (target == options_.data_address()) {
    auto q = Start(p.ns, p.function, p.name, p.memory_limit, backend);
    if (!q.ok()) return q.status();
    to->local = *std::move(q);
    return absl::OkStatus();
  }
  to->conn = peers_.Take(target);
  if (!to->conn)
    return absl::UnavailableError(
        absl::StrCat("cannot reach the target node's data port ", target));
  std::string frame, reply;
  wire::Writer w(&frame);
  w.U8(static_cast<uint8_t>(PeerOp::kGpuAdopt));
  w.Str(p.ns);
  w.Str(p.function);
  w.Str(p.name);
  w.U64(p.memory_limit);
  w.Str(backend);
  if (!WriteBytesFrame(to->conn->fd, frame).ok() ||
      !to->conn->reader->Next(&reply).ok() || reply.empty())
    return absl::UnavailableError(
        absl::StrCat("lost the connection to ", target, " while moving"));
  if (CodeOf(reply) != StateCode::kOk)
    return absl::FailedPreconditionError(
        absl::StrCat("the target cannot host the GPU proclet: ",
                     Sv(std::string_view(reply).substr(1))));
  return absl::OkStatus();
}

absl::Status GpuProclets::SendPart(MoveTarget& to, GpuAdoptStep step,
                                   std::string_view state) {
  if (to.local) {
    if (!to.failed.ok()) return absl::OkStatus();  // said at the commit
    const char op = static_cast<char>(GpuOp::kInject);
    std::string done = to.local->Exchange(std::string_view(&op, 1), state);
    if (CodeOf(done) != StateCode::kOk)
      to.failed = absl::FailedPreconditionError(
          absl::StrCat("the target backend refused the state: ",
                       Sv(std::string_view(done).substr(1))));
    return absl::OkStatus();
  }
  std::string frame;
  wire::Writer w(&frame);
  w.U8(static_cast<uint8_t>(step));
  w.U64(state.size());
  if (!WriteBytesFrame(to.conn->fd, frame).ok() ||
      !WriteAll(to.conn->fd, state).ok())
    return absl::UnavailableError(
        absl::StrCat("lost the connection to ", to.address, " while moving"));
  return absl::OkStatus();
}

absl::Status GpuProclets::FlushMove(MoveTarget& to) {
  if (to.local) return to.failed;  // its parts were applied as they went
  std::string frame, reply;
  wire::Writer w(&frame);
  w.U8(static_cast<uint8_t>(GpuAdoptStep::kFlush));
  w.U64(0);
  if (!WriteBytesFrame(to.conn->fd, frame).ok() ||
      !to.conn->reader->Next(&reply).ok() || reply.empty())
    return absl::UnavailableError(
        absl::StrCat("lost the connection to ", to.address, " while moving"));
  if (CodeOf(reply) != StateCode::kOk)
    return absl::FailedPreconditionError(
        absl::StrCat("the target refused the GPU proclet's state: ",
                     Sv(std::string_view(reply).substr(1))));
  return absl::OkStatus();
}

absl::Status GpuProclets::CommitMove(MoveTarget& to, std::string_view delta,
                                     GpuMoveResult* m) {
  const auto start = Clock::now();
  if (auto s = SendPart(to, GpuAdoptStep::kCommit, delta); !s.ok()) return s;
  if (to.local) {
    if (!to.failed.ok()) return to.failed;
    m->inject_ms = MsSince(start);
    GpuProcletInfo info = to.local->Info();
    m->to_backend = info.backend;
    m->to_device = info.device;
    return absl::OkStatus();
  }
  std::string reply;
  if (!to.conn->reader->Next(&reply).ok() || reply.empty())
    return absl::UnavailableError(
        absl::StrCat("lost the connection to ", to.address, " while moving"));
  if (CodeOf(reply) != StateCode::kOk)
    return absl::FailedPreconditionError(
        absl::StrCat("the target refused the GPU proclet: ",
                     Sv(std::string_view(reply).substr(1))));
  wire::Reader r(std::string_view(reply).substr(1));
  std::string_view to_backend, to_device;
  uint64_t inject_us = 0;
  if (!r.Str(&to_backend) || !r.Str(&to_device) || !r.U64(&inject_us))
    return absl::InternalError("bad reply from the target");
  peers_.Give(to.address, std::move(to.conn));
  m->to_backend = to_backend;
  m->to_device = to_device;
  m->inject_ms = inject_us / 1000.0;
  return absl::OkStatus();
}

absl::StatusOr<GpuMoveResult> GpuProclets::Migrate(const std::string& ns,
                                                   const std::string& function,
                                                   const std::string& name,
                                                   const std::string& target,
                                                   const std::string& backend) {
  auto held = HoldForChange(ns, function, name);
  if (!held.ok()) return held.status();
  std::shared_ptr<Proclet> p = *std::move(held);
  ClearOnExit not_moving{p->moving};
  GpuProcletInfo from;
  if (!ParseInfo(p->Exchange(std::string(1, char(GpuOp::kInfo))), &from))
    return absl::FailedPreconditionError(
        "the GPU proclet does not answer (its process ended?)");
  GpuMoveResult m;
  m.from_backend = from.backend;
  m.bytes = from.memory_used;
  MoveTarget to;
  if (auto s = BeginMove(*p, target, backend, &to); !s.ok()) return s;

  // Parts a pass may take: its allocation's worth and one per buffer, with
  // room to spare; a proclet that keeps answering "not done" is stuck.
  const uint64_t max_parts =
      from.memory_limit / kPrecopyPartBytes + (uint64_t{1} << 16);
  // Pre-copy: the buffers go a part at a time while calls go on between the
  // parts; then again what was written meanwhile, while that shrinks.
  const auto precopy_start = Clock::now();
  bool restart = true;
  uint64_t last_pass = ~uint64_t{0};
  for (int pass = 0; pass < kPrecopyPasses; ++pass) {
    uint64_t pass_bytes = 0, parts = 0;
    for (bool done = false; !done;) {
      if (++parts > max_parts)
        return absl::InternalError(
            "the GPU proclet's pre-copy does not end (its process is stuck?)");
      std::string part = p->Exchange(PrecopyRequest(restart));
      restart = false;
      if (CodeOf(part) != StateCode::kOk || part.size() < 2)
        return absl::FailedPreconditionError(
            absl::StrCat("copying the GPU proclet's state: ",
                         Sv(std::string_view(part).substr(1))));
      done = part[1] != 0;
      pass_bytes += part.size() - 2;
      if (auto s = SendPart(to, GpuAdoptStep::kPart,
                            std::string_view(part).substr(2));
          !s.ok())
        return s;
    }
    m.precopy_bytes += pass_bytes;
    if (pass_bytes < kPrecopyPartBytes || pass_bytes >= last_pass) break;
    last_pass = pass_bytes;
  }
  // The target has applied it all (not queued behind the pause).
  if (auto s = FlushMove(to); !s.ok()) return s;
  m.precopy_ms = MsSince(precopy_start);

  // The pause: calls wait on the proclet's lock from here on (at a kernel
  // boundary) while what was written since its pre-copy goes.
  const std::string key = ProcletKey(ns, function, name);
  std::unique_ptr<SandboxedProcess> ended;  // after the pause, unlocked
  {
    absl::MutexLock lock(&p->mu);
    const auto start = Clock::now();
    auto resume = [&](absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu) {
      p->ExchangeLocked(std::string(1, static_cast<char>(GpuOp::kResume)));
      return why;
    };
    // What was written since goes in parts too, so that taking one off the
    // device, sending one and putting one on overlap.
    uint64_t parts = 0;
    for (bool done = false; !done;) {
      if (++parts > max_parts)
        return resume(absl::InternalError(
            "the GPU proclet's pre-copy does not end (its process is stuck?)"));
      std::string part = p->ExchangeLocked(PrecopyRequest(false));
      if (CodeOf(part) != StateCode::kOk || part.size() < 2)
        return resume(absl::FailedPreconditionError(
            absl::StrCat("copying the GPU proclet's state: ",
                         Sv(std::string_view(part).substr(1)))));
      done = part[1] != 0;
      m.paused_bytes += part.size() - 2;
      if (auto s = SendPart(to, GpuAdoptStep::kPart,
                            std::string_view(part).substr(2));
          !s.ok())
        return resume(s);
    }
    std::string delta = p->ExchangeLocked(
        std::string{static_cast<char>(GpuOp::kExtract), char{1}});
    if (CodeOf(delta) != StateCode::kOk)
      return resume(absl::InternalError(
          absl::StrCat("taking the GPU proclet's state: ",
                       Sv(std::string_view(delta).substr(1)))));
    m.extract_ms = MsSince(start);
    m.paused_bytes += delta.size() - 1;
    if (auto s = CommitMove(to, std::string_view(delta).substr(1), &m); !s.ok())
      return resume(s);
    {
      absl::MutexLock l(&mu_);
      if (to.local) {
        proclets_[key] = to.local;
      } else {
        if (auto it = proclets_.find(key);
            it != proclets_.end() && it->second == p)
          proclets_.erase(it);
        moved_[key] = {target, Clock::now()};
        where_[key] = target;
      }
    }
    // Late callers waiting on this proclet follow it.
    p->moved_to = target;
    if (p->channel >= 0) close(p->channel);
    p->channel = -1;
    ended = std::move(p->proc);
    m.pause_ms = MsSince(start);
  }
  ended.reset();  // its process, killed and reaped with nobody waiting
  return m;
}

absl::StatusOr<GpuProcletInfo> GpuProclets::Resize(const std::string& ns,
                                                   const std::string& function,
                                                   const std::string& name,
                                                   uint64_t limit,
                                                   absl::Duration wait) {
  auto held = HoldForChange(ns, function, name);
  if (!held.ok()) return held.status();
  std::shared_ptr<Proclet> p = *std::move(held);
  ClearOnExit not_moving{p->moving};
  auto set_limit = [&](uint64_t bytes) {
    std::string req(1, static_cast<char>(GpuOp::kSetLimit));
    wire::Writer(&req).U64(bytes);
    GpuProcletInfo i;
    if (!ParseInfo(p->Exchange(req), &i))
      return absl::StatusOr<GpuProcletInfo>(absl::FailedPreconditionError(
          "the GPU proclet does not answer (its process ended?)"));
    return absl::StatusOr<GpuProcletInfo>(i);
  };
  GpuProcletInfo before;
  if (!ParseInfo(p->Exchange(std::string(1, char(GpuOp::kInfo))), &before))
    return absl::FailedPreconditionError(
        "the GPU proclet does not answer (its process ended?)");
  // On the host backend its buffers are process memory: its cgroup makes
  // room first (and is trimmed to the new allocation after).
  auto cgroup_limit = [&](uint64_t bytes) {
    absl::MutexLock lock(&p->mu);
    if (p->proc != nullptr)
      p->proc->cgroup()
          .SetMemoryLimit(bytes > ~uint64_t{0} - kProcessOverhead
                              ? 0  // no limit
                              : bytes + kProcessOverhead)
          .IgnoreError();
  };
  cgroup_limit(std::max(before.memory_limit, limit));
  auto now = set_limit(limit);
  if (!now.ok()) return now.status();
  // Holding more: the function's callbacks are told (pending_limit) on their
  // next call, and Free; wait a while for that.
  const absl::Time deadline = absl::Now() + wait;
  while (now->pending_limit != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    GpuProcletInfo i;
    if (!ParseInfo(p->Exchange(std::string(1, char(GpuOp::kInfo))), &i))
      return absl::FailedPreconditionError(
          "the GPU proclet does not answer (its process ended?)");
    *now = i;
  }
  if (now->pending_limit != 0) {
    const uint64_t used = now->memory_used;
    (void)set_limit(std::max(before.memory_limit, used));  // called off
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU proclet ", name, " of ", function, " holds ", used,
        " bytes, more than ", limit,
        ", and its function did not free enough "
        "within ",
        absl::FormatDuration(wait),
        " (a reconfiguration callback, silt::Gpu::OnReconfigure, can)"));
  }
  cgroup_limit(limit);
  p->memory_limit = limit;  // where it moves next, it gets as much
  now->ns = ns;
  now->function = function;
  now->name = name;
  return *now;
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
