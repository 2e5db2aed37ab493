// The wire format of GPU proclet operations, shared by the function SDK
// (silt/gpu.h), the invoker and silt-gpu-host (the sandboxed process that
// holds a GPU proclet's device state). Header-only and dependency-free.
//
// A request from an instance is a state request (silt/state_wire.h) with op
// StateOp::kGpu, kind StateKind::kGpu and the proclet's name, then:
//   u8 GpuOp, the op's arguments.
// Between the invoker and silt-gpu-host the header is gone: a request is the
// u8 GpuOp and its arguments. A reply is a StateCode byte, then the op's
// results, or the error message. Integers little-endian; "str" is a u32
// length and its bytes (wire::Writer / wire::Reader).
#ifndef SILT_GPU_WIRE_H_
#define SILT_GPU_WIRE_H_

#include <cstdint>
#include <string_view>

#include "silt/state_wire.h"

namespace silt::wire {

enum class GpuOp : uint8_t {
  // -> str backend ("cuda" | "host"), str device, u64 memory_limit,
  //    u64 memory_used, u64 launches (completed so far), u64 generation
  //    (bumped by every move and resize), u64 pending_limit (0, or the
  //    allocation it is asked to shrink to: Free buffers down to it), u64
  //    busy_ns (the device ran its launches this long, since its process
  //    began; on a GPU, from a launch to the next point that waits for it),
  //    str moving_to, str moving_to_device, u64 moving_to_limit (a move
  //    under way: the backend, device and allocation it is going to; ""
  //    when none is)
  kInfo = 1,
  // str buffer, u64 bytes -> u64 bytes. Creates the buffer (zeroed) or
  // returns the one of that name; kInvalid when it exists with another size,
  // kTooLarge past the proclet's memory limit.
  kAlloc = 2,
  kFree = 3,   // str buffer -> u8 existed
  kWrite = 4,  // str buffer, u64 offset, str bytes
  kRead = 5,   // str buffer, u64 offset, u64 length -> str bytes
  // str module: loads the function's kernels/<module>.ptx (a GPU backend) or
  // kernels/<module>.host.so (the host backend), built by `silt build` from
  // <module>.cu. Loading a loaded module does nothing.
  kLoad = 6,
  // str module, str kernel, u32 grid x y z, u32 block x y z, u32
  // shared_bytes, u32 n, n x arg -> u64 launch number. An arg is u8
  // ArgKind, then kValue: str bytes | kBuffer, kBufferIn: str buffer, u64
  // offset.
  // Launches run in order; a later Read or Synchronize sees their effects.
  kLaunch = 7,
  kSynchronize = 8,  // -> u64 launches completed
  // u64 generation, then a request (not kSince): runs it if the proclet's
  // generation is still that one, else answers StateCode::kReconfigured with
  // its kInfo reply (the SDK's reconfiguration callback, silt/gpu.h).
  kSince = 9,
  kList = 10,  // -> u32 n, n x (str buffer, u64 bytes), by name
  // The invoker's own (refused from instances). A proclet's state moves as
  // a GpuState (below), in parts:
  // [u8 delta] -> GpuState: the whole state (delta absent or 0), or what
  // changed since the last kPrecopy (delta 1); nothing launched after it
  // until kInject or kResume (a failed move).
  kExtract = 20,
  kInject = 21,  // GpuState: applied onto what is held (a fresh proclet)
  kResume = 22,  // after a kExtract whose move failed
  // str module, str ptx, str host_library: loads a module from its bytes
  // (the instance's node read them from the function's bundle after a
  // kLoad answered kNotFound: the holder has none of the function's files).
  kLoadImage = 23,
  // u8 restart, u64 max_bytes -> u8 pass_done, GpuState: the next part (at
  // most about max_bytes) of the buffers written since they were last
  // copied, the proclet running on (a move's pre-copy: only what is written
  // again reaches kExtract's delta, the pause). `restart`: every buffer
  // counts as written. pass_done: every buffer was visited since the pass
  // began; the next call begins another.
  kPrecopy = 24,
  // u64 limit -> kInfo's reply: its allocation becomes `limit` bytes, at
  // once if it holds no more than that, else once Frees bring it down
  // (pending_limit meanwhile; new Allocs count against it); a limit it holds
  // less than cancels a pending one. Bumps the generation either way.
  kSetLimit = 25,
  // str backend, str device, u64 memory_limit: a move there has begun (the
  // reconfiguration callbacks hear of it before it ends, from kInfo's
  // moving_to fields); an empty backend: it was called off (as kResume
  // does). Bumps the generation.
  kMoving = 26,
};

// A GpuState: u32 magic kGpuStateMagic, then records to its end:
//   'B' str buffer, u64 bytes (its size), u64 offset, u64 n, n raw bytes
//       (part of its contents; created, or re-created at that size)
//   'M' str module, str ptx, str host_library (loaded unless it is)
//   'D' str buffer (freed at the source since the move began: it goes)
//   'E' u64 launches, u64 generation, u32 n, n x str buffer (every buffer it
//       holds: others go), closing a whole state or a kExtract delta; the
//       target's generation is the next one.
// A kernel writes only the buffers passed to it (device addresses stored in
// buffers do not survive a move to another device anyway), so a launch marks
// its buffer arguments written.
inline constexpr uint32_t kGpuStateMagic = 0x32504753;  // "SGP2"

// kBufferIn: a buffer the kernel only reads (a move's pre-copy need not copy
// it again after the launch; a kernel that writes one anyway may lose those
// writes when its proclet moves).
enum class ArgKind : uint8_t { kValue = 1, kBuffer = 2, kBufferIn = 3 };

// Most arguments of one launch.
inline constexpr uint32_t kMaxLaunchArgs = 64;
// Largest Write or Read of one request (the SDK splits larger ones).
inline constexpr uint64_t kGpuChunkBytes = 16u << 20;

inline bool IsInvokerOnly(GpuOp op) {
  return op == GpuOp::kExtract || op == GpuOp::kInject ||
         op == GpuOp::kResume || op == GpuOp::kPrecopy ||
         op == GpuOp::kSetLimit || op == GpuOp::kLoadImage ||
         op == GpuOp::kMoving;
}

// Kernel names: C identifiers (PTX entry names), 1-255 characters.
inline bool ValidKernelName(std::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

}  // namespace silt::wire

#endif  // SILT_GPU_WIRE_H_
