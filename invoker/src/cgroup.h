// The cgroups of the node's instances: one per instance (its memory, CPU and
// pids limits) below the node's own (node_cgroup.h), in the v1 memory, cpu,
// cpuacct and pids hierarchies or in the v2 unified one, named relative to
// the invoker's own cgroup.
#ifndef SILT_INVOKER_CGROUP_H_
#define SILT_INVOKER_CGROUP_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace silt::invoker {

// The cgroups of one instance (v1 memory/cpu/pids hierarchies, or v2 unified).
class Cgroup {
 public:
  static absl::StatusOr<std::unique_ptr<Cgroup>> Create(
      const std::string& name, uint64_t memory_limit_bytes, uint64_t cpu_millis,
      uint64_t max_pids);
  ~Cgroup();  // removes the (empty) cgroups
  absl::Status AddProcess(pid_t pid);
  // Its cgroup.procs files, one per hierarchy.
  std::vector<std::string> ProcsFiles() const;
  // The kernel's OOM killer acted in this cgroup.
  bool OomKilled() const;
  // How many processes the OOM killer ended here since the last call (one
  // of an instance's processes, e.g. a classic fprocess, while it lives on).
  uint64_t NewOomKills();
  uint64_t MemoryUsage() const;
  // Its memory limit from now on (0: none).
  absl::Status SetMemoryLimit(uint64_t bytes);

 private:
  Cgroup() = default;
  std::vector<std::string> dirs_;
  std::string memory_dir_;
  bool v2_ = false;
  uint64_t oom_kills_seen_ = 0;  // NewOomKills' count so far
};

// Every instance start moves a process into new cgroups. By default the
// kernel makes such a move wait for an RCU grace period whenever none happened
// for a while (4-15 ms here, on every forked or restored instance); the
// cgroup "favordynmods" option keeps moves fast at a small cost to fork and
// exit. Turns it on (a remount of the cgroup2 mount, else of a v1
// hierarchy), and says which, or why not.
absl::StatusOr<std::string> FavorCgroupMoves();

// Kills the processes left in Silt's cgroups by an earlier invoker of this node
// and removes the cgroups (restart into a consistent state).
void CleanupStaleCgroups(const std::string& prefix);

// Whether instances' cgroups are cgroup v2 (/sys/fs/cgroup is the unified
// hierarchy); else they are in the v1 memory, cpu and pids hierarchies.
bool CgroupV2();
// Creates cgroup directory `dir` (an absolute path) and its parents.
absl::Status CreateCgroupDir(const std::string& dir);
// Writes `value` to a cgroup control file (one write, as the kernel wants).
absl::Status WriteCgroupFile(const std::string& path, const std::string& value);

// The directory of cgroup `name` (relative to this process's own cgroup; ""
// for that one) in the v1 hierarchy of `controller`, or with controller "" in
// the v2 hierarchy.
std::string CgroupDir(const std::string& controller, const std::string& name);

}  // namespace silt::invoker

#endif  // SILT_INVOKER_CGROUP_H_
