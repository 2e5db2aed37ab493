// Kernels of the GPU tests, built like `silt build` builds a function's
// kernels: to PTX with nvcc and to a host library with the C++ compiler.
#include <silt/gpu_kernel.h>

extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
SILT_EXPORT_KERNEL(saxpy)

// Each block sums its 256 elements through shared memory, halving at every
// __syncthreads, and adds its sum to *total.
extern "C" __global__ void block_sum(const unsigned int* in, unsigned int n,
                                     unsigned long long* total) {
  __shared__ unsigned int part[256];
  unsigned int t = threadIdx.x;
  unsigned int i = blockIdx.x * blockDim.x + t;
  part[t] = i < n ? in[i] : 0;
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s /= 2) {
    if (t < s) part[t] += part[t + s];
    __syncthreads();
  }
  if (t == 0) atomicAdd(total, (unsigned long long)part[0]);
}
SILT_EXPORT_KERNEL(block_sum)

// y[i] += 1 for i < n: counts launches into a buffer (migration tests).
extern "C" __global__ void increment(unsigned int* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += 1;
}
SILT_EXPORT_KERNEL(increment)
