// The GPU proclets of this node, both ends:
//  - hosted here: one sandboxed silt-gpu-host process per (namespace,
//    function, proclet name), started on its first request, each with its
//    own lock so one function's launches never wait on another's; it holds
//    the proclet's device state (the node's GPU, or its CPU cores);
//  - used from here: an instance's GPU requests (silt/gpu_wire.h, on its
//    state connection) go to wherever the gateway's GPU directory placed the
//    proclet: served here without a hop, or sent to the holder's data port
//    (PeerOp::kGpu). A proclet that moved answers kMoved with its new
//    address; the request follows it, so callers see a pause.
// Modules travel with requests: the instance's node reads the kernels from
// the function's bundle the first time a proclet lacks them (kLoadImage), so
// a holder needs nothing of the function's but what it is sent.
#ifndef SILT_INVOKER_GPU_PROCLETS_H_
#define SILT_INVOKER_GPU_PROCLETS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "peer_wire.h"

namespace silt::invoker {

struct GpuProcletsOptions {
  std::string data_dir;       // proclets' own dirs go under DATA_DIR/gpu
  std::string root_dir;       // the sandbox root skeleton
  std::string dev_dir;        // device nodes bound as /dev
  std::string worker_dir;     // holds silt-gpu-host
  std::string cgroup_prefix;  // e.g. "silt/node-a"
  // Where proclets placed here run: "auto" (the node's GPU where it has
  // one, else its CPU cores), "cuda" or "host".
  std::string backend = "auto";
  // This node's data port, and the first frame of a connection to a peer's.
  std::function<std::string()> data_address;
  std::function<std::string()> hello;
  // The function as this node runs it: its unpacked bundle (the kernels)
  // and the device memory each of its proclets may hold at most (0: the
  // device's), at least, and prefers (its labels; 0: unset). NotFound when
  // the node does not run it.
  struct FunctionInfo {
    std::string bundle_dir;
    uint64_t memory_limit = 0, min_memory = 0, preferred_memory = 0;
    uint32_t compute_capability = 0;  // the least its GPU has (75: 7.5)
  };
  std::function<absl::StatusOr<FunctionInfo>(const std::string& ns,
                                             const std::string& function)>
      function;
  // The data port of the node holding the proclet and its allocation there
  // (the gateway's GPU directory; it places the proclet when it is nowhere).
  struct Location {
    std::string data_address;
    uint64_t memory_limit = 0;
    std::string backend;  // "cuda", "host" ("": the node's choice)
  };
  std::function<absl::StatusOr<Location>(
      const std::string& ns, const std::string& function,
      const std::string& name, const FunctionInfo& needs)>
      locate;
};

struct GpuProcletInfo {
  std::string ns, function, name;
  std::string backend, device;
  uint64_t memory_limit = 0, memory_used = 0, launches = 0;
  uint64_t generation = 0, pending_limit = 0;
  uint64_t busy_ns = 0;  // its device ran its launches this long
};

struct GpuMoveResult {
  std::string from_backend, to_backend, to_device;
  uint64_t bytes = 0;          // its buffers
  uint64_t precopy_bytes = 0;  // copied while it ran on
  uint64_t paused_bytes = 0;   // copied in the pause
  double precopy_ms = 0;
  double pause_ms = 0, extract_ms = 0, inject_ms = 0;
};

class GpuProclets {
 public:
  explicit GpuProclets(GpuProcletsOptions options);
  ~GpuProclets();  // ends every hosted proclet's process

