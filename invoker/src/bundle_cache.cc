#include "bundle_cache.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "random_id.h"

namespace silt::invoker {

BundleCache::BundleCache(std::string dir, Fetch fetch)
    : dir_(std::move(dir)), fetch_(std::move(fetch)) {}

absl::StatusOr<std::shared_ptr<const Bundle>> BundleCache::Ensure(
    const std::string& digest) {
  std::shared_ptr<absl::Mutex> fetching;
  {
    absl::MutexLock l(&mu_);
    if (auto it = bundles_.find(digest); it != bundles_.end())
      return it->second;
    auto& m = fetching_[digest];
    if (!m) m = std::make_shared<absl::Mutex>();
    fetching = m;
  }
  absl::MutexLock one_fetch(fetching.get());
  {
    absl::MutexLock l(&mu_);
    if (auto it = bundles_.find(digest); it != bundles_.end())
      return it->second;
  }
  auto b = Load(digest);
  if (!b.ok()) return b.status();
  absl::MutexLock l(&mu_);
  bundles_[digest] = *b;
  return b;
}

absl::StatusOr<std::shared_ptr<const Bundle>> BundleCache::Load(
    const std::string& digest) {
  if (digest.rfind("sha256:", 0) != 0 || digest.size() != 7 + 64 ||
      digest.find_first_not_of("0123456789abcdef", 7) != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("not a bundle digest: ", digest));
  std::string dir = absl::StrCat(dir_, "/", digest.substr(7));
  if (!std::filesystem::exists(dir + "/manifest.json")) {
    auto tar = fetch_(digest);
    if (!tar.ok()) return tar.status();
    if (proclets::Sha256Digest(*tar) != digest)
      return absl::DataLossError(
          absl::StrCat("bundle ", digest, " arrived corrupted"));
    // Unpacked aside, then renamed into place: a bundle directory is whole
    // or absent, also after a crash.
    std::string tmp = absl::StrCat(dir, ".tmp-", RandomId(8));
    std::filesystem::create_directories(tmp);
    if (auto s = proclets::UnpackBundle(*tar, tmp); !s.ok()) {
      std::filesystem::remove_all(tmp);
      return s;
    }
    std::error_code ec;
    std::filesystem::rename(tmp, dir, ec);
    if (ec) std::filesystem::remove_all(tmp);  // another process won the race
  }
  std::ifstream in(dir + "/manifest.json");
  std::stringstream ss;
  ss << in.rdbuf();
  auto manifest = proclets::ParseManifest(ss.str());
  if (!manifest.ok()) return manifest.status();
  return std::make_shared<const Bundle>(Bundle{dir, *std::move(manifest)});
}

}  // namespace silt::invoker
