// One GPU proclet hosted by this node, GpuProclets::Proclet: its sandboxed
// silt-gpu-host process and the channel to it (gpu/channel.h framing), and
// what the files of GpuProclets share (gpu_proclets.cc: hosting and routing;
// gpu_proclet_moves.cc: moves). Private to the invoker.
#ifndef SILT_INVOKER_GPU_PROCLET_H_
#define SILT_INVOKER_GPU_PROCLET_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "gpu_proclets.h"
#include "sandbox.h"
#include "silt/gpu_wire.h"

namespace silt::invoker {
namespace gpu_internal {

// A move's pre-copy: bytes per part (what a call may wait behind, once), and
// passes over what was written meanwhile before the pause.
inline constexpr uint64_t kPrecopyPartBytes = 8u << 20;
inline constexpr int kPrecopyPasses = 3;

inline absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }
// A reply of `code` (then `message`), as the proclet's process answers.
std::string Reply(wire::StateCode code, std::string_view message = {});
// kMoved to `address` ("": ask the directory).
std::string MovedReply(const std::string& address);
wire::StateCode CodeOf(std::string_view reply);
std::string ProcletKey(std::string_view ns, std::string_view function,
                       std::string_view name);
// A kInfo (or kSetLimit) reply; false for an error or a malformed one.
bool ParseInfo(std::string_view reply, GpuProcletInfo* i);
// A kPrecopy request for the next part.
std::string PrecopyRequest(bool restart);
// A kMoving request: a move to `backend` has begun ("": it was called off).
std::string MovingRequest(std::string_view backend, std::string_view device,
                          uint64_t memory_limit);
double MsSince(std::chrono::steady_clock::time_point t);

// Clears a flag when it goes out of scope (a proclet's `moving`).
struct ClearOnExit {
  std::atomic<bool>& flag;
  ~ClearOnExit() { flag = false; }
};

}  // namespace gpu_internal

// One proclet held here: its process. `mu` serialises its requests (a
// launch is queued in order behind the ones before it) and a move.
struct GpuProclets::Proclet {
  std::string ns, function, name;
  std::string dir;  // DATA_DIR/gpu/<id>: its /tmp and (empty) bundle dir
  std::atomic<uint64_t> memory_limit{0};  // its allocation
  absl::Mutex mu;
  std::unique_ptr<SandboxedProcess> proc ABSL_GUARDED_BY(mu);
  int channel ABSL_GUARDED_BY(mu) = -1;
  // Its process ended (set under mu; read without it: never take mu under
  // GpuProclets::mu_, a move holds mu while it takes mu_).
  std::atomic<bool> lost{false};
  // ... and a request of its function was answered so (kLost): the next
  // one gets a fresh proclet.
  std::atomic<bool> lost_told{false};
  std::string moved_to ABSL_GUARDED_BY(mu);      // it moved there
  std::atomic<bool> moving{false};               // a move is under way
  absl::Mutex info_mu;                           // after mu
  GpuProcletInfo last ABSL_GUARDED_BY(info_mu);  // as last asked

  ~Proclet();  // ends its process; removes its dir
  void EndLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::string Exchange(std::string_view request, std::string_view more = {});
  // One request (`request` then `more`, unjoined) and its reply; kMoved once
  // it moved, kLost once its process ended.
  std::string ExchangeLocked(std::string_view request,
                             std::string_view more = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What it holds: asked now (kInfo), or as last asked while a request or a
  // move holds it (a report never waits for a kernel).
  GpuProcletInfo Info();
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_GPU_PROCLET_H_
