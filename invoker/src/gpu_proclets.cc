#include "gpu_proclets.h"

#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "frames.h"
#include "gpu_proclet.h"
#include "random_id.h"
#include "sandbox.h"
#include "silt/gpu_wire.h"

namespace silt::invoker {

using gpu_internal::ClearOnExit;
using gpu_internal::CodeOf;
using gpu_internal::MovedReply;
using gpu_internal::ParseInfo;
using gpu_internal::ProcletKey;
using gpu_internal::Reply;
using gpu_internal::Sv;
using wire::GpuOp;
using wire::StateCode;

namespace {

// How long a proclet that moved away is remembered (late callers are sent
// after it).
constexpr std::chrono::seconds kMovedKept{120};
// Requests that follow a proclet from node to node before giving up.
constexpr int kMaxHops = 8;
// A proclet process's own memory besides its buffers (its modules, a GPU
// context's host side).
constexpr uint64_t kProcessOverhead = 256u << 20;

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace

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
      // A lost one answers its function's next request (kLost, whoever
      // noticed first: a load report may have); the one after starts a
      // fresh one (a move or a resize of it fails: kLost).
      if (!it->second->lost_told) return Held{it->second, ""};
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
  std::string reply = held->proclet->Exchange(op_request);
  if (held->proclet->lost) held->proclet->lost_told = true;
  return reply;
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
