// Runs one process in a sandbox: its own PID, mount, IPC, UTS and network
// namespaces (loopback only), a read-only view of the system under a fresh
// root, the bundle and the secrets mounted read-only, a private writable /tmp,
// a cgroup with the memory, CPU and pids limits, no capabilities, no_new_privs,
// uid/gid kInstanceId of a user namespace that maps it to a host id of the
// function's own (nothing else is mapped), and a seccomp allow-list filter
// (built once, before any fork) that kills the process on any other syscall.
#ifndef SILT_INVOKER_SANDBOX_H_
#define SILT_INVOKER_SANDBOX_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cgroup.h"

namespace silt::invoker {

// Where things appear inside every sandbox.
inline constexpr char kSandboxBundleDir[] = "/var/silt/bundle";
inline constexpr char kSandboxWorkerDir[] = "/var/silt/bin";
inline constexpr char kSandboxWorkerPath[] = "/var/silt/bin/silt-worker";
inline constexpr char kSandboxSecretsDir[] = "/var/openfaas/secrets";
// Snapshot-ready sandboxes: a per-instance directory where the worker finds
// the invoker's socket after a restore.
inline constexpr char kSandboxRunDir[] = "/var/silt/run";

// The uid and gid an instance runs as: root of its own user namespace (what
// CRIU expects of a checkpointed tree), which is the function's unprivileged
// host id, with no capabilities.
inline constexpr uint32_t kInstanceId = 0;

// The host uid (and gid) of the instances of function `ns`/`name`: one of
// 2^28 ids from 2^30 up, far from the ids of the host's users and of
// container ranges, the same on every node (a restored image keeps working
// anywhere).
uint32_t HostIdOf(std::string_view ns, std::string_view name);

struct SandboxSpec {
  // The root's mount points, made by PrepareRootSkeleton beforehand. May be
  // shared by every sandbox: the mounts on it are private to each.
  std::string root_dir;
  std::string bundle_dir;   // host dir → kSandboxBundleDir (ro)
  std::string secrets_dir;  // host dir → kSandboxSecretsDir (ro)
  std::string
      worker_dir;  // host dir holding silt-worker → kSandboxWorkerDir (ro)
  std::vector<std::string> argv;  // argv[0] is the path inside the sandbox
  std::vector<std::string> env;   // KEY=VALUE
  std::string hostname;
  std::string cgroup;  // relative cgroup name, e.g. "silt/node-a/fn-1a2b"
  uint64_t memory_limit_bytes = 0;  // 0 = no limit
  uint64_t cpu_millis = 0;          // 0 = no limit
  uint64_t max_pids = 1024;
  uint64_t tmp_bytes = 64 << 20;
  // The host id kInstanceId maps to (see HostIdOf). Root owns the user
  // namespace, so CRIU (as root) may checkpoint the instance even where root
  // lacks CAP_SYS_RESOURCE in the host's namespace.
  uint32_t host_id = 0;
  // Snapshot-ready: the worker can be checkpointed by CRIU (/proc limited to
  // processes, /dev and /tmp bound from the host, a run dir).
  bool snapshot_ready = false;
  std::string run_dir;  // host dir → kSandboxRunDir (ro), snapshot-ready only
  // Snapshot-ready, optional: host dirs bound as /dev (ro; holds the device
  // nodes, see PrepareDevDir) and /tmp (rw; a size-limited tmpfs).
  std::string dev_dir;
  std::string tmp_dir;
  // A network namespace to join (a path: a container's, Cni) instead of a
  // new one with loopback only. Such a sandbox cannot be checkpointed.
  std::string netns;
  int channel_fd = -1;  // becomes fd 3 inside
  int stdout_fd = -1;   // becomes fd 1
  int stderr_fd = -1;   // becomes fd 2
};

class SandboxedProcess {
 public:
  // A process tree that was restored by CRIU as our child: joins `cgroup`.
  static absl::StatusOr<std::unique_ptr<SandboxedProcess>> Adopt(
      pid_t pid, std::unique_ptr<Cgroup> cgroup);
  // A clone forked by a template (not our child): watched through a pidfd.
  static absl::StatusOr<std::unique_ptr<SandboxedProcess>> AdoptClone(
      pid_t pid, std::unique_ptr<Cgroup> cgroup);
  ~SandboxedProcess();  // SIGKILLs the process (and so its PID namespace) and
                        // reaps it
  pid_t pid() const { return pid_; }
  Cgroup& cgroup() { return *cgroup_; }
  // Kills and reaps; returns the wait status.
  int Kill();
  // Non-blocking: the wait status if the process has exited.
  std::optional<int> Poll();

 private:
  friend absl::StatusOr<std::unique_ptr<SandboxedProcess>> Spawn(
      const SandboxSpec& spec);
  pid_t pid_ = -1;
  int pidfd_ = -1;  // clones only
  int status_ = 0;
  bool reaped_ = false;
  std::unique_ptr<Cgroup> cgroup_;
};

// Starts spec.argv in a new sandbox. Fails with a message naming the set-up
// step and errno when the sandbox cannot be built (e.g. not root).
absl::StatusOr<std::unique_ptr<SandboxedProcess>> Spawn(
    const SandboxSpec& spec);

// Makes `dir` the empty skeleton of a sandbox root (mount points and the
// /bin → usr/bin style links): for Spawn (SandboxSpec::root_dir) and for
// CRIU to restore a sandbox into. Idempotent.
absl::Status PrepareRootSkeleton(const std::string& dir);

// Fills `dir` with the device nodes sandboxes get (null, zero, full, random,
// urandom). FailedPrecondition when its filesystem does not allow devices.
absl::Status PrepareDevDir(const std::string& dir);

// PrepareDevDir, and copies of `host_dev`'s NVIDIA device nodes (nvidiactl,
// nvidia0..., nvidia-uvm, nvidia-uvm-tools) where it has them: the /dev of a
// GPU proclet's process (silt-gpu-host), whose CUDA driver opens them. How
// many it copied.
absl::StatusOr<int> PrepareGpuDevDir(const std::string& dir,
                                     const std::string& host_dev = "/dev");

// Host dirs bound at /run/silt-criu/NAME/KEY, a path any uid may traverse
// (not list): CRIU restores the mounts of a tree in a user namespace as that
// namespace's root, the function's host id, which cannot traverse the
// root-only data dir to reach their sources. Unbound when destroyed.
class TraversableBinds {
 public:
  // `dirs`: key → host dir.
  static absl::StatusOr<std::unique_ptr<TraversableBinds>> Make(
      const std::string& name,
      const std::vector<std::pair<std::string, std::string>>& dirs);
  ~TraversableBinds();
  std::string PathOf(const std::string& key) const { return root_ + "/" + key; }

 private:
  TraversableBinds() = default;
  std::string root_;
  std::vector<std::string> bound_;
};

// Mounts a tmpfs of `bytes` at `dir` (an instance's /tmp).
absl::Status MountTmp(const std::string& dir, uint64_t bytes);

// Brings loopback up in the network namespace of `pid` (a restored instance's
// namespace starts empty).
absl::Status LoopbackUp(pid_t pid);

// All processes of the tree rooted at `pid` (itself included), as seen from
// here.
std::vector<pid_t> ProcessTree(pid_t pid);

}  // namespace silt::invoker

#endif  // SILT_INVOKER_SANDBOX_H_
