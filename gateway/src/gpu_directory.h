// Where the functions' GPU proclets are. A proclet is placed on its first
// use: on a node whose GPU has its preferred allocation free (the most free
// first), independently of where the function's instances run; else,
// downgraded, on the GPU with the most free if that is at least its
// minimum; else on the CPU cores (the host backend) of the node that asked.
// Nodes report what they hold, so the directory is rebuilt from them after a
// gateway restart and forgets what a lost node held. Moves go through here
// (Migrate): the source node hands the proclet over to the target's data
// port, then the directory points at the target.
//
// The GPUs follow the work (Rebalance, on the rebalancer's thread): a
// proclet placed on CPU cores for want of room moves onto a GPU once one has
// room for it, and an idle proclet gives its GPU up (to its node's CPU
// cores) to a busy one that has none. What an operator decided stays: a
// proclet an operator moved (silt proclets migrate) is pinned where it was
// put, and a reclaimed GPU (silt gpu reclaim) takes no proclets until it is
// released (silt gpu release). Both are kept in the gateway's store.
//
// Thread safety: thread-safe (one lock, never held across an RPC).
#ifndef SILT_GATEWAY_GPU_DIRECTORY_H_
#define SILT_GATEWAY_GPU_DIRECTORY_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class Channel;
}
namespace silt::store {
class Store;
}

namespace silt::gateway {

struct GpuNode {
  std::string name, data_address;
  uint32_t gpus = 0;
  uint64_t gpu_memory = 0;  // the GPU's, in all
  std::string gpu_model;
  std::shared_ptr<grpc::Channel> channel;  // its ProcletHost service
  bool leaving = false;
  uint32_t gpu_compute = 0;  // compute capability: 75 for 7.5 (0: unknown)
};

// A function's GPU labels (0: unset): memory in bytes, com.silt.gpu.min-memory
// (the least its proclets can be downgraded to), .preferred-memory (what
// placement reserves; default max) and .max-memory (the most an allocation
// may be; default the device's); com.silt.gpu.compute-capability ("8.0": the
// least a GPU it runs on has, as 80; other GPUs are not used for it).
struct GpuNeeds {
  uint64_t min = 0, preferred = 0, max = 0;
  uint32_t compute = 0;
  uint64_t wanted() const { return preferred > 0 ? preferred : max; }
  bool Fits(const GpuNode& n) const {
    return n.gpus > 0 && (compute == 0 || n.gpu_compute >= compute);
  }
};
// InvalidArgument, saying which label and why, for a bad quantity or
// capability, or min > preferred > max.
absl::StatusOr<GpuNeeds> ParseGpuLabels(
    const std::map<std::string, std::string>& labels);

struct GpuProcletView {
  std::string id;  // "g<n>": silt proclets list / migrate
  std::string ns, function, name, node;
  // As the node last reported (empty until then).
  std::string backend, device;
  uint64_t memory_used = 0, memory_limit = 0, launches = 0;
  uint64_t busy_ns = 0;    // its device ran its launches this long
  double utilization = 0;  // of its device, between its last two reports
  uint64_t moves = 0;
  double last_pause_ms = 0;
};

struct GpuMove {
  std::string id, from, to, from_backend, to_backend, to_device;
  uint64_t bytes = 0, precopy_bytes = 0, paused_bytes = 0;
  double precopy_ms = 0, pause_ms = 0, extract_ms = 0, inject_ms = 0;
  double total_ms = 0;
};

// Why Rebalance moved a proclet.
enum class GpuMoveWhy {
  kRoom,    // off CPU cores: a GPU has room for it
  kWanted,  // off its GPU, idle, for a busy proclet on CPU cores
};

// One move Rebalance made or tried (`move` holds what failed).
struct GpuRebalanceStep {
  GpuMoveWhy why = GpuMoveWhy::kRoom;
  absl::StatusOr<GpuMove> move;
  std::string subject;  // "g3 (ns/function/name)"
  std::string detail;   // why, in words
};

struct GpuRebalanceOptions {
  // A proclet the directory moved or placed stays put this long (moving
  // back and forth costs more than waiting).
  absl::Duration settle = absl::Seconds(10);
  // Busy: its device ran its launches at least this share of the time
  // between its node's last two reports; idle: at most this share.
  double busy = 0.25, idle = 0.02;
};

class GpuDirectory {
 public:
  using NodeSource = std::function<std::vector<GpuNode>()>;
  // Sets a proclet's allocation on the node holding it: its new allocation
  // and use. Unset: the node's ProcletHost service (tests wrap that seam).
  using Resizer = std::function<absl::StatusOr<std::pair<uint64_t, uint64_t>>(
      const GpuNode& holder, const GpuProcletView& proclet, uint64_t bytes,
      absl::Duration wait)>;
  // Moves a proclet from `source` to `target`'s `backend`. Unset: the
  // source node's ProcletHost service.
  using Mover = std::function<absl::StatusOr<GpuMove>(
      const GpuNode& source, const GpuNode& target,
      const GpuProcletView& proclet, const std::string& backend)>;
  struct NodeCalls {
    Resizer resize;
    Mover move;
  };
  // Pins and reclaimed GPUs are kept in `store` (null: only in memory).
  explicit GpuDirectory(NodeSource nodes, store::Store* store = nullptr,
                        NodeCalls calls = {},
                        GpuRebalanceOptions rebalance = {});

