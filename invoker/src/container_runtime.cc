#include "container_runtime.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace silt::invoker {
namespace {

using Clock = std::chrono::steady_clock;

// The end of a log file; "" for one that is no regular file (the invoker's
// FIFO, whose lines are the function's log already: reading it here would
// wait for a writer that is this thread's caller).
std::string Tail(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > 600 ? s.substr(s.size() - 600) : s;
}

// The environment: the image's, then the launch's (a later K= wins).
std::vector<std::string> MergeEnv(const std::vector<std::string>& image,
                                  const std::vector<std::string>& launch) {
  std::map<std::string, std::string> by_key;
  std::vector<std::string> order;
  for (const auto* list : {&image, &launch})
    for (const std::string& kv : *list) {
      std::string key = kv.substr(0, kv.find('='));
      if (!by_key.contains(key)) order.push_back(key);
      by_key[key] = kv;
    }
  std::vector<std::string> out;
  for (const std::string& key : order) out.push_back(by_key[key]);
  return out;
}

}  // namespace

bool WatchdogHealthy(const std::string& ip, int port,
                     std::chrono::milliseconds timeout) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) == 1;
  auto deadline = Clock::now() + timeout;
  auto wait = [&](short events) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    return poll(&p, 1, static_cast<int>(left.count())) == 1 &&
           (p.revents & events) != 0;
  };
  if (ok && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    ok = errno == EINPROGRESS && wait(POLLOUT);
  int err = 0;
  socklen_t len = sizeof err;
  if (ok) ok = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && !err;
  const std::string req =
      "GET /_/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  if (ok)
    ok = send(fd, req.data(), req.size(), MSG_NOSIGNAL) ==
         static_cast<ssize_t>(req.size());
  std::string head;
  while (ok && head.find("\r\n") == std::string::npos && wait(POLLIN)) {
    char buf[256];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return ok && (absl::StartsWith(head, "HTTP/1.1 200") ||
                absl::StartsWith(head, "HTTP/1.0 200"));
}

absl::StatusOr<RunningContainer> ContainerRuntime::Start(
    const ContainerLaunch& launch, std::chrono::milliseconds timeout) {
  auto image = client_->GetImage(launch.image);
  if (!image.ok()) return image.status();
  containerd::ContainerSpec spec;
  spec.id = launch.id;
  spec.image = image->name;
  spec.read_only_root = launch.read_only_root;
  spec.args = image->entrypoint;
  spec.args.insert(spec.args.end(), image->cmd.begin(), image->cmd.end());
  if (spec.args.empty())
    return absl::FailedPreconditionError(absl::StrCat(
        "image ", image->name, " names no command (Entrypoint or Cmd)"));
  spec.env = MergeEnv(image->env, launch.env);
  if (!image->working_dir.empty()) spec.cwd = image->working_dir;
  spec.memory_limit_bytes = launch.memory_limit_bytes;
  spec.cpu_millis = launch.cpu_millis;
  spec.log_path = launch.log_path;
  spec.restore_from = launch.restore_from;
  if (!launch.secrets_dir.empty())
    spec.mounts.push_back({launch.secrets_dir, kContainerSecretsDir, true});
  // Its network first (a namespace of its own on the bridge), held until
  // Stop; then the container joins it.
  auto netns = containerd::NetworkNamespace::Create();
  if (!netns.ok()) return netns.status();
  spec.netns = netns->path();
  {
    absl::MutexLock l(&mu_);
    if (!netns_.try_emplace(launch.id, *std::move(netns)).second)
      return absl::AlreadyExistsError(
          absl::StrCat("container ", launch.id, " runs already"));
  }
  // Where the start's time goes, for the function's log.
  auto t = Clock::now();
  auto lap = [&t](const char* what) {
    auto now = Clock::now();
    std::string out = absl::StrFormat(
        "%s %.1f ms", what,
        std::chrono::duration<double, std::milli>(now - t).count());
    t = now;
    return out;
  };
  auto ip = cni_->Add(launch.id, spec.netns);
  absl::Status s = ip.status();
  std::vector<std::string> phases = {lap("network")};
  if (s.ok()) s = client_->Create(spec);
  phases.push_back(lap("create"));
  if (s.ok()) s = client_->Start(launch.id);
  phases.push_back(lap("start"));
  if (!s.ok()) {
    Stop(launch.id).IgnoreError();
    return s;
  }
  // Its process, to tell a watchdog not yet listening from one that exited
  // (none: it has exited already).
  auto pid = client_->Pid(launch.id);
  const pid_t task_pid = pid.ok() ? *pid : -1;
  RunningContainer running{.id = launch.id,
                           .ip = *ip,
                           .netns = spec.netns,
                           .image_digest = image->digest};
  auto deadline = Clock::now() + timeout;
  // Polled, as faasd's gateway polls: refused at once until the watchdog
  // listens; between tries, 1 ms doubling to 8.
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (WatchdogHealthy(running.ip, kWatchdogPort,
                        std::chrono::milliseconds(500))) {
      phases.push_back(lap("healthy"));
      running.phases = absl::StrJoin(phases, ", ");
      return running;
    }
    if (task_pid > 0 && kill(task_pid, 0) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(8));
      continue;
    }
    // Exited: no health will come.
    auto exited = client_->Wait(launch.id, std::chrono::milliseconds(100));
    if (exited.ok() || Clock::now() >= deadline) {
      Stop(launch.id).IgnoreError();  // also makes the log whole
      std::string log = launch.log_path.empty() ? "" : Tail(launch.log_path);
      if (exited.ok())
        return absl::FailedPreconditionError(absl::StrCat(
            "the container of ", image->name, " exited with status ", *exited,
            " before its watchdog answered /_/health", log.empty() ? "" : ": ",
            log));
      return absl::DeadlineExceededError(absl::StrCat(
          "the watchdog of ", image->name,
          " did not answer /_/health on :", kWatchdogPort, " within ",
          timeout.count(), " ms", log.empty() ? "" : ": ", log));
    }
  }
}

