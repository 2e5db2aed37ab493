#include "bundles.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "proclets/json_integer.h"

namespace silt::gateway {
namespace {

std::string Encode(const BundleInfo& b) {
  nlohmann::json j = {
      {"digest", b.digest},
      {"size", b.size},
      {"manifest", nlohmann::json::parse(proclets::ManifestJson(b.manifest))}};
  return j.dump();
}

absl::StatusOr<BundleInfo> Decode(absl::string_view text) {
  auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::DataLossError("corrupt bundle record");
  BundleInfo b;
  std::string manifest;
  try {
    b.digest = j.value("digest", "");
    b.size = proclets::JsonIntegerOr(j, "size", uint64_t{0});
    manifest = j.value("manifest", nlohmann::json::object()).dump();
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("corrupt bundle record: ", e.what()));
  }
  auto m = proclets::ParseManifest(manifest);
  if (!m.ok()) return m.status();
  b.manifest = *m;
  return b;
}

}  // namespace

BundleStore::BundleStore(store::Store* store, std::string dir)
    : store_(store), dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
}

std::string BundleStore::PathOf(absl::string_view digest) const {
  return absl::StrCat(dir_, "/", digest.substr(7), ".tar");
}

absl::StatusOr<std::pair<BundleInfo, bool>> BundleStore::Put(
    absl::string_view bytes, absl::string_view expected) {
  std::string digest = proclets::Sha256Digest(bytes);
  if (!expected.empty() && expected != digest) {
    return absl::InvalidArgumentError(
        absl::StrCat("bundle digest mismatch: the upload hashes to ", digest,
                     ", not ", expected, " (corrupted in transit?)"));
  }
  auto manifest = proclets::ReadBundleManifest(bytes);
  if (!manifest.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a Silt bundle: ", manifest.status().message()));
  }
  if (auto existing = Get(digest); existing.ok())
    return std::make_pair(*existing, false);
  std::string path = PathOf(digest);
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return absl::InternalError(
        absl::StrCat("create ", tmp, ": ", strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("write ", tmp, ": ", strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0)
    return absl::InternalError(
        absl::StrCat("store ", path, ": ", strerror(errno)));
  BundleInfo info{digest, bytes.size(), *manifest};
  store::WriteBatch batch;
  batch.Put(store::Table::kBundles, digest, Encode(info));
  if (auto s = store_->Write(batch); !s.ok()) return s;
  return std::make_pair(info, true);
}

absl::StatusOr<BundleInfo> BundleStore::Get(absl::string_view digest) const {
  auto v = store_->Get(store::Table::kBundles, digest);
  if (!v.ok()) {
    if (absl::IsNotFound(v.status()))
      return absl::NotFoundError(absl::StrCat("bundle ", digest, " not found"));
    return v.status();
  }
  return Decode(*v);
}

absl::StatusOr<std::vector<BundleInfo>> BundleStore::List() const {
  auto rows = store_->Scan(store::Table::kBundles, "");
  if (!rows.ok()) return rows.status();
  std::vector<BundleInfo> out;
  for (const auto& [k, v] : *rows) {
    auto b = Decode(v);
    if (!b.ok()) return b.status();
    out.push_back(*std::move(b));
  }
  return out;
}

}  // namespace silt::gateway
