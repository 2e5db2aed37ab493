#include "containerd/containerd.h"

#include <csignal>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client_impl.h"
#include "github.com/containerd/containerd/runtime/v2/runc/options/oci.pb.h"
#include "oci_spec.h"
#include "random_id.h"

namespace silt::containerd {
namespace {

namespace containers = containers_v1;
namespace tasks = tasks_v1;

// The runc shim's options, as containerd's typeurl names them.
constexpr char kRuncOptionsType[] = "containerd.runc.v1.Options";
constexpr char kRuncCheckpointOptionsType[] =
    "containerd.runc.v1.CheckpointOptions";
namespace version = version_v1;

// containerd's own names for what an Any holds (no type.googleapis.com/).
constexpr char kSpecType[] =
    "types.containerd.io/opencontainers/runtime-spec/1/Spec";
constexpr char kRuntime[] = "io.containerd.runc.v2";

}  // namespace

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& socket, std::string ns,
    std::chrono::milliseconds timeout) {
  auto impl = std::make_unique<Impl>();
  // Reconnect quickly: a containerd that is starting answers within ms.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  impl->channel = grpc::CreateCustomChannel(
      "unix://" + socket, grpc::InsecureChannelCredentials(), args);
  if (!impl->channel->WaitForConnected(std::chrono::system_clock::now() +
                                       timeout))
    return absl::UnavailableError(
        absl::StrCat("containerd does not answer at ", socket));
  impl->ns = std::move(ns);
  impl->version = version::Version::NewStub(impl->channel);
  impl->containers = containers::Containers::NewStub(impl->channel);
  impl->tasks = tasks::Tasks::NewStub(impl->channel);
  impl->content = content_v1::Content::NewStub(impl->channel);
  impl->images = images_v1::Images::NewStub(impl->channel);
  impl->snapshots = snapshots_v1::Snapshots::NewStub(impl->channel);
  impl->diff = diff_v1::Diff::NewStub(impl->channel);
  impl->leases = leases_v1::Leases::NewStub(impl->channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<std::string> Client::Version() {
  auto ctx = impl_->Context();
  google::protobuf::Empty req;
  version::VersionResponse res;
  if (auto s = FromGrpc(impl_->version->Version(ctx.get(), req, &res),
                        "containerd Version");
      !s.ok())
    return s;
  return res.version();
}

Lease::Lease(Client::Impl* impl, const std::string& prefix,
             absl::Duration expire, bool sync_delete)
    : impl_(impl), sync_delete_(sync_delete) {
  leases_v1::CreateRequest req;
  req.set_id(prefix + invoker::RandomId(12));
  (*req.mutable_labels())["containerd.io/gc.expire"] = absl::FormatTime(
      absl::RFC3339_sec, absl::Now() + expire, absl::UTCTimeZone());
  leases_v1::CreateResponse res;
  auto ctx = impl_->Context();
  status_ = FromGrpc(impl_->leases->Create(ctx.get(), req, &res),
                     "cannot create a lease");
  if (status_.ok()) id_ = req.id();
}

Lease::~Lease() {
  if (id_.empty()) return;
  leases_v1::DeleteRequest req;
  req.set_id(id_);
  req.set_sync(sync_delete_);
  google::protobuf::Empty res;
  auto ctx = impl_->Context();
  impl_->leases->Delete(ctx.get(), req, &res);
}

absl::Status Client::Create(const ContainerSpec& spec) {
  // An image's container is rooted on a snapshot of its own, made under a
  // lease until the container refers to it: containerd's garbage collector
  // (run after any removal, another instance's say) takes a snapshot that
  // nothing refers to.
  google::protobuf::RepeatedPtrField<::containerd::types::Mount> rootfs;
  std::string image_name;
  std::optional<Lease> lease;
  if (!spec.image.empty()) {
    auto image = GetImage(spec.image);
    if (!image.ok()) return image.status();
    image_name = image->name;
    lease.emplace(impl_.get(), "silt-create-", absl::Minutes(10),
                  /*sync_delete=*/false);
    if (!lease->status().ok()) return lease->status();
    auto ctx = impl_->Context(std::chrono::seconds(30), lease->id());
    // Writable even for a read-only root: runc makes the mount points an
    // image lacks (secrets, say) before it makes the root read-only.
    snapshots_v1::PrepareSnapshotRequest req;
    req.set_snapshotter(kSnapshotter);
    req.set_key(spec.id);
    req.set_parent(image->chain_id);
    snapshots_v1::PrepareSnapshotResponse res;
    grpc::Status s = impl_->snapshots->Prepare(ctx.get(), req, &res);
    rootfs = res.mounts();
    if (!s.ok())
      return FromGrpc(s, absl::StrCat("cannot make the root of ", spec.id,
                                      " from ", image->name));
  } else {
    auto* root = rootfs.Add();
    root->set_type("bind");
    root->set_source(spec.rootfs);
    root->add_options("rbind");
    root->add_options(spec.read_only_root ? "ro" : "rw");
  }
  // Undoes what was made when a later step fails: nothing is left behind.
  auto undo = [&](bool container) {
    if (container) {
      containers::DeleteContainerRequest del;
      del.set_id(spec.id);
      google::protobuf::Empty empty;
      auto ctx = impl_->Context();
      impl_->containers->Delete(ctx.get(), del, &empty);
    }
    if (!spec.image.empty()) RemoveSnapshot(spec.id).IgnoreError();
  };
  {
    containers::CreateContainerRequest req;
    auto* c = req.mutable_container();
    c->set_id(spec.id);
    c->mutable_runtime()->set_name(kRuntime);
    c->mutable_spec()->set_type_url(kSpecType);
    c->mutable_spec()->set_value(OciSpecJson(spec, impl_->ns));
    (*c->mutable_labels())["silt.function-instance"] = "true";
    if (!image_name.empty()) {
      c->set_image(image_name);
      c->set_snapshotter(kSnapshotter);
      c->set_snapshot_key(spec.id);
    }
    containers::CreateContainerResponse res;
    auto ctx = impl_->Context();
    if (auto s = FromGrpc(impl_->containers->Create(ctx.get(), req, &res),
                          absl::StrCat("cannot create container ", spec.id));
        !s.ok()) {
      // The snapshot of a taken id is the other container's.
      if (s.code() != absl::StatusCode::kAlreadyExists) undo(false);
      return s;
    }
  }
  tasks::CreateTaskRequest req;
  req.set_container_id(spec.id);
  *req.mutable_rootfs() = std::move(rootfs);
  if (!spec.restore_from.empty()) {
    // Start restores the task from these CRIU images (runc restore).
    ::containerd::runc::v1::Options o;
    o.set_criu_image_path(spec.restore_from);
    o.set_criu_work_path(spec.restore_from + ".work");
    req.mutable_options()->set_type_url(kRuncOptionsType);
    req.mutable_options()->set_value(o.SerializeAsString());
  }
  if (!spec.log_path.empty()) {
    req.set_stdout("file://" + spec.log_path);
    req.set_stderr("file://" + spec.log_path);
  }
  tasks::CreateTaskResponse res;
  auto ctx = impl_->Context();
  absl::Status s = FromGrpc(impl_->tasks->Create(ctx.get(), req, &res),
                            absl::StrCat("cannot create task ", spec.id));
  if (!s.ok()) undo(true);  // no container without its task
  return s;
}

absl::Status Client::RemoveSnapshot(const std::string& key) {
  snapshots_v1::RemoveSnapshotRequest req;
  req.set_snapshotter(kSnapshotter);
  req.set_key(key);
  google::protobuf::Empty res;
  auto ctx = impl_->Context();
  grpc::Status s = impl_->snapshots->Remove(ctx.get(), req, &res);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) return absl::OkStatus();
  return FromGrpc(s, "cannot remove snapshot " + key);
}

