// The function's kernels: built to PTX (any NVIDIA GPU) and for the host
// backend (CPU cores) by `silt build`; see silt/gpu_kernel.h.
#include <silt/gpu_kernel.h>

extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
SILT_EXPORT_KERNEL(saxpy)

// calls[0] += 1: a counter that lives in device memory across calls.
extern "C" __global__ void count_call(unsigned long long* calls) {
  if (threadIdx.x == 0) calls[0] += 1;
}
SILT_EXPORT_KERNEL(count_call)
