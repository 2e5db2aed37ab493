// Container networking the way faasd does it: each container gets a network
// namespace with loopback and an eth0 on the node's bridge and an address from
// host-local IPAM, by running the CNI bridge plugin (Debian's
// containernetworking-plugins) as the CNI spec says: one process per
// operation, the network's config on stdin, the result on stdout. Egress is
// masqueraded by one rule for the node's subnet (made by Create, as docker
// keeps one per bridge network), loopback brought up by NetworkNamespace. A
// container's namespace is made by NetworkNamespace and held by its
// descriptor, named by a /proc path (/proc/PID/fd/N): the plugins, runc
// (ContainerSpec::netns, an external namespace CRIU leaves out of a
// checkpoint) and a sandbox joining it all reach it through /proc, so no
// bind mount pins it and nothing depends on which mount namespace containerd
// and the invoker run in (a restarted invoker adopts a containerd started by
// the one before, in the mount namespace that one had).
//
// Thread safety: Add and Del may run at once (host-local locks its store).
#ifndef SILT_CONTAINERD_CNI_H_
#define SILT_CONTAINERD_CNI_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace silt::containerd {

struct CniOptions {
  std::string bridge = "silt0";
  std::string subnet = "10.62.0.0/16";
  std::string plugin_dir = "/usr/lib/cni";
  std::string state_dir;  // host-local's address leases (required)
};

// A new network namespace with loopback up and nothing else in it, held by
// its descriptor.
class NetworkNamespace {
 public:
  static absl::StatusOr<NetworkNamespace> Create();
  NetworkNamespace(NetworkNamespace&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  NetworkNamespace& operator=(NetworkNamespace&& o) noexcept;
  ~NetworkNamespace();
  // Its path while this lives: /proc/<this process>/fd/<fd>.
  std::string path() const;

 private:
  explicit NetworkNamespace(int fd) : fd_(fd) {}
  int fd_ = -1;
};

class Cni {
 public:
  // Adds the node's masquerading rule for the subnet unless it is there.
  // FailedPrecondition when the plugins or iptables are not installed.
  static absl::StatusOr<std::unique_ptr<Cni>> Create(CniOptions options);
  // Removes that rule (a node that runs containers no more; tests).
  absl::Status Unmasquerade();

  // Connects container `id`'s network namespace (`netns`, a path to it) to
  // the bridge: its IPv4 address there ("10.62.0.5").
  absl::StatusOr<std::string> Add(const std::string& id,
                                  const std::string& netns);
  // Undoes Add: the address goes back to the pool; with the namespace
  // (still alive) also the interface and the masquerading rules; with
  // `netns` empty (the namespace is gone) only the address. OK when there
  // was nothing to undo.
  absl::Status Del(const std::string& id, const std::string& netns);

 private:
  explicit Cni(CniOptions options) : options_(std::move(options)) {}
  absl::StatusOr<std::string> Run(const std::string& plugin,
                                  const std::string& command,
                                  const std::string& id,
                                  const std::string& netns,
                                  const std::string& ifname,
                                  const std::string& config);
  std::string BridgeConfig() const;  // the network's config, ADD and DEL
  const CniOptions options_;
};

}  // namespace silt::containerd

#endif  // SILT_CONTAINERD_CNI_H_