absl::Status Client::Start(const std::string& id) {
  tasks::StartRequest req;
  req.set_container_id(id);
  tasks::StartResponse res;
  auto ctx = impl_->Context();
  return FromGrpc(impl_->tasks->Start(ctx.get(), req, &res),
                  absl::StrCat("cannot start task ", id));
}

absl::Status Client::Checkpoint(const std::string& id,
                                const std::string& image_dir) {
  ::containerd::runc::v1::CheckpointOptions o;
  o.set_exit(false);  // it runs on
  o.set_image_path(image_dir);
  o.set_work_path(image_dir + ".work");
  tasks::CheckpointTaskRequest req;
  req.set_container_id(id);
  req.mutable_options()->set_type_url(kRuncCheckpointOptionsType);
  req.mutable_options()->set_value(o.SerializeAsString());
  tasks::CheckpointTaskResponse res;
  auto ctx = impl_->Context(std::chrono::seconds(60));
  return FromGrpc(impl_->tasks->Checkpoint(ctx.get(), req, &res),
                  absl::StrCat("cannot checkpoint task ", id));
}

absl::StatusOr<pid_t> Client::Pid(const std::string& id) {
  tasks::GetRequest req;
  req.set_container_id(id);
  tasks::GetResponse res;
  auto ctx = impl_->Context();
  if (auto s = FromGrpc(impl_->tasks->Get(ctx.get(), req, &res),
                        absl::StrCat("no task ", id));
      !s.ok())
    return s;
  // An exited task keeps its pid in containerd's record: another process
  // may have it by now.
  if (res.process().status() != ::containerd::v1::types::Status::RUNNING &&
      res.process().status() != ::containerd::v1::types::Status::CREATED &&
      res.process().status() != ::containerd::v1::types::Status::PAUSED)
    return absl::NotFoundError(absl::StrCat("task ", id, " is not running"));
  return static_cast<pid_t>(res.process().pid());
}

