// Client's state, shared by its files (containerd.cc: containers and tasks;
// images.cc: content, images, snapshots). Generated gRPC code stays behind
// this private header.
#ifndef SILT_CONTAINERD_CLIENT_IMPL_H_
#define SILT_CONTAINERD_CLIENT_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "containerd/containerd.h"
#include "github.com/containerd/containerd/api/services/containers/v1/containers.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/content/v1/content.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/diff/v1/diff.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/images/v1/images.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/leases/v1/leases.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/snapshots/v1/snapshots.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/tasks/v1/tasks.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/version/v1/version.grpc.pb.h"

namespace silt::containerd {

namespace containers_v1 = ::containerd::services::containers::v1;
namespace content_v1 = ::containerd::services::content::v1;
namespace diff_v1 = ::containerd::services::diff::v1;
namespace images_v1 = ::containerd::services::images::v1;
namespace leases_v1 = ::containerd::services::leases::v1;
namespace snapshots_v1 = ::containerd::services::snapshots::v1;
namespace tasks_v1 = ::containerd::services::tasks::v1;
namespace version_v1 = ::containerd::services::version::v1;

// The snapshotter images are unpacked by and containers rooted on.
inline constexpr char kSnapshotter[] = "overlayfs";

inline absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      what + ": " + s.error_message());
}

struct Client::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::string ns;
  std::unique_ptr<version_v1::Version::Stub> version;
  std::unique_ptr<containers_v1::Containers::Stub> containers;
  std::unique_ptr<tasks_v1::Tasks::Stub> tasks;
  std::unique_ptr<content_v1::Content::Stub> content;
  std::unique_ptr<images_v1::Images::Stub> images;
  std::unique_ptr<snapshots_v1::Snapshots::Stub> snapshots;
  std::unique_ptr<diff_v1::Diff::Stub> diff;
  std::unique_ptr<leases_v1::Leases::Stub> leases;

  // A call's context: in the namespace (and, when given, under a lease,
  // which keeps what the call makes from containerd's garbage collector),
  // within `timeout`.
  std::unique_ptr<grpc::ClientContext> Context(
      std::chrono::milliseconds timeout = std::chrono::seconds(30),
      const std::string& lease = "") const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("containerd-namespace", ns);
    if (!lease.empty()) ctx->AddMetadata("containerd-lease", lease);
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    return ctx;
  }
};

// A lease of containerd's, held while this lives: what is made under it
// (Client::Impl::Context's `lease`) is safe from containerd's garbage
// collector, which may run at any time (after any removal), until something
// else refers to it. It expires by itself should the invoker die holding it.
class Lease {
 public:
  Lease(Client::Impl* impl, const std::string& prefix, absl::Duration expire,
        bool sync_delete);
  ~Lease();  // deletes it (with sync_delete, what nothing holds is gone)
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  // Empty, with why, when containerd made none.
  const std::string& id() const { return id_; }
  const absl::Status& status() const { return status_; }

 private:
  Client::Impl* impl_;
  std::string id_;
  absl::Status status_;
  bool sync_delete_;
};

}  // namespace silt::containerd

#endif  // SILT_CONTAINERD_CLIENT_IMPL_H_