  // An instance's state request with op kGpu (header included); the reply
  // (StateCode, results).
  std::string Serve(const std::string& ns, const std::string& function,
                    std::string_view request);
  // A peer's PeerOp::kGpu frame (after the op byte): served by the proclet
  // held here (started if it is not), or kMoved with where it went.
  std::string ServePeer(wire::Reader& frame);
  // A peer's PeerOp::kGpuAdopt (after the op byte) and the rest of that
  // conversation; its last reply (empty: drop the connection).
  std::string AdoptPeer(wire::Reader& frame, PeerStream& stream);
  // Moves a proclet held here to `target_data_address` (this node's own:
  // onto another backend here) on `backend` ("" = the target's choice): its
  // buffers are copied while it runs on (pre-copy), then, in the pause, what
  // was written since. NotFound when not held here; FailedPrecondition when
  // it is being moved already.
  absl::StatusOr<GpuMoveResult> Migrate(const std::string& ns,
                                        const std::string& function,
                                        const std::string& name,
                                        const std::string& target_data_address,
                                        const std::string& backend);

  // Sets the allocation of a proclet held here to `limit` bytes; one that
  // holds more is asked to shrink (its function's reconfiguration callbacks
  // see pending_limit) and given `wait` to Free down to it, else the resize
  // is called off (FailedPrecondition). NotFound when not held here.
  absl::StatusOr<GpuProcletInfo> Resize(const std::string& ns,
                                        const std::string& function,
                                        const std::string& name, uint64_t limit,
                                        absl::Duration wait);

  // The proclets held here (for load reports); one busy launching is
  // reported as last seen.
  std::vector<GpuProcletInfo> List();
  // Ends the proclets held here of a deleted function (`function` "": of a
  // deleted namespace); their state goes.
  void DropFunction(const std::string& ns, const std::string& function);

 private:
  struct Proclet;
  struct MoveTarget;
  using Clock = std::chrono::steady_clock;
  // The proclet held here, started when absent (on `backend`, "" = the
  // node's). Its address instead when it moved away.
  struct Held {
    std::shared_ptr<Proclet> proclet;
    std::string moved_to;
  };
  absl::StatusOr<Held> Hold(const std::string& ns, const std::string& function,
                            const std::string& name, uint64_t memory_limit,
                            bool create, const std::string& backend = "");
  // The proclet held here, for a move or a resize: its `moving` set (the
  // caller clears it). NotFound when not here; FailedPrecondition when
  // another change holds it.
  absl::StatusOr<std::shared_ptr<Proclet>> HoldForChange(
      const std::string& ns, const std::string& function,
      const std::string& name);
  absl::StatusOr<std::shared_ptr<Proclet>> Start(const std::string& ns,
                                                 const std::string& function,
                                                 const std::string& name,
                                                 uint64_t memory_limit,
                                                 const std::string& backend);
  // One request (GpuOp and arguments) to the proclet wherever it is.
  std::string Route(const std::string& ns, const std::string& function,
                    const std::string& name,
                    const GpuProcletsOptions::FunctionInfo& fn,
                    std::string_view op_request);
  std::string Remote(const std::string& address, const std::string& frame);
  // `placed`: the directory placed it here just now (start it if absent);
  // else absent answers kMoved to nowhere (ask the directory).
  std::string ServeHere(const std::string& ns, const std::string& function,
                        const std::string& name, uint64_t memory_limit,
                        bool placed, const std::string& backend,
                        std::string_view op_request);

  // A move's three steps: the target started, a part of the state sent to
  // it, the pause's delta sent and the target serving (`m` gets its side).
  absl::Status BeginMove(const Proclet& p, const std::string& target,
                         const std::string& backend, MoveTarget* to);
  absl::Status SendPart(MoveTarget& to, GpuAdoptStep step,
                        std::string_view state);
  // Waits until the target has applied every part sent.
  absl::Status FlushMove(MoveTarget& to);
  absl::Status CommitMove(MoveTarget& to, std::string_view delta,
                          GpuMoveResult* m);

  GpuProcletsOptions options_;
  PeerPool peers_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Proclet>> proclets_
      ABSL_GUARDED_BY(mu_);  // held here, by key
  // Proclets that moved away: where to, and since when.
  std::map<std::string, std::pair<std::string, Clock::time_point>> moved_
      ABSL_GUARDED_BY(mu_);
  // Where proclets used from here are (their holders' data ports).
  std::map<std::string, std::string> where_ ABSL_GUARDED_BY(mu_);
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_GPU_PROCLETS_H_