  // Where the proclet is; placed now when it is nowhere (or its node is
  // gone). Unavailable when no node is connected. Its memory_limit is the
  // allocation it got. Where no GPU has its minimum free, proclets placed
  // before that declared a minimum are downgraded toward it (resized, never
  // below what they hold) to make room on one, rather than this one going
  // to CPU cores.
  absl::StatusOr<GpuProcletView> Open(const std::string& ns,
                                      const std::string& function,
                                      const std::string& name,
                                      const GpuNeeds& needs,
                                      const std::string& asking_node);
  // What `node` holds now (its load report).
  void Report(const std::string& node, std::vector<GpuProcletView> held);
  void NodeGone(const std::string& node);
  // Those of namespace `ns` ("" = all).
  std::vector<GpuProcletView> List(const std::string& ns);
  // An operator's move: proclet `id` to `node`, onto `backend` ("cuda",
  // "host"; "": the node's GPU if it has one), pinned there (Rebalance
  // leaves it). NotFound: no such proclet or node; InvalidArgument: already
  // there on that backend, or a bad backend; FailedPrecondition: the target
  // has no GPU for "cuda" (or it is reclaimed), or is leaving.
  absl::StatusOr<GpuMove> Migrate(const std::string& id,
                                  const std::string& node,
                                  const std::string& backend);
  // Sets proclet `id`'s allocation to `bytes` (the caller checked them
  // against the function's labels). One holding more is asked to shrink,
  // and has `wait` to Free (FailedPrecondition if it does not, or if its GPU
  // lacks the room besides its other proclets); NotFound: no such proclet;
  // Unavailable: its node is not connected.
  absl::StatusOr<GpuProcletView> Resize(const std::string& id, uint64_t bytes,
                                        absl::Duration wait);
  // A deleted function's (`function` "": a deleted namespace's) proclets:
  // forgotten, and ended on their nodes.
  void DropFunction(const std::string& ns, const std::string& function);
  // Takes `node`'s GPU out of use until Release: every proclet on it moves
  // off, each to another node's GPU with the memory free, else onto
  // `node`'s CPU cores (the host backend). The moves made; the first error
  // stops them (the GPU stays reclaimed). NotFound: no such node.
  absl::StatusOr<std::vector<GpuMove>> Reclaim(const std::string& node);
  // Gives a reclaimed GPU back to placement and Rebalance. NotFound: `node`
  // is not reclaimed.
  absl::Status Release(const std::string& node);
  bool Reclaimed(const std::string& node);
  // The moves that put the GPUs where the work is (see the top of this
  // file); at most a few per call, each planned on what the nodes last
  // reported.
  std::vector<GpuRebalanceStep> Rebalance();
  std::vector<GpuNode> Nodes() const { return nodes_(); }
  // Whether `id` names a GPU proclet (not a memory proclet's number).
  static bool IsGpuId(const std::string& id);

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    GpuProcletView view;
    // As its function's instances last asked for it (unknown after a
    // gateway restart until one does: Rebalance leaves it alone till then).
    GpuNeeds needs;
    bool needs_known = false;
    bool moving = false;
    // Its node has reported it: once it is missing from a report, it is
    // gone (its function left the node). Until then it was only placed.
    bool reported = false;
    Clock::time_point reported_at;
    // Reports of it from where it is now: its utilisation is measured from
    // the second on.
    int reports_here = 0;
    Clock::time_point placed_at = Clock::now();  // or last moved
  };
  enum class MoveCause { kOperator, kReclaim, kRebalance };
  absl::StatusOr<GpuMove> Move(const std::string& id, const std::string& node,
                               const std::string& backend, MoveCause cause);
  absl::StatusOr<GpuMove> MoveOnNode(const GpuNode& source,
                                     const GpuNode& target,
                                     const GpuProcletView& proclet,
                                     const std::string& backend);
  // Whether `n`'s GPU may take `needs`' proclets now.
  bool GpuUsableLocked(const GpuNode& n, const GpuNeeds& needs) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next Rebalance step: the proclets to move in order, each to (node,
  // backend); empty when nothing should move.
  struct PlannedMove {
    std::string id, node, backend;
    GpuMoveWhy why;
    std::string subject, detail;
  };
  std::vector<PlannedMove> RebalancePlanLocked(
      const std::vector<GpuNode>& nodes, Clock::time_point now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps (or forgets) `prefix`+`name` in the store.
  absl::Status Keep(absl::string_view prefix, const std::string& name,
                    bool kept);
  void PersistPin(const std::string& key, bool pinned);
  static std::string KeyOf(const std::string& ns, const std::string& function,
                           const std::string& name);
  std::string NewIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What each node's GPU has promised its proclets.
  std::map<std::string, uint64_t> PromisedLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Placement {
    const GpuNode* node = nullptr;  // null: no node at all
    uint64_t allocation = 0;
    bool on_gpu = false;  // else on the node's CPU cores
  };
  Placement PlaceLocked(const std::vector<GpuNode>& nodes,
                        const GpuNeeds& needs,
                        const std::string& asking_node) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The resizes (id, new allocation) that would make room for `needs` on one
  // GPU; empty when none would.
  std::vector<std::pair<std::string, uint64_t>> RoomPlanLocked(
      const std::vector<GpuNode>& nodes, const GpuNeeds& needs) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static absl::StatusOr<std::pair<uint64_t, uint64_t>> ResizeOnNode(
      const GpuNode& holder, const GpuProcletView& view, uint64_t bytes,
      absl::Duration wait);
  // Proclet `id`, not moving: NotFound, or FailedPrecondition (moving).
  absl::StatusOr<Entry*> StillByIdLocked(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NodeSource nodes_;
  store::Store* const store_;
  const NodeCalls calls_;
  const GpuRebalanceOptions rebalance_;
  absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by key
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Kept in the store: pinned proclets' keys (applied to their entries as
  // nodes report them) and reclaimed GPUs' nodes.
  std::set<std::string> pinned_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> reclaimed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_GPU_DIRECTORY_H_
