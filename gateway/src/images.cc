#include "images.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "containerd/archive.h"

namespace silt::gateway {
namespace {

constexpr char kPrefix[] = "images/";

std::string FileOf(const std::string& dir, const std::string& archive) {
  // "sha256:<hex>" → DIR/<hex>.tar
  return absl::StrCat(dir, "/", archive.substr(archive.find(':') + 1), ".tar");
}

}  // namespace

ImageArchives::ImageArchives(store::Store* store, std::string dir)
    : store_(store), dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  // Uploads a gateway that stopped was taking.
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec))
    if (e.path().extension() == ".part") std::filesystem::remove(e.path(), ec);
  absl::MutexLock l(&mu_);
  if (auto s = LoadLocked(); !s.ok())
    fprintf(stderr, "silt-gateway: images: %s\n",
            std::string(s.message()).c_str());
}

absl::Status ImageArchives::LoadLocked() {
  auto rows = store_->Scan(store::Table::kMeta, kPrefix);
  if (!rows.ok()) return rows.status();
  for (const auto& [key, value] : *rows) {
    auto j = nlohmann::json::parse(value, nullptr, false);
    if (!j.is_object() || !j.contains("archive") || !j["archive"].is_string())
      continue;
    Record r;
    r.name = key.substr(sizeof(kPrefix) - 1);
    r.archive = j["archive"].get<std::string>();
    if (j.contains("size") && j["size"].is_number_unsigned())
      r.archive_size = j["size"].get<uint64_t>();
    if (j.contains("created") && j["created"].is_number_integer())
      r.created_unix = j["created"].get<int64_t>();
    records_[r.name] = r;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ImageArchives::Record>> ImageArchives::Add(
    const std::string& path, const std::string& digest, uint64_t size) {
  auto names = containerd::ArchiveImageNames(path);
  if (!names.ok()) return names.status();
  std::error_code ec;
  std::filesystem::rename(path, FileOf(dir_, digest), ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot keep the archive: ", ec.message()));
  std::vector<Record> added;
  store::WriteBatch batch;
  int64_t now = absl::ToUnixSeconds(absl::Now());
  for (const std::string& name : *names) {
    Record r{name, digest, size, now};
    nlohmann::json j = {{"archive", digest}, {"size", size}, {"created", now}};
    batch.Put(store::Table::kMeta, kPrefix + name, j.dump());
    added.push_back(r);
  }
  if (auto s = store_->Write(batch); !s.ok()) return s;
  absl::MutexLock l(&mu_);
  for (const Record& r : added) {
    records_[r.name] = r;
    // A node's failure to import an earlier upload of it is history.
    for (auto& [node, state] : nodes_) state.failures.erase(digest);
  }
  DropUnusedArchivesLocked();
  return added;
}

std::string ImageArchives::UploadPath() const {
  static std::atomic<uint64_t> next{0};
  return absl::StrCat(dir_, "/upload-", getpid(), "-", next++, ".part");
}

absl::Status ImageArchives::Remove(const std::string& name) {
  auto normalized = containerd::NormalizeImageName(name);
  if (!normalized.ok()) return normalized.status();
  absl::MutexLock l(&mu_);
  if (!records_.contains(*normalized))
    return absl::NotFoundError(absl::StrCat("no image ", *normalized));
  store::WriteBatch batch;
  batch.Delete(store::Table::kMeta, kPrefix + *normalized);
  if (auto s = store_->Write(batch); !s.ok()) return s;
  records_.erase(*normalized);
  DropUnusedArchivesLocked();
  return absl::OkStatus();
}

void ImageArchives::RemoveArchive(const std::string& archive) {
  absl::MutexLock l(&mu_);
  RemoveArchiveLocked(archive);
}

void ImageArchives::RemoveArchiveLocked(const std::string& archive) {
  store::WriteBatch batch;
  for (auto it = records_.begin(); it != records_.end();) {
    if (it->second.archive != archive) {
      ++it;
      continue;
    }
    batch.Delete(store::Table::kMeta, kPrefix + it->first);
    it = records_.erase(it);
  }
  store_->Write(batch).IgnoreError();
  DropUnusedArchivesLocked();
}

void ImageArchives::DropUnusedArchivesLocked() {
  std::set<std::string> used;
  for (const auto& [name, r] : records_) used.insert(FileOf(dir_, r.archive));
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec))
    if (e.path().extension() == ".tar" && !used.contains(e.path().string()))
      std::filesystem::remove(e.path(), ec);
}

std::vector<ImageArchives::Record> ImageArchives::List() const {
  absl::MutexLock l(&mu_);
  std::vector<Record> out;
  for (const auto& [name, r] : records_) out.push_back(r);
  return out;
}

bool ImageArchives::Has(const std::string& name) const {
  absl::MutexLock l(&mu_);
  return records_.contains(name);
}

std::string ImageArchives::PathOf(const std::string& archive) const {
  absl::MutexLock l(&mu_);
  for (const auto& [name, r] : records_)
    if (r.archive == archive) return FileOf(dir_, archive);
  return "";
}

bool ImageArchives::Report(const std::string& node,
                           std::map<std::string, NodeImage> images,
                           std::map<std::string, Failure> failures) {
  absl::MutexLock l(&mu_);
  bool dropped = false;
  for (const auto& [archive, f] : failures) {
    if (!f.bad_archive) continue;
    bool listed = false;
    for (const auto& [name, r] : records_) listed |= r.archive == archive;
    if (!listed) continue;
    fprintf(stderr, "silt-gateway: image archive %s dropped: %s\n",
            archive.c_str(), f.message.c_str());
    RemoveArchiveLocked(archive);
    dropped = true;
  }
  nodes_[node] = {std::move(images), std::move(failures)};
  return dropped;
}

void ImageArchives::NodeGone(const std::string& node) {
  absl::MutexLock l(&mu_);
  nodes_.erase(node);
}

std::map<std::string, ImageArchives::NodeImage> ImageArchives::Holders(
    const std::string& name) const {
  absl::MutexLock l(&mu_);
  std::map<std::string, NodeImage> out;
  for (const auto& [node, state] : nodes_)
    if (auto it = state.images.find(name); it != state.images.end())
      out[node] = it->second;
  return out;
}

bool ImageArchives::SettledLocked(
    const std::string& archive, const std::string& node,
    std::map<std::string, Failure>* failures) const {
  auto n = nodes_.find(node);
  if (n == nodes_.end()) return false;
  if (auto f = n->second.failures.find(archive);
      f != n->second.failures.end()) {
    (*failures)[node] = f->second;
    return true;
  }
  for (const auto& [name, r] : records_) {
    if (r.archive != archive) continue;
    auto held = n->second.images.find(name);
    // (A node that names no archive, an older invoker, is taken at its
    // word that it holds the name.)
    if (held == n->second.images.end() ||
        (held->second.archive != archive && !held->second.archive.empty()))
      return false;
  }
  return true;
}

std::map<std::string, ImageArchives::Failure> ImageArchives::Await(
    const std::string& archive, const std::set<std::string>& nodes,
    std::chrono::milliseconds timeout) {
  std::map<std::string, Failure> failures;
  auto settled = [&] {
    failures.clear();
    for (const std::string& node : nodes)
      if (!SettledLocked(archive, node, &failures)) return false;
    return true;
  };
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&settled), absl::FromChrono(timeout));
  return failures;
}

}  // namespace silt::gateway
