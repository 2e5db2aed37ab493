// A snapshot's manifest.json as read from disk or from a peer: a manifest or
// an error, never a crash.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "snapshot/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)silt::snapshot::ParseManifest(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
