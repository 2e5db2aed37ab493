// Kernels that run on a GPU and on CPU cores: write them once in CUDA C++
// against this header, export each with SILT_EXPORT_KERNEL:
//
//   #include <silt/gpu_kernel.h>
//   extern "C" __global__ void saxpy(float a, const float* x, float* y,
//                                    int n) {
//     int i = blockIdx.x * blockDim.x + threadIdx.x;
//     if (i < n) y[i] = a * x[i] + y[i];
//   }
//   SILT_EXPORT_KERNEL(saxpy)
//
// `silt build` compiles <module>.cu twice: with nvcc to PTX (this header then
// adds nothing: CUDA's own builtins serve) and with the host C++ compiler to
// a shared library, where this header supplies threadIdx, blockIdx,
// blockDim, gridDim, __syncthreads, static __shared__ memory and the common
// atomics, and SILT_EXPORT_KERNEL a launcher the host backend calls.
//
// On the host backend the blocks of a launch run in parallel on the node's
// cores and the threads of a block one after another, each switching out at
// __syncthreads (a fiber per waiting thread), so kernels that synchronise
// within a block work unchanged. Not supported there: dynamic (extern)
// shared memory, warp intrinsics (__shfl*, __ballot*), textures, device-side
// printf and launches; kernels must be extern "C" (their PTX names) and must
// not keep device pointers in device memory (a GPU proclet's buffers move).
#ifndef SILT_GPU_KERNEL_H_
#define SILT_GPU_KERNEL_H_

#ifdef __CUDACC__

#define SILT_EXPORT_KERNEL(name)

#else  // the host backend

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "silt/gpu_kernel_abi.h"

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};
using uint3 = dim3;

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __restrict__ __restrict

namespace silt::kernel_host {

// One block's threads as fibers: each fiber runs threads one after another
// until one of them waits at __syncthreads; the scheduler then starts the
// next threads on a new fiber, and once every thread has started, releases
// the waiting ones in order, round after round.
struct Fiber {
  ucontext_t context;
  void* stack = nullptr;
  unsigned int thread = 0;  // the thread it runs now (linear)
  bool done = false, waiting = false;
};

inline constexpr size_t kStackBytes = 256 << 10;

struct Block {
  ucontext_t scheduler;
  Fiber* current = nullptr;
  unsigned int next = 0, threads = 0;
  void (*body)(void*) = nullptr;
  void* argument = nullptr;
};

inline thread_local Block* tls_block = nullptr;
// Fibers kept for the next block on this thread (their stacks are mapped
// once), given back when the thread ends.
struct FiberPool {
  std::vector<Fiber*> fibers;
  ~FiberPool() {
    for (Fiber* f : fibers) {
      munmap(f->stack, kStackBytes);
      delete f;
    }
  }
};
inline thread_local FiberPool tls_pool;

inline void SetThread(unsigned int t) {
  threadIdx.x = t % blockDim.x;
  threadIdx.y = (t / blockDim.x) % blockDim.y;
  threadIdx.z = t / (blockDim.x * blockDim.y);
}

inline void FiberMain() {
  Block* b = tls_block;
  Fiber* f = b->current;
  while (b->next < b->threads) {
    f->thread = b->next++;
    SetThread(f->thread);
    b->body(b->argument);
  }
  f->done = true;
  swapcontext(&f->context, &b->scheduler);
}

inline void Resume(Block* b, Fiber* f) {
  b->current = f;
  SetThread(f->thread);
  swapcontext(&b->scheduler, &f->context);
}

// Runs body(argument) once per thread of the current block; false when a
// fiber's stack cannot be mapped.
inline bool RunBlock(unsigned int threads, void (*body)(void*),
                     void* argument) {
  std::vector<Fiber*>& pool = tls_pool.fibers;
  Block b;
  b.threads = threads;
  b.body = body;
  b.argument = argument;
  tls_block = &b;
  std::vector<Fiber*> used;
  size_t free_at = 0;
  while (b.next < b.threads) {
    if (free_at == pool.size()) {
      auto* f = new Fiber();
      f->stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (f->stack == MAP_FAILED) {
        delete f;
        tls_block = nullptr;
        return false;
      }
      pool.push_back(f);
    }
    Fiber* f = pool[free_at++];
    getcontext(&f->context);
    f->context.uc_stack.ss_sp = f->stack;
    f->context.uc_stack.ss_size = kStackBytes;
    f->context.uc_link = nullptr;
    makecontext(&f->context, FiberMain, 0);
    f->done = f->waiting = false;
    used.push_back(f);
    b.current = f;
    swapcontext(&b.scheduler, &f->context);
  }
  for (;;) {  // barrier rounds
    std::vector<Fiber*> waiting;
    for (Fiber* f : used)
      if (f->waiting) waiting.push_back(f);
    if (waiting.empty()) break;
    for (Fiber* f : waiting) {
      f->waiting = false;
      Resume(&b, f);
    }
  }
  tls_block = nullptr;
  return true;
}

template <typename T>
T& ArgAt(void** args, size_t i) {
  return *static_cast<std::remove_cv_t<std::remove_reference_t<T> >*>(args[i]);
}

template <typename... P>
struct Launcher {
  void (*kernel)(P...);
  void** args;
  template <size_t... I>
  void Call(std::index_sequence<I...>) {
    kernel(ArgAt<P>(args, I)...);
  }
  static void Thread(void* self) {
    auto* l = static_cast<Launcher*>(self);
    l->Call(std::index_sequence_for<P...>{});
  }
};

template <typename... P>
int Launch(void (*kernel)(P...), const silt_kernel_launch* l, void** args) {
  Launcher<P...> launcher{kernel, args};
  gridDim = {l->grid[0], l->grid[1], l->grid[2]};
  blockDim = {l->block[0], l->block[1], l->block[2]};
  const unsigned int threads = l->block[0] * l->block[1] * l->block[2];
  for (uint64_t i = l->block_begin; i < l->block_end; ++i) {
    blockIdx.x = static_cast<unsigned int>(i % l->grid[0]);
    blockIdx.y = static_cast<unsigned int>((i / l->grid[0]) % l->grid[1]);
    blockIdx.z =
        static_cast<unsigned int>(i / (uint64_t{l->grid[0]} * l->grid[1]));
    if (!RunBlock(threads, &Launcher<P...>::Thread, &launcher)) return -1;
  }
  return 0;
}

}  // namespace silt::kernel_host

