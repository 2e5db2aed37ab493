// Function bundles: what `silt build` produces and invokers run. A bundle is a
// plain, reproducible ustar archive holding manifest.json plus either a shared
// object exporting the Silt function ABI (kind "native") or the files of an
// executable served in watchdog style (kind "exec"). It is named by the SHA-256
// of its bytes: "sha256:<64 hex>".
#ifndef SILT_PROCLETS_BUNDLE_H_
#define SILT_PROCLETS_BUNDLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::proclets {

struct BundleManifest {
  uint32_t abi = 0;   // SILT_ABI_VERSION of a native bundle
  std::string kind;   // "native" | "exec"
  std::string entry;  // native: the shared object; exec: the command (fprocess)
  std::string mode;   // exec: "classic" (fork per request) | "http"
                      // (long-running server)
  std::string upstream_url;  // exec http: where the server listens
  std::string name;          // function name it was built for
  std::string lang;          // stack.yml lang
};

struct BundleFile {
  std::string path;     // relative path inside the bundle
  std::string content;  // bytes
  uint32_t mode = 0644;
};

std::string ManifestJson(const BundleManifest& m);
absl::StatusOr<BundleManifest> ParseManifest(absl::string_view json);

// Packs manifest.json plus `files` (sorted by path, mtime 0, uid/gid 0: the
// same inputs always give the same bytes and so the same digest).
absl::StatusOr<std::string> PackBundle(const BundleManifest& manifest,
                                       std::vector<BundleFile> files);

// Reads the archive (validating every header and path) and returns its files.
absl::StatusOr<std::vector<BundleFile>> ReadBundle(absl::string_view tar);
absl::StatusOr<BundleManifest> ReadBundleManifest(absl::string_view tar);

// Writes the files of the archive under `dir` (which must exist). Paths that
// are absolute or contain ".." are refused.
absl::Status UnpackBundle(absl::string_view tar, const std::string& dir);

// "sha256:<hex>" of the bytes.
std::string Sha256Digest(absl::string_view bytes);
// The bundle digest an image reference names: "sha256:<hex>" or
// "NAME@sha256:<hex>". NotFound when the reference names no bundle.
absl::StatusOr<std::string> BundleDigestOf(absl::string_view image);
bool IsDigest(absl::string_view s);

}  // namespace silt::proclets

#endif  // SILT_PROCLETS_BUNDLE_H_
