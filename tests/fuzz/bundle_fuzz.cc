// Bundle archives and manifests as pushed to the gateway and unpacked by
// invokers: a value or an error, never a crash, and every path a bundle
// yields stays inside it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "proclets/bundle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)silt::proclets::ParseManifest(bytes);
  (void)silt::proclets::BundleDigestOf(bytes);
  (void)silt::proclets::ReadBundleManifest(bytes);
  auto files = silt::proclets::ReadBundle(bytes);
  if (!files.ok()) return 0;
  for (const auto& f : *files) {
    if (f.path.empty() || f.path[0] == '/' || f.path == ".." ||
        absl::StartsWith(f.path, "../") || absl::StrContains(f.path, "/../") ||
        absl::EndsWith(f.path, "/.."))
      abort();  // ReadBundle promised to validate every path
  }
  return 0;
}
