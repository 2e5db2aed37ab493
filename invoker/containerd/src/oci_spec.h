// The OCI runtime spec (JSON) of a ContainerSpec, as runc takes it.
#ifndef SILT_CONTAINERD_OCI_SPEC_H_
#define SILT_CONTAINERD_OCI_SPEC_H_

#include <string>

#include "containerd/containerd.h"

namespace silt::containerd {

// `ns`: the containerd namespace (the container's cgroup is /silt-NS/ID).
std::string OciSpecJson(const ContainerSpec& spec, const std::string& ns);
// The cgroup of container `id` of namespace `ns` (Client::CgroupPath).
inline std::string CgroupPathOf(const std::string& ns, const std::string& id) {
  return "/silt-" + ns + "/" + id;
}

}  // namespace silt::containerd

#endif  // SILT_CONTAINERD_OCI_SPEC_H_
