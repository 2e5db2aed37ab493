#include "containerd/containerd.h"

#include <grpcpp/grpcpp.h>

#include <csignal>
#include <utility>

#include "absl/strings/str_cat.h"
#include "github.com/containerd/containerd/api/services/containers/v1/containers.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/tasks/v1/tasks.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/version/v1/version.grpc.pb.h"
#include "oci_spec.h"

namespace silt::containerd {
namespace {

namespace containers = ::containerd::services::containers::v1;
namespace tasks = ::containerd::services::tasks::v1;
namespace version = ::containerd::services::version::v1;

// containerd's own names for what an Any holds (no type.googleapis.com/).
constexpr char kSpecType[] =
    "types.containerd.io/opencontainers/runtime-spec/1/Spec";
constexpr char kRuntime[] = "io.containerd.runc.v2";

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

}  // namespace

struct Client::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::string ns;
  std::unique_ptr<version::Version::Stub> version;
  std::unique_ptr<containers::Containers::Stub> containers;
  std::unique_ptr<tasks::Tasks::Stub> tasks;

  // A call's context: in the namespace, within `timeout`.
  std::unique_ptr<grpc::ClientContext> Context(
      std::chrono::milliseconds timeout = std::chrono::seconds(30)) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("containerd-namespace", ns);
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    return ctx;
  }
};

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

absl::Status Client::Create(const ContainerSpec& spec) {
  {
    containers::CreateContainerRequest req;
    auto* c = req.mutable_container();
    c->set_id(spec.id);
    c->mutable_runtime()->set_name(kRuntime);
    c->mutable_spec()->set_type_url(kSpecType);
    c->mutable_spec()->set_value(OciSpecJson(spec, impl_->ns));
    (*c->mutable_labels())["silt.function-instance"] = "true";
    containers::CreateContainerResponse res;
    auto ctx = impl_->Context();
    if (auto s = FromGrpc(impl_->containers->Create(ctx.get(), req, &res),
                          absl::StrCat("cannot create container ", spec.id));
        !s.ok())
      return s;
  }
  tasks::CreateTaskRequest req;
  req.set_container_id(spec.id);
  auto* root = req.add_rootfs();
  root->set_type("bind");
  root->set_source(spec.rootfs);
  root->add_options("rbind");
  root->add_options(spec.read_only_root ? "ro" : "rw");
  if (!spec.log_path.empty()) {
    req.set_stdout("file://" + spec.log_path);
    req.set_stderr("file://" + spec.log_path);
  }
  tasks::CreateTaskResponse res;
  auto ctx = impl_->Context();
  absl::Status s = FromGrpc(impl_->tasks->Create(ctx.get(), req, &res),
                            absl::StrCat("cannot create task ", spec.id));
  if (!s.ok()) {
    // No container without its task.
    containers::DeleteContainerRequest del;
    del.set_id(spec.id);
    google::protobuf::Empty empty;
    auto dctx = impl_->Context();
    impl_->containers->Delete(dctx.get(), del, &empty);
  }
  return s;
}

absl::Status Client::Start(const std::string& id) {
  tasks::StartRequest req;
  req.set_container_id(id);
  tasks::StartResponse res;
  auto ctx = impl_->Context();
  return FromGrpc(impl_->tasks->Start(ctx.get(), req, &res),
                  absl::StrCat("cannot start task ", id));
}

absl::StatusOr<uint32_t> Client::Wait(const std::string& id,
                                      std::chrono::milliseconds timeout) {
  tasks::WaitRequest req;
  req.set_container_id(id);
  tasks::WaitResponse res;
  auto ctx = impl_->Context(timeout);
  if (auto s = FromGrpc(impl_->tasks->Wait(ctx.get(), req, &res),
                        absl::StrCat("waiting for task ", id));
      !s.ok())
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

absl::Status Client::Delete(const std::string& id) {
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
      if (auto w = Wait(id, std::chrono::seconds(10)); !w.ok())
        return w.status();
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
  if (s.error_code() == grpc::StatusCode::NOT_FOUND && found)
    return absl::OkStatus();
  return FromGrpc(s, absl::StrCat("cannot delete container ", id));
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
