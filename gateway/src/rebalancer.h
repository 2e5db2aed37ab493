// The rebalancer: keeps every node under its high-water marks for CPU and
// memory by moving the pieces of functions that free the most of the scarce
// resource per millisecond of moving them: memory proclets (live migration,
// largest first: bytes per millisecond grow with size), compute proclets (a
// node whose CPU is taken gets no new shares; its running ones finish within
// one share, ~20 ms) and instances (new calls and the function's replicas go
// to nodes with CPU to spare, where they start from the snapshot; nothing is
// interrupted), and GPU proclets (onto a GPU with room from CPU cores, or
// an idle one's GPU to a busy one: GpuDirectory::Rebalance). Woken by every
// load pulse. What it decides is kept as events
// (GET /system/events, `silt events`) and counted in Prometheus.
#ifndef SILT_GATEWAY_REBALANCER_H_
#define SILT_GATEWAY_REBALANCER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "directory.h"
#include "gpu_directory.h"

namespace silt::gateway {

class Metrics;

struct RebalancerOptions {
  bool enabled = true;
  // CPU: a node is over its mark when its use passes cpu_high of its cores
  // and work that is not Silt's (which nothing can move) leaves Silt's pieces
  // less than cpu_low of them; it is back under once that other work leaves
  // Silt more than cpu_high again. Silt's own compute proclets fill free CPU
  // by design, so they alone never make a node hot.
  double cpu_high = 0.9, cpu_low = 0.7;
  // Memory: moves start above memory_high of a node's memory and go on until
  // it is projected under memory_low.
  double memory_high = 0.9, memory_low = 0.8;
  // Pressure must last this long before anything moves (one pulse is noise).
  std::chrono::milliseconds confirm{5};
  // A hot node must stay under its mark this long before work comes back
  // (moving work back and forth costs more than waiting).
  std::chrono::milliseconds cool_after{200};
  size_t events_kept = 1000;
};

enum class MoveKind { kMemory, kCompute, kInstance, kGpu };
enum class MoveReason {
  kCpuHigh,
  kMemoryHigh,
  kGpuRoom,    // a GPU had room for a proclet on CPU cores
  kGpuWanted,  // a busy proclet on CPU cores took an idle one's GPU
};
const char* MoveKindName(MoveKind k);
const char* MoveReasonName(MoveReason r);

struct RebalanceEvent {
  enum class Type {
    kPressure,     // a node went over a mark
    kMove,         // something moved off it
    kEquilibrium,  // every node is under its marks again (or nothing of
                   // Silt's is left to move off the ones that are not)
    kStuck,        // over a mark, and nothing can move (no room, pinned)
    kCool,         // a hot node is back under its CPU mark
  };
  uint64_t seq = 0;
  int64_t unix_nanos = 0;
  Type type = Type::kPressure;
  MoveReason reason = MoveReason::kCpuHigh;
  MoveKind kind = MoveKind::kMemory;  // kMove
  std::string node;                   // the node under pressure
  std::string to;                     // kMove: where it went
  std::string subject;                // kMove: what moved
  double amount = 0;  // kMove: bytes (memory) or pieces (compute, instance)
  // kMove: how long the move took; kEquilibrium: since the pressure was first
  // reported.
  double ms = 0;
  std::string detail;
};
const char* EventTypeName(RebalanceEvent::Type t);

// A node as the rebalancer sees it (from the latest pulse).
struct NodeLoadView {
  std::string name;
  uint32_t cores = 0;
  double cpu_used = 0, cpu_foreign = 0;
  uint64_t memory = 0, memory_used = 0;
  uint32_t tasks = 0, busy = 0;
  bool leaving = false, hot = false;
};

// Instances whose calls and replicas went elsewhere when a node got hot.
struct InstanceMove {
  std::string function;  // ns/name
  uint32_t instances = 0;
  std::string to;
};

class Rebalancer {
 public:
  struct Hooks {
    std::function<std::vector<NodeLoadView>()> nodes;
    // Marks the node hot (no new compute proclets, instances of functions
    // that may move go elsewhere) or cool again; returns what moved.
    std::function<std::vector<InstanceMove>(const std::string& node, bool hot)>
        set_hot;
    // Whether the structure's shards may move (no function that uses it is
    // pinned or opted out).
    std::function<bool(const StructureView&)> may_move;
    // The GPU proclets' moves (unset: none).
    std::function<std::vector<GpuRebalanceStep>()> gpu;
  };
  // `directory` and `metrics` (may be null) outlive the rebalancer.
  static std::unique_ptr<Rebalancer> Start(const RebalancerOptions& options,
                                           Hooks hooks, Directory* directory,
                                           Metrics* metrics);
  ~Rebalancer();

  // A node's load changed: look again (cheap; the work runs on the
  // rebalancer's own thread).
  void Wake();
  // Events after sequence number `after`, oldest first (at most the last
  // events_kept); waits up to `wait` for one when there is none yet.
  std::vector<RebalanceEvent> Events(uint64_t after,
                                     std::chrono::milliseconds wait);

 private:
  struct Impl;
  explicit Rebalancer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_REBALANCER_H_
