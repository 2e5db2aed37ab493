#include "common/cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace silt::testing {

std::vector<std::string> FrozenContainers(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& [dir, file, frozen] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"/sys/fs/cgroup/freezer/silt-silt", "freezer.state", "FROZEN"},
           {"/sys/fs/cgroup/silt-silt", "cgroup.freeze", "1"}}) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      std::string id = e.path().filename().string();
      if (!e.is_directory() || id.rfind(prefix, 0) != 0) continue;
      std::ifstream in(e.path() / file);
      std::string state;
      if (in >> state && state == frozen) out.push_back(id);
    }
    if (!out.empty()) break;
  }
  return out;
}
namespace {

constexpr char kIp[] = "/usr/sbin/ip";
constexpr char kNsenter[] = "/usr/bin/nsenter";

absl::Status Ip(std::vector<std::string> args) {
  args.insert(args.begin(), kIp);
  auto r = RunCommand(args);
  if (r.exit_code != 0)
    return absl::InternalError(
        absl::StrCat(absl::StrJoin(args, " "), ": ", r.err));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(
    const std::string& dir, ClusterOptions options) {
  std::unique_ptr<Cluster> c(new Cluster);
  c->dir_ = dir;
  c->options_ = std::move(options);
  std::string grpc_listen = "127.0.0.1:0";
  if (c->options_.network_namespaces) {
    if (geteuid() != 0 || access(kIp, X_OK) != 0 || access(kNsenter, X_OK) != 0)
      return absl::FailedPreconditionError(
          "network namespaces need root, ip (iproute2) and nsenter");
    // 512 /24 subnets of 198.18.0.0/15, one per live cluster: the first free
    // one from the pid on, held by a lock on a file (released however this
    // process ends). Two clusters on one subnet would route into each other.
    int n = -1;
    for (int i = 0; i < 512 && n < 0; ++i) {
      int k = static_cast<int>((getpid() + i) % 512);
      int fd =
          open(absl::StrCat("/tmp/silt-cluster-subnet-", k, ".lock").c_str(),
               O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0) continue;
      if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        c->subnet_lock_ = fd;
        n = k;
      } else {
        close(fd);
      }
    }
    if (n < 0)
      return absl::ResourceExhaustedError("no free test subnet in 198.18/15");
    c->subnet_ = absl::StrCat("198.", 18 + n / 256, ".", n % 256, ".");
    // Links and namespaces are named per cluster, not per process: the
    // kernel takes a deleted namespace's veth away asynchronously, and the
    // next test's cluster in this process must not trip over it.
    static std::atomic<int> clusters{0};
    c->prefix_ = absl::StrCat("s", getpid() % 100000,
                              std::string(1, 'a' + clusters++ % 26));
    if (auto s = c->CreateBridge(); !s.ok()) return s;
    grpc_listen = c->subnet_ + "1:0";
  }
  auto gw = GatewayProcess::Start(dir + "/gateway", c->options_.gateway_flags,
                                  grpc_listen);
  if (!gw.ok()) return gw.status();
  c->gateway_ = std::make_unique<GatewayProcess>(*std::move(gw));
  auto r = c->Silt({"login", "--password-stdin"}, c->gateway_->password());
  if (r.exit_code != 0)
    return absl::InternalError(absl::StrCat("silt login: ", r.err));
  return c;
}

absl::Status Cluster::RestartGateway(int sig) {
  std::string grpc = gateway_->grpc_address();
  gateway_->Stop(sig);
  auto gw =
      GatewayProcess::Start(dir_ + "/gateway", options_.gateway_flags, grpc);
  if (!gw.ok()) return gw.status();
  *gateway_ = *std::move(gw);
  auto r = Silt({"login", "--password-stdin"}, gateway_->password());
  if (r.exit_code != 0)
    return absl::InternalError(absl::StrCat("silt login: ", r.err));
  return absl::OkStatus();
}

absl::Status Cluster::CreateBridge() {
  // A cluster killed before its destructor ran (a test timed out) left its
  // bridge with an address in this subnet, and its route would carry our
  // nodes' replies into it. The subnet's lock says no live cluster owns it.
  std::vector<std::string> show = {kIp,    "-o", "addr",
                                   "show", "to", subnet_ + "0/24"};
  for (absl::string_view line :
       absl::StrSplit(RunCommand(show).out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() > 1) (void)Ip({"link", "del", f[1].substr(0, f[1].find('@'))});
  }
  bridge_ = prefix_ + "br";
  if (auto s = Ip({"link", "add", bridge_, "type", "bridge"}); !s.ok())
    return s;
  if (auto s = Ip({"addr", "add", subnet_ + "1/24", "dev", bridge_}); !s.ok())
    return s;
  return Ip({"link", "set", bridge_, "up"});
}

absl::StatusOr<Cluster::Node> Cluster::CreateNamespace(
    const std::string& name) {
  Node node;
  int host = next_host_++;
  node.netns = absl::StrCat(prefix_, "n", host);
  node.ip = absl::StrCat(subnet_, host);
  std::string outside = absl::StrCat(prefix_, "v", host);
  std::string inside = absl::StrCat(prefix_, "i", host);
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"netns", "add", node.netns},
           {"link", "add", outside, "type", "veth", "peer", "name", inside},
           {"link", "set", inside, "netns", node.netns},
           {"link", "set", outside, "master", bridge_},
           {"link", "set", outside, "up"},
           {"-n", node.netns, "addr", "add", node.ip + "/24", "dev", inside},
           {"-n", node.netns, "link", "set", inside, "up"},
           {"-n", node.netns, "link", "set", "lo", "up"}}) {
    if (auto s = Ip(args); !s.ok()) {
      (void)Ip({"netns", "del", node.netns});  // takes `inside` with it
      (void)Ip({"link", "del", outside});
      return s;
    }
  }
  (void)name;
  node.link = inside;
  return node;
}

