// The function bundles unpacked on this node (DATA_DIR/bundles/<hex>), by
// digest: fetched from the gateway the first time a function version needs
// one, checked against its digest, unpacked, then kept for every instance of
// every function that names it.
//
// Thread safety: thread-safe. Concurrent Ensure calls for one digest fetch
// it once (the others wait for that fetch); different digests do not wait
// for each other.
#ifndef SILT_INVOKER_BUNDLE_CACHE_H_
#define SILT_INVOKER_BUNDLE_CACHE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proclets/bundle.h"

namespace silt::invoker {

struct Bundle {
  std::string dir;  // where it is unpacked
  proclets::BundleManifest manifest;
};

class BundleCache {
 public:
  // The bundle's archive (a tar), fetched from its owner. Unavailable when it
  // cannot be had now.
  using Fetch =
      std::function<absl::StatusOr<std::string>(const std::string& digest)>;

  // Bundles live under `dir` (created by the caller); one missing there is
  // fetched with `fetch`.
  BundleCache(std::string dir, Fetch fetch);

  // The bundle `digest` ("sha256:<hex>"), unpacked here: found, or fetched,
  // checked and unpacked first. DataLoss when what arrived does not match
  // the digest; InvalidArgument for a bundle that does not unpack or whose
  // manifest is malformed; the fetch's error otherwise.
  absl::StatusOr<std::shared_ptr<const Bundle>> Ensure(
      const std::string& digest);

 private:
  absl::StatusOr<std::shared_ptr<const Bundle>> Load(const std::string& digest);

  const std::string dir_;
  const Fetch fetch_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const Bundle>> bundles_
      ABSL_GUARDED_BY(mu_);
  // One per digest being (or once) fetched: held for the fetch.
  std::map<std::string, std::shared_ptr<absl::Mutex>> fetching_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_BUNDLE_CACHE_H_
