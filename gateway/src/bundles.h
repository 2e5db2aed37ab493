// The gateway's bundle store: content-addressed function bundles, files under
// DATA_DIR/bundles and their manifests in the store's bundles table.
#ifndef SILT_GATEWAY_BUNDLES_H_
#define SILT_GATEWAY_BUNDLES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proclets/bundle.h"
#include "store/store.h"

namespace silt::gateway {

struct BundleInfo {
  std::string digest;
  uint64_t size = 0;
  proclets::BundleManifest manifest;
};

class BundleStore {
 public:
  BundleStore(store::Store* store, std::string dir);

  // Verifies `bytes` against `expected_digest` (when given) and the bundle
  // format, then stores it durably. Returns the info and whether it was new.
  absl::StatusOr<std::pair<BundleInfo, bool>> Put(
      absl::string_view bytes, absl::string_view expected_digest);
  absl::StatusOr<BundleInfo> Get(absl::string_view digest) const;
  absl::StatusOr<std::vector<BundleInfo>> List() const;
  std::string PathOf(absl::string_view digest) const;

 private:
  store::Store* store_;
  std::string dir_;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_BUNDLES_H_
