// GPU discovery: what the invoker reports to the gateway for placing GPU
// proclets.
#ifndef SILT_GPU_DEVICES_H_
#define SILT_GPU_DEVICES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string uuid;
  uint64_t total_memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
};

// How ListDevices finds GPUs: "cuda" (the runtime API; built where nvcc
// was found) or "host" (it finds none).
absl::string_view DiscoveryBackend();

// The GPUs of this node. The host backend has none. The CUDA backend answers
// FailedPrecondition when the driver is missing or too old (a machine without a
// GPU).
absl::StatusOr<std::vector<DeviceInfo>> ListDevices();

// Runs a small kernel on `device` and checks its result: proves the device, the
// driver and the module loading path work end to end.
absl::Status SelfTest(int device);

}  // namespace silt::gpu

#endif  // SILT_GPU_DEVICES_H_
