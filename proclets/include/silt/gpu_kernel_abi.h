/* The C ABI between a kernel module's host build (silt/gpu_kernel.h's
 * SILT_EXPORT_KERNEL) and the host backend that loads it: each kernel K is
 * exported as silt_kernel_K, which runs blocks [block_begin, block_end) of a
 * launch (linear block indices, x fastest) with args[i] pointing to the i-th
 * parameter's value, and returns 0, or -1 when it could not map a fiber
 * stack. */
#ifndef SILT_GPU_KERNEL_ABI_H_
#define SILT_GPU_KERNEL_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct silt_kernel_launch {
  unsigned int grid[3];
  unsigned int block[3];
  uint64_t block_begin, block_end;
} silt_kernel_launch;

typedef int (*silt_kernel_launch_fn)(const silt_kernel_launch* launch,
                                     void** args);

#ifdef __cplusplus
}
inline constexpr char kSiltKernelPrefix[] = "silt_kernel_";
#endif

#endif /* SILT_GPU_KERNEL_ABI_H_ */
