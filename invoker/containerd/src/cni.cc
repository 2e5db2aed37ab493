#include "containerd/cni.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace silt::containerd {
namespace {

using nlohmann::json;

constexpr char kVersion[] = "0.4.0";

// Runs a tool (argv[0] a path) with no input or output: its exit status, or
// -1 when it cannot run.
int RunTool(std::vector<std::string> argv) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  for (int fd : {0, 1, 2})
    posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", O_RDWR, 0);
  pid_t pid = -1;
  int err = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) return -1;
  int status = 0;
  pid_t r;
  while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (r != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The node's one masquerading rule for the containers' egress (as docker
// keeps one per bridge network): from the subnet to anywhere outside it.
std::vector<std::string> MasqueradeRule(const std::string& action,
                                        const std::string& subnet) {
  return {"/usr/sbin/iptables",
          "-w",
          "-t",
          "nat",
          action,
          "POSTROUTING",
          "-s",
          subnet,
          "!",
          "-d",
          subnet,
          "-m",
          "comment",
          "--comment",
          "silt: containers' egress",
          "-j",
          "MASQUERADE"};
}

}  // namespace

absl::StatusOr<NetworkNamespace> NetworkNamespace::Create() {
  // A thread of its own enters a new namespace (unshare acts on the calling
  // thread only) and opens it before it ends.
  int fd = -1, err = 0;
  std::thread([&] {
    if (unshare(CLONE_NEWNET) != 0 ||
        (fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) < 0) {
      err = errno;
      return;
    }
    // Loopback up, as CNI's loopback plugin would (without a process).
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0 ||
        (ifr.ifr_flags |= IFF_UP, ioctl(s, SIOCSIFFLAGS, &ifr)) != 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
    if (s >= 0) close(s);
  }).join();
  if (fd < 0)
    return absl::InternalError(
        absl::StrCat("cannot make a network namespace: ", strerror(err)));
  return NetworkNamespace(fd);
}

NetworkNamespace& NetworkNamespace::operator=(NetworkNamespace&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

NetworkNamespace::~NetworkNamespace() {
  if (fd_ >= 0) close(fd_);
}

std::string NetworkNamespace::path() const {
  return absl::StrCat("/proc/", getpid(), "/fd/", fd_);
}

absl::StatusOr<std::unique_ptr<Cni>> Cni::Create(CniOptions options) {
  for (const char* p : {"bridge", "host-local"})
    if (access((options.plugin_dir + "/" + p).c_str(), X_OK) != 0)
      return absl::FailedPreconditionError(absl::StrCat(
          "the CNI plugin ", p, " is not in ", options.plugin_dir,
          ": install containernetworking-plugins (deploy/setup.sh)"));
  if (options.state_dir.empty())
    return absl::InvalidArgumentError("CNI needs a state directory");
  // Egress by one node-wide rule rather than the bridge plugin's ipMasq (a
  // chain and rules per container, made and removed with iptables on every
  // start and stop: 30 ms of each start, 60 ms of each stop here).
  if (RunTool(MasqueradeRule("-C", options.subnet)) != 0 &&
      RunTool(MasqueradeRule("-A", options.subnet)) != 0)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot add the masquerading rule for ", options.subnet,
                     " (iptables -t nat -A POSTROUTING): install iptables "
                     "(deploy/setup.sh)"));
  return std::unique_ptr<Cni>(new Cni(std::move(options)));
}

absl::Status Cni::Unmasquerade() {
  while (RunTool(MasqueradeRule("-C", options_.subnet)) == 0)
    if (RunTool(MasqueradeRule("-D", options_.subnet)) != 0)
      return absl::InternalError(absl::StrCat(
          "cannot remove the masquerading rule for ", options_.subnet));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Cni::Run(const std::string& plugin,
                                     const std::string& command,
                                     const std::string& id,
                                     const std::string& netns,
                                     const std::string& ifname,
                                     const std::string& config) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return absl::InternalError("pipe failed");
  }
  std::string path = options_.plugin_dir + "/" + plugin;
  std::vector<std::string> env = {"CNI_COMMAND=" + command,
                                  "CNI_CONTAINERID=" + id,
                                  "CNI_NETNS=" + netns,
                                  "CNI_IFNAME=" + ifname,
                                  "CNI_PATH=" + options_.plugin_dir,
                                  "PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  std::vector<char*> envp, argv = {path.data(), nullptr};
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  pid_t pid = -1;
  int err =
      posix_spawn(&pid, path.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  if (err != 0) {
    close(in[1]);
    close(out[0]);
    return absl::InternalError(
        absl::StrCat("cannot run ", path, ": ", strerror(err)));
  }
  // The config is small (under a pipe's buffer): written whole, then the
  // result read to its end.
  const char* p = config.data();
  size_t left = config.size();
  while (left > 0) {
    ssize_t n = write(in[1], p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
  close(in[1]);
  std::string result;
  char buf[4096];
  for (;;) {
    ssize_t n = read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return result;
  // A plugin's error is a JSON object: {"code", "msg", "details"}.
  json j = json::parse(result, nullptr, false);
  std::string why = j.is_object() && j.contains("msg") && j["msg"].is_string()
                        ? j["msg"].get<std::string>()
                        : std::string(absl::StripAsciiWhitespace(result));
  if (j.is_object() && j.contains("details") && j["details"].is_string() &&
      !j["details"].get<std::string>().empty())
    absl::StrAppend(&why, ": ", j["details"].get<std::string>());
  return absl::UnavailableError(
      absl::StrCat("CNI ", plugin, " ", command, " for ", id, ": ", why));
}

std::string Cni::BridgeConfig() const {
  json net = {{"cniVersion", kVersion},
              {"name", "silt"},
              {"type", "bridge"},
              {"bridge", options_.bridge},
              {"isGateway", true},
              {"ipMasq", false},  // the node's rule (Create)
              {"ipam",
               {{"type", "host-local"},
                {"subnet", options_.subnet},
                {"dataDir", options_.state_dir},
                {"routes", {{{"dst", "0.0.0.0/0"}}}}}}};
  return net.dump();
}

absl::StatusOr<std::string> Cni::Add(const std::string& id,
                                     const std::string& netns) {
  absl::StatusOr<std::string> r =
      Run("bridge", "ADD", id, netns, "eth0", BridgeConfig());
  std::string ip;
  if (r.ok()) {
    json result = json::parse(*r, nullptr, false);
    if (result.is_object() && result.contains("ips") &&
        result["ips"].is_array())
      for (const auto& a : result["ips"])
        if (a.is_object() && a.contains("address") &&
            a["address"].is_string()) {
          std::string addr = a["address"].get<std::string>();
          ip = addr.substr(0, addr.find('/'));
          break;
        }
    if (ip.empty())
      r = absl::InternalError(
          absl::StrCat("CNI bridge gave ", id, " no address: ", *r));
  }
  if (!r.ok()) {
    Del(id, netns).IgnoreError();
    return r.status();
  }
  return ip;
}

absl::Status Cni::Del(const std::string& id, const std::string& netns) {
  auto r = Run("bridge", "DEL", id, netns, "eth0", BridgeConfig());
  return r.ok() ? absl::OkStatus() : r.status();
}

}  // namespace silt::containerd
