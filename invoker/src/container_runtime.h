// Function instances as containers (functions deployed from OCI images, the
// faasd way): each instance is a container of its image with the
// deployment's environment over the image's, secrets read-only at
// /var/openfaas/secrets, the function's memory and CPU limits, a read-only
// root unless asked otherwise, and a network namespace of its own on the
// node's CNI bridge (connected between task create and start, as faasd
// does). It is ready when its watchdog answers GET /_/health on
// :8080 with 200, as faasd's gateway expects.
//
// Thread safety: Start and Stop may run at once for different instances.
#ifndef SILT_INVOKER_CONTAINER_RUNTIME_H_
#define SILT_INVOKER_CONTAINER_RUNTIME_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "containerd/cni.h"
#include "containerd/containerd.h"

namespace silt::invoker {

inline constexpr char kContainerSecretsDir[] = "/var/openfaas/secrets";
inline constexpr int kWatchdogPort = 8080;

struct ContainerLaunch {
  std::string id;                // the instance's, unique on the node
  std::string image;             // an imported image's name
  std::vector<std::string> env;  // "K=V", over the image's
  std::string secrets_dir;       // host dir → kContainerSecretsDir; may be ""
  uint64_t memory_limit_bytes = 0;
  uint64_t cpu_millis = 0;
  bool read_only_root = true;
  std::string log_path;  // its stdout and stderr
  // A checkpoint of an instance of the same function (Checkpoint): its
  // processes are restored from it instead of booting the image.
  std::string restore_from;
};

struct RunningContainer {
  std::string id;
  std::string ip;            // on the node's bridge; the watchdog at ip:8080
  std::string netns;         // its network namespace (a /proc path)
  std::string image_digest;  // of the image it runs (its manifest's)
  std::string phases;  // where its start's time went ("network 9.1 ms, ...")
};

class ContainerRuntime {
 public:
  ContainerRuntime(std::shared_ptr<containerd::Client> client,
                   std::shared_ptr<containerd::Cni> cni)
      : client_(std::move(client)), cni_(std::move(cni)) {}

  // Starts the instance and waits up to `timeout` for its health check.
  // NotFound for an image that is not imported; FailedPrecondition (with
  // the end of its log) when it exits first; DeadlineExceeded
  // when it never answers. Nothing is left behind when it fails.
  absl::StatusOr<RunningContainer> Start(const ContainerLaunch& launch,
                                         std::chrono::milliseconds timeout);
  // Checkpoints a running instance into `dir` (CRIU images through runc;
  // made whole under a temporary name first, so `dir` exists only whole),
  // leaving it running: FailedPrecondition when CRIU cannot (e.g. a
  // connection open in it), AlreadyExists when `dir` is there.
  absl::Status Checkpoint(const std::string& id, const std::string& dir);
  // The digest of imported image `name` (its manifest's): a checkpoint is
  // of one digest, and the name may be imported again with other content.
  absl::StatusOr<std::string> ImageDigest(const std::string& name);
  // Freezes the instance's processes (its cgroup's freezer: they take no
  // CPU and answer nothing until thawed), or thaws them. NotFound when its
  // cgroup is gone (the container with it).
  absl::Status Freeze(const std::string& id, bool frozen);
  // The processes of the instance's container (its cgroup's), none when
  // it is gone.
  std::vector<pid_t> Pids(const std::string& id);
  // Stops the instance (thawed first, if frozen): its container, snapshot
  // and network. OK when there is nothing left of it.
  absl::Status Stop(const std::string& id);
  // Why container `id` no longer serves, for a call's answer and the log:
  // its exit status (waited for up to `wait`), and whether its memory
  // limit killed something in it.
  std::string WhyLost(const std::string& id, std::chrono::milliseconds wait);
  // Removes the namespace's containers this runtime did not start (an
  // earlier invoker's: containers outlive it, instances do not), with their
  // networks. What it removed, by id.
  std::vector<std::string> RemoveOthers();

 private:
  // Deletes container `id` through containerd; when its task cannot be
  // killed that way (one an invoker that died was restoring: containerd
  // does not signal it), kills what runs in its cgroup directly and
  // deletes again.
  absl::Status Delete(const std::string& id);

  const std::shared_ptr<containerd::Client> client_;
  const std::shared_ptr<containerd::Cni> cni_;
  // Each started container's network namespace, held until Stop (also so
  // the plugins can undo their work in it after its processes are gone: an
  // instance killed for its memory limit).
  absl::Mutex mu_;
  std::map<std::string, containerd::NetworkNamespace> netns_
      ABSL_GUARDED_BY(mu_);
};

// An instance's container, stopped (ContainerRuntime::Stop) when this goes.
class ContainerLease {
 public:
  ContainerLease() = default;
  ContainerLease(std::shared_ptr<ContainerRuntime> runtime, std::string id)
      : runtime_(std::move(runtime)), id_(std::move(id)) {}
  ContainerLease(ContainerLease&& o) noexcept = default;
  ContainerLease& operator=(ContainerLease&& o) noexcept {
    Release();
    runtime_ = std::move(o.runtime_);
    id_ = std::move(o.id_);
    return *this;
  }
  ~ContainerLease() { Release(); }
  bool held() const { return runtime_ != nullptr; }
  // ContainerRuntime::WhyLost of this instance's container.
  std::string WhyLost() const {
    return runtime_ ? runtime_->WhyLost(id_, std::chrono::seconds(1)) : "";
  }
  // ContainerRuntime::Freeze and Pids of this instance's container.
  absl::Status Freeze(bool frozen) const {
    return runtime_ ? runtime_->Freeze(id_, frozen)
                    : absl::FailedPreconditionError("no container");
  }
  std::vector<pid_t> Pids() const {
    return runtime_ ? runtime_->Pids(id_) : std::vector<pid_t>{};
  }

 private:
  void Release();
  std::shared_ptr<ContainerRuntime> runtime_;
  std::string id_;
};

// GET /_/health of a watchdog at ip:port: whether it answered 200 (one try,
// within `timeout`).
bool WatchdogHealthy(const std::string& ip, int port,
                     std::chrono::milliseconds timeout);

}  // namespace silt::invoker

#endif  // SILT_INVOKER_CONTAINER_RUNTIME_H_
