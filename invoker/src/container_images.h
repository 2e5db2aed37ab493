// The node's OCI images (silt image import): kept in containerd, in the
// invoker's own containerd namespace, as the gateway's ImageSet says. A
// thread of its own fetches the archives of images the node lacks from the
// gateway, imports them (containerd/containerd.h), removes the images no
// longer wanted, and reports what the node holds. containerd is the one
// given (--containerd) or one of the invoker's own under DATA_DIR/containerd,
// started when the first image is wanted and restarted when it died.
#ifndef SILT_INVOKER_CONTAINER_IMAGES_H_
#define SILT_INVOKER_CONTAINER_IMAGES_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "container_runtime.h"
#include "containerd/cni.h"
#include "containerd/containerd.h"
#include "gateway/proto/control.pb.h"

namespace silt::invoker {

namespace control = ::silt::control::v1;

class ContainerImages {
 public:
  struct Options {
    std::string containerd_socket;  // empty: a containerd of our own in `dir`
    std::string dir;                // DATA_DIR/containerd
    std::string ns = "silt";        // containerd namespace
    // Streams the archive with this digest from the gateway into `path`.
    std::function<absl::Status(const std::string& digest,
                               const std::string& path)>
        fetch;
    // A new report is ready (TakeReport).
    std::function<void()> changed;
    // An image the node held was imported again with other content (its
    // normalized name): what was made of the old one (checkpoints) must go.
    std::function<void(const std::string& name)> replaced;
  };

  explicit ContainerImages(Options options);
  ~ContainerImages();  // StopImports, then stops a containerd of our own

  // Ends the import thread (an import in progress first); containerd and
  // Runtime stay.
  void StopImports();

  // The images to keep from now on (replaces the previous set).
  void Want(const control::ImageSet& set);
  // The node's images, once after each change (and after ResendReport).
  std::optional<control::ImageReport> TakeReport();
  // The next TakeReport returns the current report (a new gateway session).
  void ResendReport();
  // What starts the node's container instances (containerd connected, or
  // started, on first use; the CNI network). FailedPrecondition or
  // Unavailable when this node cannot run containers.
  absl::StatusOr<std::shared_ptr<ContainerRuntime>> Runtime();

 private:
  void Run();
  void Reconcile(const control::ImageSet& set);
  absl::StatusOr<std::shared_ptr<containerd::Client>> EnsureClient();
  absl::StatusOr<std::shared_ptr<ContainerRuntime>> RuntimeLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(client_mu_);

  const Options options_;
  // containerd (ours, or none when given a socket), its client, the
  // network, and what runs instances with them: replaced when containerd
  // died (instances keep the runtime they started with).
  absl::Mutex client_mu_;
  std::unique_ptr<containerd::Daemon> daemon_ ABSL_GUARDED_BY(client_mu_);
  std::shared_ptr<containerd::Client> client_ ABSL_GUARDED_BY(client_mu_);
  std::shared_ptr<ContainerRuntime> runtime_ ABSL_GUARDED_BY(client_mu_);
  // Once per invoker run: what an earlier run left (RemoveOthers).
  bool orphans_removed_ ABSL_GUARDED_BY(client_mu_) = false;

  absl::Mutex mu_;
  std::optional<control::ImageSet> wanted_ ABSL_GUARDED_BY(mu_);  // not done
  control::ImageReport report_ ABSL_GUARDED_BY(mu_);
  bool report_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_CONTAINER_IMAGES_H_