Cluster::~Cluster() {
  // SIGTERM: an invoker drains and tears its instances down on the way out;
  // all at once, then wait for each.
  for (auto& [name, node] : nodes_)
    if (node.process && node.process->pid() > 0)
      kill(node.process->pid(), SIGTERM);
  for (auto& [name, node] : nodes_)
    if (node.process) node.process->Stop(0);
  gateway_.reset();
  for (auto& [name, node] : nodes_)
    if (!node.netns.empty()) (void)Ip({"netns", "del", node.netns});
  if (!bridge_.empty()) (void)Ip({"link", "del", bridge_});
  if (subnet_lock_ >= 0) close(subnet_lock_);
}

std::vector<std::string> Cluster::InNode(const std::string& name,
                                         std::vector<std::string> argv) const {
  const Node& node = nodes_.at(name);
  if (node.netns.empty()) return argv;
  argv.insert(argv.begin(), {kNsenter, "--net=/run/netns/" + node.netns, "--"});
  return argv;
}

absl::Status Cluster::AddNode(const NodeOptions& options) {
  auto it = nodes_.find(options.name);
  if (it == nodes_.end()) {
    Node node{.ip = "127.0.0.1"};
    if (options_.network_namespaces) {
      auto created = CreateNamespace(options.name);
      if (!created.ok()) return created.status();
      node = *std::move(created);
    }
    it = nodes_.emplace(options.name, std::move(node)).first;
  } else if (it->second.process && it->second.process->pid() > 0) {
    return absl::AlreadyExistsError(options.name + " is running");
  }
  std::vector<std::string> args = {SILT_INVOKER_BIN,
                                   "--gateway",
                                   gateway_->grpc_address(),
                                   "--listen",
                                   it->second.ip + ":0",
                                   "--data-dir",
                                   dir_ + "/" + options.name,
                                   "--node-name",
                                   options.name,
                                   "--report-interval-ms",
                                   "100"};
  if (options.cpus)
    args.insert(args.end(), {"--cpus", absl::StrCat(options.cpus)});
  if (options.memory_mib)
    args.insert(args.end(), {"--memory", absl::StrCat(options.memory_mib)});
  args.insert(args.end(), options.extra.begin(), options.extra.end());
  auto p = Process::Start(InNode(options.name, args));
  if (!p.ok()) return p.status();
  auto line = p->WaitForLine("listening on ", std::chrono::seconds(30));
  if (!line.ok()) return line.status();
  std::string_view text = *line;
  size_t at = text.find("listening on ");
  text = text.substr(at + 13);
  it->second.grpc = std::string(text.substr(0, text.find_first_of(" \n")));
  it->second.process = std::make_unique<Process>(*std::move(p));
  return absl::OkStatus();
}

CpuHog::~CpuHog() {
  for (pid_t p : pids_) kill(p, SIGKILL);
  for (pid_t p : pids_) waitpid(p, nullptr, 0);
}

