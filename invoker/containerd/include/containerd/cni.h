// Container networking the way faasd does it: each container gets a network
// namespace with loopback and an eth0 on the node's bridge, an address from
// host-local IPAM and masquerading for its egress, by running the CNI plugins
// (Debian's containernetworking-plugins) as the CNI spec says: one process
// per operation, the network's config on stdin, the result on stdout. The
// namespace is made here and kept by a bind mount (as CRI runtimes do), so it
// outlives the container's processes until Del: the plugins need it to undo
// what they did.
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

class Cni {
 public:
  // FailedPrecondition when the plugins are not installed.
  static absl::StatusOr<std::unique_ptr<Cni>> Create(CniOptions options);

  struct Attachment {
    std::string netns;  // the namespace's path (ContainerSpec::netns)
    std::string ip;     // its IPv4 address on the bridge ("10.62.0.5")
  };
  // Makes container `id` a network namespace, connected.
  absl::StatusOr<Attachment> Add(const std::string& id);
  // Undoes Add: the address goes back to the pool, the masquerading rules
  // and the namespace go. OK when there was nothing to undo.
  absl::Status Del(const std::string& id);

 private:
  explicit Cni(CniOptions options) : options_(std::move(options)) {}
  std::string NetnsPath(const std::string& id) const;
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
