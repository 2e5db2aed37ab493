#include "snapshot/criu.h"

#include <criu/criu.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace silt::snapshot {

std::string CriuBinary() {
  const char* env = std::getenv("SILT_CRIU");
  return env != nullptr && *env != '\0' ? env : SILT_CRIU_BINARY;
}

absl::StatusOr<int> CriuVersion() {
  // libcriu keeps its options in a global: one caller at a time.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::string binary = CriuBinary();
  if (criu_init_opts() < 0) return absl::InternalError("criu_init_opts failed");
  criu_set_service_binary(binary.c_str());
  int v = criu_get_version();
  if (v < 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot ask ", binary, " for its version: ", std::strerror(-v)));
  }
  if (v < 40100) {
    return absl::FailedPreconditionError(absl::StrCat(
        binary, " is CRIU ", v / 10000, ".", v / 100 % 100, ".", v % 100,
        ": Silt needs 4.1 or newer (run deploy/setup.sh)"));
  }
  return v;
}

}  // namespace silt::snapshot
