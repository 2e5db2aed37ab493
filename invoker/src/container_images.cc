#include "container_images.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"

namespace silt::invoker {
namespace {

// The record label that marks an image as ours and names its archive.
constexpr char kArchiveLabel[] = "silt.archive";

}  // namespace

ContainerImages::ContainerImages(Options options)
    : options_(std::move(options)), thread_([this] { Run(); }) {}

ContainerImages::~ContainerImages() {
  StopImports();
  absl::MutexLock l(&client_mu_);
  runtime_.reset();
  client_.reset();
  daemon_.reset();  // stops a containerd of our own
}

void ContainerImages::StopImports() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ContainerImages::Want(const control::ImageSet& set) {
  absl::MutexLock l(&mu_);
  wanted_ = set;
}

std::optional<control::ImageReport> ContainerImages::TakeReport() {
  absl::MutexLock l(&mu_);
  if (!report_pending_) return std::nullopt;
  report_pending_ = false;
  return report_;
}

void ContainerImages::ResendReport() {
  absl::MutexLock l(&mu_);
  report_pending_ = true;
}

void ContainerImages::Run() {
  for (;;) {
    control::ImageSet set;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](ContainerImages* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || self->wanted_.has_value();
          },
          this));
      if (stopping_) break;
      set = *std::move(wanted_);
      wanted_.reset();
    }
    Reconcile(set);
  }
}

absl::StatusOr<std::shared_ptr<ContainerRuntime>> ContainerImages::Runtime() {
  auto client = EnsureClient();
  if (!client.ok()) return client.status();
  absl::MutexLock l(&client_mu_);
  return RuntimeLocked();
}

absl::StatusOr<std::shared_ptr<ContainerRuntime>>
ContainerImages::RuntimeLocked() {
  if (runtime_ == nullptr && client_ != nullptr) {
    containerd::CniOptions o;
    o.state_dir = options_.dir + "/cni";
    auto cni = containerd::Cni::Create(o);
    if (!cni.ok()) return cni.status();
    runtime_ = std::make_shared<ContainerRuntime>(
        client_, std::shared_ptr<containerd::Cni>(*std::move(cni)));
  }
  if (runtime_ == nullptr) return absl::UnavailableError("no containerd");
  return runtime_;
}

absl::StatusOr<std::shared_ptr<containerd::Client>>
ContainerImages::EnsureClient() {
  absl::MutexLock l(&client_mu_);
  if (options_.containerd_socket.empty() && daemon_ && !daemon_->Alive()) {
    fprintf(stderr, "silt-invoker: containerd died; starting it again\n");
    runtime_.reset();
    client_.reset();
    daemon_.reset();
  }
  if (client_) return client_;
  std::string socket = options_.containerd_socket;
  if (socket.empty()) {
    auto d = containerd::Daemon::Start(options_.dir);
    if (!d.ok()) return d.status();
    daemon_ = *std::move(d);
    socket = daemon_->socket();
  }
  auto c = containerd::Client::Connect(socket, options_.ns);
  if (!c.ok()) return c.status();
  client_ = *std::move(c);
  if (!orphans_removed_) {
    // No instance outlives the invoker, but containers do (their shims):
    // those an invoker that died left go, with their networks.
    orphans_removed_ = true;
    if (auto runtime = RuntimeLocked(); runtime.ok())
      for (const std::string& id : (*runtime)->RemoveOthers())
        fprintf(stderr,
                "silt-invoker: removed container %s (left by a previous "
                "run)\n",
                id.c_str());
  }
  return client_;
}

void ContainerImages::Reconcile(const control::ImageSet& set) {
  control::ImageReport report;
  std::map<std::string, std::string> wanted;  // name → archive
  for (const auto& w : set.images()) wanted[w.name()] = w.archive();
  auto fail_all = [&](const absl::Status& why) {
    std::set<std::string> archives;
    for (const auto& [name, archive] : wanted) archives.insert(archive);
    for (const std::string& archive : archives) {
      auto* f = report.add_failures();
      f->set_archive(archive);
      f->set_kind(control::IMAGE_FAILURE_NODE);
      f->set_message(std::string(why.message()));
    }
  };
  // containerd is started for the first image, or when one of ours ran
  // here before (its images and leftovers are there).
  std::error_code ec;
  bool needed = !wanted.empty() || !options_.containerd_socket.empty() ||
                std::filesystem::exists(options_.dir + "/root", ec);
  auto client = needed ? EnsureClient()
                       : absl::StatusOr<std::shared_ptr<containerd::Client>>(
                             absl::FailedPreconditionError("not needed"));
  if (!client.ok()) {
    // A node without containerd holds no images; with nothing wanted that
    // is no failure.
    if (!wanted.empty()) fail_all(client.status());
  } else {
    std::map<std::string, containerd::Image> have;
    auto list = (*client)->ListImages();
    if (!list.ok()) {
      fail_all(list.status());
    } else {
      for (auto& image : *list) have[image.name] = std::move(image);
      // Each archive that brings a wanted image the node lacks, imported
      // once.
      std::set<std::string> imported;
      for (const auto& [name, archive] : wanted) {
        auto it = have.find(name);
        if ((it != have.end() &&
             it->second.record_labels[kArchiveLabel] == archive) ||
            imported.contains(archive))
          continue;
        imported.insert(archive);
        std::string path =
            absl::StrCat(options_.dir, "/fetch-",
                         archive.substr(archive.find(':') + 1), ".tar");
        std::error_code ec;
        std::filesystem::create_directories(options_.dir, ec);
        absl::Status s = options_.fetch(archive, path);
        absl::StatusOr<std::vector<containerd::Image>> images =
            s.ok() ? (*client)->Import(path, {{kArchiveLabel, archive}})
                   : absl::StatusOr<std::vector<containerd::Image>>(s);
        std::filesystem::remove(path, ec);
        if (!images.ok()) {
          auto* f = report.add_failures();
          f->set_archive(archive);
          f->set_kind(images.status().code() ==
                              absl::StatusCode::kInvalidArgument
                          ? control::IMAGE_FAILURE_BAD_ARCHIVE
                          : control::IMAGE_FAILURE_NODE);
          f->set_message(std::string(images.status().message()));
          fprintf(stderr, "silt-invoker: cannot import image archive %s: %s\n",
                  archive.c_str(),
                  std::string(images.status().message()).c_str());
          continue;
        }
        for (auto& image : *images) {
          if (auto old = have.find(image.name);
              old != have.end() && old->second.digest != image.digest &&
              options_.replaced)
            options_.replaced(image.name);
          have[image.name] = std::move(image);
        }
      }
      // Ours that are no longer wanted go (others' images stay).
      for (auto it = have.begin(); it != have.end();) {
        bool ours = it->second.record_labels.contains(kArchiveLabel);
        if (ours && !wanted.contains(it->first)) {
          if (auto s = (*client)->RemoveImage(it->first); !s.ok())
            fprintf(stderr, "silt-invoker: %s\n",
                    std::string(s.message()).c_str());
          it = have.erase(it);
          continue;
        }
        ++it;
      }
      for (auto& [name, image] : have) {
        auto* i = report.add_images();
        i->set_name(name);
        i->set_digest(image.digest);
        i->set_size(image.size);
        i->set_archive(image.record_labels[kArchiveLabel]);
      }
    }
  }
  {
    absl::MutexLock l(&mu_);
    report_ = std::move(report);
    report_pending_ = true;
  }
  if (options_.changed) options_.changed();
}

}  // namespace silt::invoker
