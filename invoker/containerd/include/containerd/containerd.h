// A client of containerd's gRPC API for the invoker's container instances,
// and a containerd of the invoker's own (Daemon) for nodes that run none.
// Everything a call does is in one containerd namespace, given at Connect.
//
// Thread safety: Client is thread-safe (one gRPC channel, calls in parallel);
// Daemon is not (one owner).
#ifndef SILT_CONTAINERD_CONTAINERD_H_
#define SILT_CONTAINERD_CONTAINERD_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "containerd/archive.h"

namespace silt::containerd {

// An image in the namespace's store, its layers unpacked by containerd's
// overlayfs snapshotter, and what its config says to run.
struct Image {
  std::string name;      // normalized ("docker.io/library/hello:latest")
  std::string digest;    // its manifest's ("sha256:<64 hex>")
  uint64_t size = 0;     // of its manifest, config and layers as stored
  std::string chain_id;  // the snapshot of its root (its top layer's chain)
  std::vector<std::string> entrypoint, cmd, env;
  std::string working_dir;  // "" for "/"
  std::string user;
  std::vector<std::string> exposed_ports;     // "8080/tcp"
  std::map<std::string, std::string> labels;  // its config's
  // The labels of its record in containerd (Import's `record_labels`).
  std::map<std::string, std::string> record_labels;
};

// What one container runs (made into its OCI runtime spec by the client).
struct ContainerSpec {
  std::string id;  // unique in the namespace
  // Its root: an image of the namespace (a name as Image::name, or as a
  // user wrote it), on a snapshot of its own that Delete removes, or else a
  // directory, bind-mounted.
  std::string image;
  std::string rootfs;
  bool read_only_root = true;
  std::vector<std::string> args;  // args[0]: a path inside the rootfs
  std::vector<std::string> env;   // "K=V"
  std::string cwd = "/";
  // The network namespace to join (a path: Cni::Attachment::netns); empty:
  // a new one with nothing in it.
  std::string netns;
  uint64_t memory_limit_bytes = 0;  // 0: none of its own
  uint64_t cpu_millis = 0;          // CPU quota in thousandths of a core
  // Host paths bound into it (e.g. secrets at /var/openfaas/secrets).
  struct Mount {
    std::string source, destination;
    bool read_only = true;
  };
  std::vector<Mount> mounts;
  // The file (a host path) its stdout and stderr are appended to, together
  // (containerd's runc shim writes both streams of a file:// to it); whole
  // once the task is deleted (after Wait, its last bytes may still be on
  // their way).
  std::string log_path;
  // CRIU images of a checkpoint of a container of the same image
  // (Client::Checkpoint): Start restores its processes from them instead of
  // running `args`. Its network namespace may differ (an external one).
  std::string restore_from;
};

class Client {
 public:
  // Connects to containerd's socket (a path) and waits up to `timeout` for
  // it to answer. Unavailable when it does not.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& socket, std::string ns,
      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~Client();

  // containerd's version ("1.6.20~ds1").
  absl::StatusOr<std::string> Version();

  // Creates the container and its task (created, not running).
  // AlreadyExists when the id is taken.
  absl::Status Create(const ContainerSpec& spec);
  absl::Status Start(const std::string& id);
  // Checkpoints the running task into `image_dir` (CRIU images, through
  // runc; scratch beside it in `image_dir`.work), leaving it running. Its
  // network namespace must be one given by path (external to the images).
  absl::Status Checkpoint(const std::string& id, const std::string& image_dir);
  // The pid of the container's task (its init process, e.g. for
  // /proc/PID/ns/net). NotFound when it has no task, or one no longer
  // running (its pid may be another process's by now).
  absl::StatusOr<pid_t> Pid(const std::string& id);
  // Waits for the task to exit: its exit status. DeadlineExceeded after
  // `timeout` (the task runs on).
  absl::StatusOr<uint32_t> Wait(const std::string& id,
                                std::chrono::milliseconds timeout);
  absl::Status Kill(const std::string& id, int signal);
  // Whether container `id` has a task in a state containerd does not know
  // (one whose start was cut short when its client died): its shim neither
  // signals nor deletes it, and calls to it wait out their deadline.
  bool TaskLost(const std::string& id);
  // Removes the task (killed first if it runs, waiting up to `wait` for it
  // to end) and the container. NotFound when neither exists.
  absl::Status Delete(const std::string& id, std::chrono::milliseconds wait =
                                                 std::chrono::seconds(10));
  // The containers of the namespace, by id.
  absl::StatusOr<std::vector<std::string>> List();
  // Container `id`'s cgroup, below each hierarchy's root ("/silt-NS/ID").
  std::string CgroupPath(const std::string& id) const;

  // Images. Import loads an OCI image layout or a `docker save` archive
  // (plain or gzipped) into the store and unpacks each image it names for
  // linux/amd64: the images, InvalidArgument (saying what is wrong) for an
  // archive that is none of those or whose blobs do not match their
  // digests, nothing left behind. An image already there under the same
  // name is replaced. Its records carry `record_labels`.
  absl::StatusOr<std::vector<Image>> Import(
      const std::string& archive,
      const std::map<std::string, std::string>& record_labels = {});
  // NotFound when there is no such image.
  // The containerd namespace this client works in.
  const std::string& Namespace() const;
  absl::StatusOr<Image> GetImage(const std::string& name);
  absl::StatusOr<std::vector<Image>> ListImages();
  // Removes the image; its content and snapshots go with containerd's next
  // garbage collection (at once), unless a container still uses them.
  // NotFound when there is no such image.
  absl::Status RemoveImage(const std::string& name);
  // Counts of what the namespace holds, to see that nothing leaks.
  struct Usage {
    size_t containers = 0, images = 0, content_blobs = 0, snapshots = 0,
           leases = 0;
  };
  absl::StatusOr<Usage> CountUsage();

  struct Impl;  // the library's own (client_impl.h)

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  absl::Status RemoveSnapshot(const std::string& key);  // OK when none
  std::unique_ptr<Impl> impl_;
};

// containerd run for the invoker: root, state, config, log and socket under
// one directory, the CRI plugin off. Start adopts one already serving there
// (an invoker that restarted) instead of starting a second.
class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const std::string& dir);
  ~Daemon();  // stops it (SIGTERM, then SIGKILL after 10 s)

  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }
  // Whether it still runs.
  bool Alive() const;

 private:
  Daemon(std::string dir, std::string socket, pid_t pid);
  std::string dir_, socket_;
  pid_t pid_;
};

}  // namespace silt::containerd

#endif  // SILT_CONTAINERD_CONTAINERD_H_