absl::StatusOr<std::string> ContainerRuntime::ImageDigest(
    const std::string& name) {
  auto image = client_->GetImage(name);
  if (!image.ok()) return image.status();
  return image->digest;
}

absl::Status ContainerRuntime::Freeze(const std::string& id, bool frozen) {
  // cgroup v1 (a hybrid host: runc puts the container in each controller's
  // hierarchy) or v2.
  const std::string cgroup = client_->CgroupPath(id);
  const std::string v1 =
      absl::StrCat("/sys/fs/cgroup/freezer", cgroup, "/freezer.state");
  const std::string v2 =
      absl::StrCat("/sys/fs/cgroup", cgroup, "/cgroup.freeze");
  const bool is_v1 = access(v1.c_str(), W_OK) == 0;
  const std::string& path = is_v1 ? v1 : v2;
  const char* value =
      is_v1 ? (frozen ? "FROZEN" : "THAWED") : (frozen ? "1" : "0");
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT
               ? absl::NotFoundError(absl::StrCat("container ", id, " is gone"))
               : absl::InternalError(
                     absl::StrCat("open ", path, ": ", strerror(errno)));
  bool ok =
      write(fd, value, strlen(value)) == static_cast<ssize_t>(strlen(value));
  int err = errno;
  close(fd);
  if (!ok)
    return absl::InternalError(
        absl::StrCat("freezing container ", id, ": ", strerror(err)));
  return absl::OkStatus();
}

std::vector<pid_t> ContainerRuntime::Pids(const std::string& id) {
  const std::string cgroup = client_->CgroupPath(id);
  std::vector<pid_t> out;
  for (const std::string& path :
       {absl::StrCat("/sys/fs/cgroup/memory", cgroup, "/cgroup.procs"),
        absl::StrCat("/sys/fs/cgroup/freezer", cgroup, "/cgroup.procs"),
        absl::StrCat("/sys/fs/cgroup", cgroup, "/cgroup.procs")}) {
    std::ifstream in(path);
    for (pid_t pid; in >> pid;) out.push_back(pid);
    if (!out.empty()) break;
  }
  return out;
}

void ContainerLease::Release() {
  if (runtime_ == nullptr) return;
  if (auto s = runtime_->Stop(id_); !s.ok())
    fprintf(stderr, "silt-invoker: stopping container %s: %s\n", id_.c_str(),
            std::string(s.message()).c_str());
  runtime_.reset();
}

absl::Status ContainerRuntime::Stop(const std::string& id) {
  std::optional<containerd::NetworkNamespace> netns;
  {
    absl::MutexLock l(&mu_);
    if (auto it = netns_.find(id); it != netns_.end()) {
      netns = std::move(it->second);
      netns_.erase(it);
    }
  }
  absl::Status deleted = Delete(id);
  // After the container, through the namespace still held: the plugins
  // undo their work in it.
  absl::Status unplugged = cni_->Del(id, netns ? netns->path() : "");
  return deleted.ok() ? unplugged : deleted;
}

