#include "gpu_proclets.h"

#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "random_id.h"
#include "sandbox.h"
#include "silt/gpu_wire.h"

namespace silt::invoker {

using wire::GpuOp;
using wire::StateCode;

namespace {

std::string Reply(StateCode code, std::string_view message) {
  std::string r(1, static_cast<char>(code));
  r.append(message);
  return r;
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
  return absl::StrCat(absl::string_view(ns.data(), ns.size()), "/",
                      absl::string_view(function.data(), function.size()), "/",
                      absl::string_view(name.data(), name.size()));
}

}  // namespace

// One proclet's process. `mu` serialises its requests (a launch is queued in
// order behind the ones before it).
struct GpuProclets::Proclet {
  std::string ns, function, name;
  std::string dir;  // DATA_DIR/gpu/<id>: its /tmp
  absl::Mutex mu;
  std::unique_ptr<SandboxedProcess> proc ABSL_GUARDED_BY(mu);
  int channel ABSL_GUARDED_BY(mu) = -1;
  bool lost ABSL_GUARDED_BY(mu) = false;

  ~Proclet() {
    if (channel >= 0) close(channel);
    proc.reset();  // kills and reaps
    if (!dir.empty()) {
      umount2((dir + "/tmp").c_str(), MNT_DETACH);
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }

  // One request and its reply; kLost once the process has ended.
  std::string Exchange(std::string_view request) {
    absl::MutexLock lock(&mu);
    if (lost)
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
};

GpuProclets::GpuProclets(GpuProcletsOptions options)
    : options_(std::move(options)) {}

GpuProclets::~GpuProclets() {
  absl::MutexLock lock(&mu_);
  proclets_.clear();
}

absl::StatusOr<std::shared_ptr<GpuProclets::Proclet>> GpuProclets::Find(
    const std::string& ns, const std::string& function, std::string_view name) {
  const std::string key = ProcletKey(ns, function, name);
  {
    absl::MutexLock lock(&mu_);
    auto it = proclets_.find(key);
    if (it != proclets_.end()) {
      bool lost;
      {
        absl::MutexLock plock(&it->second->mu);
        lost = it->second->lost;
      }
      if (!lost) return it->second;
      proclets_.erase(it);  // the next request starts a fresh one
    }
  }
  auto fn = options_.function(ns, function);
  if (!fn.ok()) return fn.status();
  auto p = std::make_shared<Proclet>();
  p->ns = ns;
  p->function = function;
  p->name = std::string(name);
  const std::string id = RandomId(12);
  p->dir = absl::StrCat(options_.data_dir, "/gpu/", id);
  std::error_code ec;
  std::filesystem::create_directories(p->dir + "/tmp", ec);
  std::filesystem::create_directories(p->dir + "/secrets", ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("making ", p->dir, ": ", ec.message()));
  if (auto s = MountTmp(p->dir + "/tmp", 64 << 20); !s.ok()) return s;
  int chan[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) != 0)
    return absl::InternalError("socketpair failed");
  SandboxSpec sb;
  sb.root_dir = options_.root_dir;
  sb.bundle_dir = fn->bundle_dir;
  sb.secrets_dir = p->dir + "/secrets";
  sb.worker_dir = options_.worker_dir;
  sb.dev_dir = options_.dev_dir;
  sb.tmp_dir = p->dir + "/tmp";
  sb.host_id = fn->host_id;
  sb.hostname = function;
  sb.cgroup = absl::StrCat(options_.cgroup_prefix, "/gpu-", id);
  // Host backend: its buffers are process memory (the limit, and room for
  // the process and its modules).
  sb.memory_limit_bytes =
      fn->memory_limit > 0 ? fn->memory_limit + (256u << 20) : 0;
  sb.argv = {absl::StrCat(kSandboxWorkerDir, "/silt-gpu-host"),
             absl::StrCat("--backend=", options_.backend),
             absl::StrCat("--bundle=", kSandboxBundleDir),
             absl::StrCat("--memory-limit=", fn->memory_limit)};
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
  {
    absl::MutexLock plock(&p->mu);
    p->proc = *std::move(proc);
    p->channel = chan[0];
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = proclets_.emplace(key, p);
  return it->second;  // a racing first request may have won: use its
}

std::string GpuProclets::Serve(const std::string& ns,
                               const std::string& function,
                               std::string_view request) {
  wire::Reader r(request);
  wire::StateOp op;
  wire::StateKind kind;
  std::string_view name;
  uint8_t gpu_op;
  if (!wire::ReadRequestHeader(&r, &op, &kind, &name) ||
      op != wire::StateOp::kGpu || !r.U8(&gpu_op))
    return Reply(StateCode::kInvalid, "malformed GPU request");
  if (!wire::ValidStructureName(name))
    return Reply(StateCode::kInvalid,
                 "a GPU proclet's name is 1-63 characters of [a-z0-9._-], "
                 "starting with a letter or digit");
  if (wire::IsInvokerOnly(static_cast<GpuOp>(gpu_op)))
    return Reply(StateCode::kInvalid,
                 "that GPU operation is the invoker's own");
  auto p = Find(ns, function, name);
  if (!p.ok())
    return Reply(
        absl::IsNotFound(p.status()) ? StateCode::kNotFound
                                     : StateCode::kUnavailable,
        absl::StrCat("starting the GPU proclet: ", p.status().message()));
  // The process takes the request without its header.
  return (*p)->Exchange(request.substr(request.size() - r.rest().size() - 1));
}

std::vector<GpuProcletInfo> GpuProclets::List() {
  std::vector<std::shared_ptr<Proclet>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, p] : proclets_) all.push_back(p);
  }
  std::vector<GpuProcletInfo> out;
  for (auto& p : all) {
    std::string reply =
        p->Exchange(std::string(1, static_cast<char>(GpuOp::kInfo)));
    if (reply.empty() || reply[0] != static_cast<char>(StateCode::kOk))
      continue;
    wire::Reader r(std::string_view(reply).substr(1));
    std::string_view backend, device;
    GpuProcletInfo i;
    if (!r.Str(&backend) || !r.Str(&device) || !r.U64(&i.memory_limit) ||
        !r.U64(&i.memory_used) || !r.U64(&i.launches))
      continue;
    i.ns = p->ns;
    i.function = p->function;
    i.name = p->name;
    i.backend = backend;
    i.device = device;
    out.push_back(std::move(i));
  }
  return out;
}

void GpuProclets::DropFunction(const std::string& ns,
                               const std::string& function) {
  std::vector<std::shared_ptr<Proclet>> dropped;
  {
    absl::MutexLock lock(&mu_);
    const std::string prefix = ProcletKey(ns, function, "");
    for (auto it = proclets_.lower_bound(prefix);
         it != proclets_.end() && it->first.rfind(prefix, 0) == 0;) {
      dropped.push_back(it->second);
      it = proclets_.erase(it);
    }
  }
  // Their processes end here, outside mu_.
}

}  // namespace silt::invoker
