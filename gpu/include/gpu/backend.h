// Where a GPU proclet's device state lives: a CUDA device (the driver API,
// loaded at run time, so nodes without a GPU or a driver build and run the
// same binaries) or the node's CPU cores (the host backend: device memory is
// process memory, kernels are the host builds of the same sources, see
// silt/gpu_kernel.h). A Backend is one context: one proclet's, isolated from
// every other's. Not thread-safe: its owner serialises calls.
#ifndef SILT_GPU_BACKEND_H_
#define SILT_GPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace silt::gpu {

enum class BackendKind { kCuda, kHost };
std::string_view BackendName(BackendKind kind);  // "cuda", "host"

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

// A device address: a CUdeviceptr, or a pointer in the host backend.
using DevicePtr = uint64_t;

// A module's code in both forms (`silt build` makes both from one .cu): each
// backend loads the one it runs; both travel with a proclet that moves.
struct ModuleImage {
  std::string ptx;           // empty: built where nvcc was missing
  std::string host_library;  // a shared object's bytes
};

class Module {
 public:
  virtual ~Module() = default;
  // Queues kernel<<<grid, block, shared_bytes>>>; args[i] points to the i-th
  // parameter's value (a DevicePtr for pointers), as cuLaunchKernel takes
  // them. NotFound when the module has no such kernel.
  virtual absl::Status Launch(std::string_view kernel, Dim3 grid, Dim3 block,
                              uint32_t shared_bytes, void** args) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string device_name() const = 0;
  virtual uint64_t device_memory() const = 0;  // bytes in all

  // Zeroed.
  virtual absl::StatusOr<DevicePtr> Alloc(uint64_t bytes) = 0;
  virtual void Free(DevicePtr p, uint64_t bytes) = 0;
  // Wait for the launches queued before them.
  virtual absl::Status CopyIn(DevicePtr dst, const void* src, uint64_t n) = 0;
  virtual absl::Status CopyOut(void* dst, DevicePtr src, uint64_t n) = 0;
  virtual absl::StatusOr<std::unique_ptr<Module>> Load(
      const ModuleImage& image) = 0;
  // Waits for every launch queued; the first error of one of them.
  virtual absl::Status Synchronize() = 0;
};

// The host backend, running blocks on up to `threads` cores (0: all).
std::unique_ptr<Backend> MakeHostBackend(unsigned threads = 0);

// A context of CUDA device `device`. FailedPrecondition when there is no
// driver (libcuda.so.1) or no such device.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);

// Whether this node can make CUDA backends (a driver and at least one
// device), and the devices' count.
int CudaDeviceCount();

}  // namespace silt::gpu

#endif  // SILT_GPU_BACKEND_H_