// Waits until every thread of the block has reached it.
inline void __syncthreads() {
  silt::kernel_host::Block* b = silt::kernel_host::tls_block;
  silt::kernel_host::Fiber* f = b->current;
  f->waiting = true;
  swapcontext(&f->context, &b->scheduler);
  silt::kernel_host::SetThread(f->thread);
}

// Atomics: blocks run on several cores at once.
template <typename T>
inline T silt_atomic_add(T* p, T v) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  } else {
    T old, next;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
      next = old + v;
    } while (!__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
    return old;
  }
}
inline int atomicAdd(int* p, int v) { return silt_atomic_add(p, v); }
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  return silt_atomic_add(p, v);
}
inline unsigned long long atomicAdd(unsigned long long* p,
                                    unsigned long long v) {
  return silt_atomic_add(p, v);
}
inline float atomicAdd(float* p, float v) { return silt_atomic_add(p, v); }
inline double atomicAdd(double* p, double v) { return silt_atomic_add(p, v); }
inline int atomicSub(int* p, int v) {
  return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED);
}
inline unsigned int atomicSub(unsigned int* p, unsigned int v) {
  return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED);
}
inline int atomicExch(int* p, int v) {
  return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
inline unsigned int atomicExch(unsigned int* p, unsigned int v) {
  return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
inline int atomicCAS(int* p, int expected, int desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
  return expected;
}
inline unsigned int atomicCAS(unsigned int* p, unsigned int expected,
                              unsigned int desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
  return expected;
}
inline int atomicMax(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
  return old;
}
inline int atomicMin(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old > v &&
         !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
  return old;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#define SILT_EXPORT_KERNEL(name)                                            \
  extern "C" __attribute__((visibility("default"))) int silt_kernel_##name( \
      const silt_kernel_launch* l, void** args) {                           \
    return ::silt::kernel_host::Launch(&name, l, args);                     \
  }

#endif  // __CUDACC__

#endif  // SILT_GPU_KERNEL_H_