bool Client::TaskLost(const std::string& id) {
  tasks::GetRequest req;
  req.set_container_id(id);
  tasks::GetResponse res;
  auto ctx = impl_->Context();
  // (UNKNOWN, or no process where one should run: a restore's task gets
  // its pid only once its start completes)
  return impl_->tasks->Get(ctx.get(), req, &res).ok() &&
         (res.process().status() == ::containerd::v1::types::Status::UNKNOWN ||
          (res.process().pid() == 0 &&
           res.process().status() != ::containerd::v1::types::Status::STOPPED));
}

absl::StatusOr<uint32_t> Client::Wait(const std::string& id,
                                      std::chrono::milliseconds timeout) {
  tasks::WaitRequest req;
  req.set_container_id(id);
  tasks::WaitResponse res;
  auto ctx = impl_->Context(timeout);
  grpc::Status st = impl_->tasks->Wait(ctx.get(), req, &res);
  // containerd sees the deadline too, and its shim's answer to it (UNKNOWN,
  // "context deadline exceeded" through ttrpc) may come before ours.
  if (!st.ok() && std::chrono::system_clock::now() >= ctx->deadline())
    return absl::DeadlineExceededError(
        absl::StrCat("task ", id, " still running after ", timeout.count(),
                     " ms (", st.error_message(), ")"));
  if (auto s = FromGrpc(st, absl::StrCat("waiting for task ", id)); !s.ok())
    return s;
  return res.exit_status();
}

absl::Status Client::Kill(const std::string& id, int signal) {
  tasks::KillRequest req;
  req.set_container_id(id);
  req.set_signal(static_cast<uint32_t>(signal));
  req.set_all(true);
  google::protobuf::Empty res;
  auto ctx = impl_->Context();
  return FromGrpc(impl_->tasks->Kill(ctx.get(), req, &res),
                  absl::StrCat("cannot signal task ", id));
}

absl::Status Client::Delete(const std::string& id,
                            std::chrono::milliseconds wait) {
  bool found = false;
  {
    tasks::DeleteTaskRequest req;
    req.set_container_id(id);
    tasks::DeleteResponse res;
    auto ctx = impl_->Context();
    grpc::Status s = impl_->tasks->Delete(ctx.get(), req, &res);
    if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND) {
      // Still running ("cannot delete a running process"): killed, waited
      // for, then deleted. (Kill fails for one that exited meanwhile.)
      Kill(id, SIGKILL).IgnoreError();
      if (auto w = Wait(id, wait); !w.ok()) return w.status();
      auto again = impl_->Context();
      s = impl_->tasks->Delete(again.get(), req, &res);
    }
    if (s.ok()) found = true;
    if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND)
      return FromGrpc(s, absl::StrCat("cannot delete task ", id));
  }
  containers::DeleteContainerRequest req;
  req.set_id(id);
  google::protobuf::Empty res;
  auto ctx = impl_->Context();
  grpc::Status s = impl_->containers->Delete(ctx.get(), req, &res);
  if (s.ok()) found = true;
  if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND)
    return FromGrpc(s, absl::StrCat("cannot delete container ", id));
  // An image's container has its root on a snapshot of its id (a container
  // whose removal was cut short may have left only that).
  snapshots_v1::StatSnapshotRequest stat;
  stat.set_snapshotter(kSnapshotter);
  stat.set_key(id);
  snapshots_v1::StatSnapshotResponse info;
  auto sctx = impl_->Context();
  if (impl_->snapshots->Stat(sctx.get(), stat, &info).ok()) {
    if (auto r = RemoveSnapshot(id); !r.ok()) return r;
    found = true;
  }
  if (!found) return absl::NotFoundError(absl::StrCat("no container ", id));
  return absl::OkStatus();
}

const std::string& Client::Namespace() const { return impl_->ns; }

std::string Client::CgroupPath(const std::string& id) const {
  return CgroupPathOf(impl_->ns, id);
}

absl::StatusOr<std::vector<std::string>> Client::List() {
  containers::ListContainersRequest req;
  containers::ListContainersResponse res;
  auto ctx = impl_->Context();
  if (auto s = FromGrpc(impl_->containers->List(ctx.get(), req, &res),
                        "cannot list containers");
      !s.ok())
    return s;
  std::vector<std::string> ids;
  for (const auto& c : res.containers()) ids.push_back(c.id());
  return ids;
}

}  // namespace silt::containerd
