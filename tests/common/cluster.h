// A Silt cluster on one machine for integration tests and benchmarks: the
// real silt-gateway and several silt-invoker nodes, each node in a network
// namespace of its own (veth on a bridge in the test's namespace, addresses
// from 198.18.0.0/15) or, without root, on the host's loopback.
//
//   auto c = Cluster::Start(dir);
//   c->AddNode({.name = "node-a", .memory_mib = 512});
//   c->AddNode({.name = "node-b", .memory_mib = 4096});
//   c->WaitNodes(2);
//   c->Silt({"deploy", "-f", "stack.yml"});
//
// Names of namespaces and links carry the test process's pid, so parallel
// tests never collide; the destructor stops the daemons and removes them.
#ifndef SILT_TESTS_COMMON_CLUSTER_H_
#define SILT_TESTS_COMMON_CLUSTER_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gateway_process.h"
#include "common/process.h"

namespace silt::testing {

struct ClusterOptions {
  // Each node in its own network namespace (needs root and `ip`); otherwise
  // every daemon listens on 127.0.0.1.
  bool network_namespaces = true;
  std::vector<std::string> gateway_flags = {"--node-timeout-ms", "1000"};
};

struct NodeOptions {
  std::string name;
  uint32_t cpus = 0;               // --cpus; 0: the machine's
  uint64_t memory_mib = 0;         // --memory; 0: the machine's
  std::vector<std::string> extra;  // more silt-invoker flags
};

// Busy processes in a node's cgroup: CPU that is not Silt's, as its invoker
// sees it. Killed when this goes.
class CpuHog {
 public:
  explicit CpuHog(std::vector<pid_t> pids) : pids_(std::move(pids)) {}
  ~CpuHog();
  CpuHog(const CpuHog&) = delete;
  CpuHog& operator=(const CpuHog&) = delete;

 private:
  std::vector<pid_t> pids_;
};

// The containers, on any node, whose id starts with `prefix` (a function's
// instances: "NAME-") and whose processes are frozen: staged instances (the
// nodes' containerd namespace is "silt"; cgroup v1's freezer or v2). A
// container being restored reads frozen too for a while (CRIU restores the
// freezer state it was dumped in, then thaws it): a function's log says
// when it has an instance staged.
std::vector<std::string> FrozenContainers(const std::string& prefix);

class Cluster {
 public:
  // Starts the gateway (data in `dir`/gateway) and logs the CLI in (config in
  // `dir`/config).
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(
      const std::string& dir, ClusterOptions options = {});
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Starts an invoker and waits until it listens (not until it registered:
  // see WaitNodes).
  absl::Status AddNode(const NodeOptions& node);
  // Stops a node with `sig` (SIGTERM: drains; SIGKILL: dies) and returns its
  // wait status; the node's namespace stays for a restart.
  int StopNode(const std::string& name, int sig);
  // Puts a root qdisc on what the node sends (e.g. "tbf rate 50mbit burst
  // 32kbit latency 400ms"; this kernel has no netem); needs network
  // namespaces.
  absl::Status ShapeLink(const std::string& name, const std::string& qdisc);
  // Starts `processes` busy loops inside the node's own cgroup (beside its
  // instances' cgroups, under its --cpus quota). Needs root.
  absl::StatusOr<std::unique_ptr<CpuHog>> StartCpuHog(const std::string& name,
                                                      int processes);
  // Stops the gateway with `sig` (SIGKILL: a crash) and starts it again on its
  // data dir and invoker address, so the invokers reconnect; its HTTP port
  // changes, and the CLI is logged in again.
  absl::Status RestartGateway(int sig);
  // Waits until the gateway lists exactly `n` nodes.
  absl::Status WaitNodes(size_t n);

  GatewayProcess& gateway() { return *gateway_; }
  Process& node(const std::string& name) { return *nodes_.at(name).process; }
  // The address the node's services listen on (its veth address or
  // 127.0.0.1).
  const std::string& address(const std::string& name) const {
    return nodes_.at(name).ip;
  }
  // The node's invoker gRPC address (what the gateway calls), "host:port".
  const std::string& grpc_address(const std::string& name) const {
    return nodes_.at(name).grpc;
  }
  // Runs the `silt` CLI against this cluster.
  RunResult Silt(std::vector<std::string> args,
                 const std::string& input = "") const;
  // Builds the C++ function in `handler_dir` as `name` with the CLI and
  // pushes it; returns the image to deploy ("name@sha256:...").
  absl::StatusOr<std::string> BuildAndPush(const std::string& name,
                                           const std::string& handler_dir);
  // Runs `argv` inside the node's network namespace (or plainly).
  std::vector<std::string> InNode(const std::string& name,
                                  std::vector<std::string> argv) const;

 private:
  struct Node {
    std::string ip;
    std::string netns;  // empty without namespaces
    std::string link;   // its end of the veth pair, inside netns
    std::string grpc;   // the invoker's gRPC address, once started
    std::unique_ptr<Process> process;
  };
  Cluster() = default;
  absl::Status CreateBridge();
  absl::StatusOr<Node> CreateNamespace(const std::string& name);

  std::string dir_;
  ClusterOptions options_;
  std::string prefix_;    // of namespace and link names
  std::string subnet_;    // "198.18.N." without the last byte
  int subnet_lock_ = -1;  // held while the subnet is this cluster's
  std::string bridge_;
  int next_host_ = 2;
  std::unique_ptr<GatewayProcess> gateway_;
  std::map<std::string, Node> nodes_;
};

}  // namespace silt::testing

#endif  // SILT_TESTS_COMMON_CLUSTER_H_
