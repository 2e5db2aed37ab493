#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gpu/devices.h"

namespace silt::gpu {
namespace {

absl::Status FromCuda(cudaError_t err, const char* op) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg =
      absl::StrCat(op, ": ", cudaGetErrorName(err), " (", static_cast<int>(err),
                   "): ", cudaGetErrorString(err));
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice ||
      err == cudaErrorInvalidDevice) {
    return absl::FailedPreconditionError(msg);
  }
  if (err == cudaErrorMemoryAllocation)
    return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

__global__ void AddOne(int* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] += 1;
}

}  // namespace

absl::string_view DiscoveryBackend() { return "cuda"; }

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  int count = 0;
  if (auto s = FromCuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
      !s.ok())
    return s;
  std::vector<DeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p;
    if (auto s =
            FromCuda(cudaGetDeviceProperties(&p, i), "cudaGetDeviceProperties");
        !s.ok())
      return s;
    DeviceInfo d;
    d.index = i;
    d.name = p.name;
    char uuid[48];
    const unsigned char* u =
        reinterpret_cast<const unsigned char*>(p.uuid.bytes);
    snprintf(uuid, sizeof(uuid),
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%"
             "02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
             u[11], u[12], u[13], u[14], u[15]);
    d.uuid = uuid;
    d.total_memory_bytes = p.totalGlobalMem;
    d.compute_major = p.major;
    d.compute_minor = p.minor;
    d.multiprocessors = p.multiProcessorCount;
    out.push_back(std::move(d));
  }
  return out;
}

absl::Status SelfTest(int device) {
  if (auto s = FromCuda(cudaSetDevice(device), "cudaSetDevice"); !s.ok())
    return s;
  constexpr int kN = 1 << 16;
  std::vector<int> host(kN);
  for (int i = 0; i < kN; ++i) host[i] = i;
  int* dev = nullptr;
  if (auto s = FromCuda(cudaMalloc(&dev, kN * sizeof(int)), "cudaMalloc");
      !s.ok())
    return s;
  absl::Status s = FromCuda(
      cudaMemcpy(dev, host.data(), kN * sizeof(int), cudaMemcpyHostToDevice),
      "cudaMemcpy to device");
  if (s.ok()) {
    AddOne<<<(kN + 255) / 256, 256>>>(dev, kN);
    s = FromCuda(cudaGetLastError(), "kernel launch");
  }
  if (s.ok()) s = FromCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (s.ok())
    s = FromCuda(
        cudaMemcpy(host.data(), dev, kN * sizeof(int), cudaMemcpyDeviceToHost),
        "cudaMemcpy to host");
  cudaFree(dev);
  if (!s.ok()) return s;
  for (int i = 0; i < kN; ++i) {
    if (host[i] != i + 1) {
      return absl::DataLossError(absl::StrCat("self-test kernel produced ",
                                              host[i], " at ", i, ", expected ",
                                              i + 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace silt::gpu