absl::StatusOr<std::unique_ptr<CpuHog>> Cluster::StartCpuHog(
    const std::string& name, int processes) {
  auto it = nodes_.find(name);
  if (it == nodes_.end() || !it->second.process)
    return absl::NotFoundError("no node " + name);
  std::string id;
  std::ifstream(dir_ + "/" + name + "/node-id") >> id;
  if (id.empty()) return absl::FailedPreconditionError("node-id not written");
  // The invoker's own cgroups; its node cgroup is silt/<id> below each.
  std::vector<std::string> dirs;
  std::ifstream in(
      absl::StrCat("/proc/", it->second.process->pid(), "/cgroup"));
  std::string line;
  bool v2 = std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers");
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (v2 && f[1].empty()) dirs.push_back("/sys/fs/cgroup" + f[2]);
    for (absl::string_view c : absl::StrSplit(f[1], ','))
      if (!v2 && (c == "cpu" || c == "cpuacct"))
        dirs.push_back(absl::StrCat("/sys/fs/cgroup/", c, f[2]));
  }
  std::vector<pid_t> pids;
  for (int i = 0; i < processes; ++i) {
    pid_t p = fork();
    if (p < 0) return absl::InternalError("fork failed");
    if (p == 0) {
      volatile uint64_t n = 0;
      while (true) n = n + 1;
    }
    pids.push_back(p);
  }
  auto hog = std::make_unique<CpuHog>(pids);
  for (const auto& d : dirs) {
    std::string procs = absl::StrCat(d, d.back() == '/' ? "" : "/", "silt/", id,
                                     "/cgroup.procs");
    for (pid_t p : pids) {
      std::ofstream out(procs);
      out << p << std::endl;
      if (!out) return absl::InternalError("cannot write " + procs);
    }
  }
  return hog;
}

absl::Status Cluster::ShapeLink(const std::string& name,
                                const std::string& qdisc) {
  const Node& node = nodes_.at(name);
  if (node.netns.empty())
    return absl::FailedPreconditionError("shaping needs network namespaces");
  std::vector<std::string> args = {"/usr/sbin/tc", "-n",  node.netns, "qdisc",
                                   "replace",      "dev", node.link,  "root"};
  for (absl::string_view w : absl::StrSplit(qdisc, ' ', absl::SkipEmpty()))
    args.emplace_back(w);
  auto r = RunCommand(args);
  if (r.exit_code != 0)
    return absl::InternalError(
        absl::StrCat(absl::StrJoin(args, " "), ": ", r.err));
  return absl::OkStatus();
}

int Cluster::StopNode(const std::string& name, int sig) {
  auto& node = nodes_.at(name);
  int status = node.process->Stop(sig);
  node.process.reset();
  return status;
}

absl::Status Cluster::WaitNodes(size_t n) {
  std::string last;
  if (Eventually([&] {
        auto r = gateway_->Call("GET", "/system/nodes");
        last = r.body;
        auto nodes = nlohmann::json::parse(r.body, nullptr, false);
        return r.status == 200 && nodes.is_array() && nodes.size() == n;
      }))
    return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("expected ", n, " nodes registered; /system/nodes: ", last));
}

absl::StatusOr<std::string> Cluster::BuildAndPush(
    const std::string& name, const std::string& handler_dir) {
  const std::string stack = absl::StrCat(dir_, "/", name, ".yml");
  std::ofstream(stack) << "version: 1.0\nprovider:\n  name: openfaas\n"
                       << "functions:\n  " << name << ":\n    lang: cpp\n"
                       << "    handler: " << handler_dir
                       << "\n    image: " << name << "\n";
  auto built = Silt({"build", "-f", stack});
  if (built.exit_code != 0)
    return absl::InternalError(
        absl::StrCat("silt build ", name, ": ", built.out, built.err));
  auto pushed = Silt({"push", "-f", stack});
  size_t at = pushed.out.find("sha256:");
  if (pushed.exit_code != 0 || at == std::string::npos)
    return absl::InternalError(
        absl::StrCat("silt push ", name, ": ", pushed.out, pushed.err));
  return absl::StrCat(name, "@", pushed.out.substr(at, 71));
}

RunResult Cluster::Silt(std::vector<std::string> args,
                        const std::string& input) const {
  args.insert(args.begin(), SILT_CLI_BIN);
  return RunCommand(args, input,
                    {{"OPENFAAS_CONFIG", dir_ + "/config"},
                     {"OPENFAAS_URL", gateway_->url()}});
}

}  // namespace silt::testing
