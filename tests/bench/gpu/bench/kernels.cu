// bench_gpu's kernel: saxpy (the example's), built like any function's.
#include <silt/gpu_kernel.h>

extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
SILT_EXPORT_KERNEL(saxpy)