namespace {

// The containerd shim of container `id` in namespace `ns` (its command line
// names both), or -1.
pid_t ShimOf(const std::string& ns, const std::string& id) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
    std::vector<std::string> args = absl::StrSplit(cmd, '\0');
    if (args.empty() || !absl::EndsWith(args[0], "containerd-shim-runc-v2"))
      continue;
    bool ns_ok = false, id_ok = false;
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      ns_ok |= args[i] == "-namespace" && args[i + 1] == ns;
      id_ok |= args[i] == "-id" && args[i + 1] == id;
    }
    if (ns_ok && id_ok) return pid;
  }
  return -1;
}

}  // namespace

absl::Status ContainerRuntime::Delete(const std::string& id) {
  // A frozen task would not die of the kill that deletes it.
  Freeze(id, false).IgnoreError();
  // A task whose start was cut short (the invoker restoring it died) is one
  // its shim never saw start, so it neither kills it nor sees it end: its
  // processes die by its cgroup, the shim goes, and containerd cleans up
  // after it.
  auto stop_lost = [&] {
    for (pid_t pid : Pids(id)) kill(pid, SIGKILL);
    if (pid_t shim = ShimOf(client_->Namespace(), id); shim > 0) {
      kill(shim, SIGKILL);
      for (int i = 0; i < 200 && kill(shim, 0) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  if (client_->TaskLost(id)) stop_lost();
  absl::Status s = client_->Delete(id, std::chrono::seconds(3));
  if (!s.ok() && !absl::IsNotFound(s)) {  // (lost in a way not seen above)
    stop_lost();
    s = client_->Delete(id, std::chrono::seconds(1));
  }
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

absl::Status ContainerRuntime::Checkpoint(const std::string& id,
                                          const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec))
    return absl::AlreadyExistsError(absl::StrCat(dir, " exists"));
  std::string tmp = absl::StrCat(dir, ".tmp-", id);
  std::filesystem::remove_all(tmp, ec);
  std::filesystem::remove_all(tmp + ".work", ec);
  absl::Status s = client_->Checkpoint(id, tmp);
  if (s.ok() && rename(tmp.c_str(), dir.c_str()) != 0)
    s = errno == EEXIST || errno == ENOTEMPTY
            ? absl::AlreadyExistsError(absl::StrCat(dir, " exists"))
            : absl::InternalError(
                  absl::StrCat("rename to ", dir, ": ", strerror(errno)));
  // CRIU's log stays beside it when it failed, for whoever looks.
  if (s.ok()) std::filesystem::remove_all(tmp + ".work", ec);
  if (!s.ok()) std::filesystem::remove_all(tmp, ec);
  if (!s.ok() && !absl::IsAlreadyExists(s))
    return absl::FailedPreconditionError(s.message());
  return s;
}

std::string ContainerRuntime::WhyLost(const std::string& id,
                                      std::chrono::milliseconds wait) {
  // The memory cgroup's OOM kills (cgroup v1: memory.oom_control; v2:
  // memory.events).
  uint64_t oom_kills = 0;
  const std::string cgroup = client_->CgroupPath(id);
  for (const std::string& path :
       {absl::StrCat("/sys/fs/cgroup/memory", cgroup, "/memory.oom_control"),
        absl::StrCat("/sys/fs/cgroup", cgroup, "/memory.events")}) {
    std::ifstream in(path);
    for (std::string key; in >> key;) {
      uint64_t v = 0;
      in >> v;
      if (key == "oom_kill") oom_kills = std::max(oom_kills, v);
    }
  }
  auto exited = client_->Wait(id, wait);
  std::string why =
      exited.ok() ? absl::StrCat("its container exited with status ", *exited)
                  : "its container's watchdog broke off the call";
  if (oom_kills > 0)
    absl::StrAppend(&why, " (", oom_kills,
                    " process(es) killed at the function's memory limit)");
  return why;
}

std::vector<std::string> ContainerRuntime::RemoveOthers() {
  std::vector<std::string> removed;
  auto ids = client_->List();
  if (!ids.ok()) return removed;
  for (const std::string& id : *ids) {
    {
      absl::MutexLock l(&mu_);
      if (netns_.contains(id)) continue;
    }
    // Its network through its namespace while its task still runs (the
    // interface and rules go too), then the container.
    auto pid = client_->Pid(id);
    std::string netns = pid.ok() ? absl::StrCat("/proc/", *pid, "/ns/net") : "";
    if (!cni_->Del(id, netns).ok() && !netns.empty())
      cni_->Del(id, "").IgnoreError();
    absl::Status s = Delete(id);
    if (!s.ok())
      fprintf(stderr, "silt-invoker: removing container %s: %s\n", id.c_str(),
              std::string(s.message()).c_str());
    removed.push_back(id);
  }
  return removed;
}

}  // namespace silt::invoker
