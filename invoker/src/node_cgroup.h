// The node's capacity as a cgroup: the parent of every instance cgroup of this
// invoker (silt/<node id>/<instance>) carries the CPU quota and memory limit
// given with --cpus and --memory, so that the instances together stay within
// what the node offers, whatever their own (per-function) limits, which apply
// below it. Uses the same hierarchies as the instances' cgroups (sandbox.h):
// cgroup v2 when /sys/fs/cgroup is the unified hierarchy, else the v1 memory,
// cpu and pids hierarchies.
#ifndef SILT_INVOKER_NODE_CGROUP_H_
#define SILT_INVOKER_NODE_CGROUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace silt::invoker {

// Owned by the invoker for its lifetime; not thread-safe (set up once).
class NodeCgroup {
 public:
  // Creates cgroup `name` (relative to this process's own cgroup, e.g.
  // "silt/<node id>") and sets its limits: `memory_bytes` of memory (swap
  // included where v1 accounts it) and `cpu_millis` thousandths of a CPU per
  // 100 ms period; 0 leaves that resource unlimited (and resets a limit left
  // by an earlier run). On v2 also enables the cpu, memory and pids
  // controllers for its children. PermissionDenied: the cgroup cannot be
  // created; Internal: a limit cannot be written (the error names the file).
  static absl::StatusOr<std::unique_ptr<NodeCgroup>> Create(
      const std::string& name, uint64_t memory_bytes, uint64_t cpu_millis);
  ~NodeCgroup();  // removes the cgroup where it is empty by then

  NodeCgroup(const NodeCgroup&) = delete;
  NodeCgroup& operator=(const NodeCgroup&) = delete;

  // Where the limits are written (one directory on v2).
  const std::string& memory_dir() const { return memory_dir_; }
  const std::string& cpu_dir() const { return cpu_dir_; }
  // CPU time the instances have used together so far (0 where the kernel
  // does not count it: v1 without a cpuacct hierarchy).
  uint64_t CpuUsageNanos() const;
  // The part of it the instances' own cgroups used (the rest ran in the node
  // cgroup itself: not Silt's, e.g. a process an operator put there).
  uint64_t InstancesCpuNanos() const;
  // Memory the instances use together now (page cache included, as the
  // limit counts it).
  uint64_t MemoryUsageBytes() const;

 private:
  NodeCgroup() = default;
  std::vector<std::string> dirs_;  // every hierarchy's directory
  std::string memory_dir_, cpu_dir_;
  std::string cpuacct_dir_;                   // v1
  mutable int cpu_fd_ = -1, memory_fd_ = -1;  // kept open between reads
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_NODE_CGROUP_H_
