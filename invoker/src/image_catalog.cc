#include "image_catalog.h"

#include <unistd.h>

#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "random_id.h"

namespace silt::invoker {

ImageCatalog::ImageCatalog(std::string images_dir, std::string working_sets_dir)
    : dir_(std::move(images_dir)),
      working_sets_dir_(std::move(working_sets_dir)) {}

void ImageCatalog::Load() {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  std::map<std::string, snapshot::Manifest> found;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
    std::string name = e.path().filename().string();
    if (absl::StartsWith(name, ".")) {  // left aside by a crash
      std::filesystem::remove_all(e.path(), ec);
      continue;
    }
    auto m = snapshot::ReadManifest(e.path().string());
    if (!m.ok() || m->id != name || m->kernel != snapshot::KernelRelease()) {
      std::filesystem::remove_all(e.path(), ec);
      continue;
    }
    found[name] = *std::move(m);
  }
  for (const auto& e :
       std::filesystem::directory_iterator(working_sets_dir_, ec))
    if (!found.contains(e.path().filename().string()))
      std::filesystem::remove(e.path(), ec);
  absl::MutexLock l(&mu_);
  images_ = std::move(found);
}

std::string ImageCatalog::Dir(const std::string& id) const {
  return absl::StrCat(dir_, "/", id);
}

std::string ImageCatalog::Aside(const std::string& what,
                                const std::string& id) const {
  return absl::StrCat(dir_, "/.", what, "-", id, "-", RandomId(8));
}

bool ImageCatalog::Has(const std::string& id) const {
  absl::MutexLock l(&mu_);
  return images_.contains(id);
}

uint64_t ImageCatalog::Bytes(const std::string& id) const {
  absl::MutexLock l(&mu_);
  auto it = images_.find(id);
  return it != images_.end() ? it->second.bytes : 0;
}

std::vector<snapshot::Manifest> ImageCatalog::List() const {
  absl::MutexLock l(&mu_);
  std::vector<snapshot::Manifest> out;
  out.reserve(images_.size());
  for (const auto& [id, m] : images_) out.push_back(m);
  return out;
}

void ImageCatalog::Add(const snapshot::Manifest& m) {
  absl::MutexLock l(&mu_);
  images_[m.id] = m;
}

void ImageCatalog::Forget(const std::string& id) {
  {
    absl::MutexLock l(&mu_);
    images_.erase(id);
    plans_.erase(id);
    no_fast_.erase(id);
    working_sets_.erase(id);
  }
  unlink(WorkingSetPath(id).c_str());
}

std::shared_ptr<absl::Mutex> ImageCatalog::FetchLock(const std::string& id) {
  absl::MutexLock l(&mu_);
  auto& m = fetch_locks_[id];
  if (!m) m = std::make_shared<absl::Mutex>();
  return m;
}

absl::StatusOr<std::shared_ptr<const snapshot::FastPlan>> ImageCatalog::Plan(
    const std::string& id) {
  {
    absl::MutexLock l(&mu_);
    if (no_fast_.contains(id))
      return absl::UnimplementedError(
          "not restorable without CRIU (seen before)");
    if (auto it = plans_.find(id); it != plans_.end()) return it->second;
  }
  auto plan = snapshot::BuildRestorePlan(Dir(id));
  absl::MutexLock l(&mu_);
  if (!plan.ok()) {
    no_fast_.insert(id);
    return plan.status();
  }
  auto p = std::make_shared<const snapshot::FastPlan>(*std::move(plan));
  plans_[id] = p;
  return p;
}

void ImageCatalog::RefuseFast(const std::string& id) {
  absl::MutexLock l(&mu_);
  no_fast_.insert(id);
  plans_.erase(id);
}

bool ImageCatalog::FastRefused(const std::string& id) const {
  absl::MutexLock l(&mu_);
  return no_fast_.contains(id);
}

std::string ImageCatalog::WorkingSetPath(const std::string& id) const {
  return absl::StrCat(working_sets_dir_, "/", id);
}

std::shared_ptr<const ImageCatalog::Ranges> ImageCatalog::WorkingSet(
    const std::string& id) {
  {
    absl::MutexLock l(&mu_);
    if (auto it = working_sets_.find(id); it != working_sets_.end())
      return it->second;
  }
  auto ws = snapshot::LoadWorkingSet(WorkingSetPath(id));
  std::shared_ptr<const Ranges> p;
  if (ws.ok()) p = std::make_shared<const Ranges>(*std::move(ws));
  absl::MutexLock l(&mu_);
  return working_sets_.try_emplace(id, p).first->second;
}

absl::Status ImageCatalog::SaveWorkingSet(const std::string& id,
                                          Ranges ranges) {
  std::error_code ec;
  std::filesystem::create_directories(working_sets_dir_, ec);
  if (absl::Status s = snapshot::SaveWorkingSet(WorkingSetPath(id), ranges);
      !s.ok())
    return s;
  absl::MutexLock l(&mu_);
  working_sets_[id] = std::make_shared<const Ranges>(std::move(ranges));
  return absl::OkStatus();
}

}  // namespace silt::invoker
