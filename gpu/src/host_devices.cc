#include "absl/strings/string_view.h"
#include "gpu/devices.h"

namespace silt::gpu {

absl::string_view DiscoveryBackend() { return "host"; }

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  return std::vector<DeviceInfo>{};
}

absl::Status SelfTest(int device) {
  return absl::UnimplementedError(
      "this build has no CUDA backend (nvcc was not found when Silt was "
      "built)");
}

}  // namespace silt::gpu
