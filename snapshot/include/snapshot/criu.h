// The CRIU engine Silt checkpoints and restores with. Silt always names its
// CRIU 4.1+ binary explicitly: Debian's CRIU 3.17, if installed, fails on
// current kernels.
#ifndef SILT_SNAPSHOT_CRIU_H_
#define SILT_SNAPSHOT_CRIU_H_

#include <string>

#include "absl/status/statusor.h"

namespace silt::snapshot {

// The CRIU binary Silt uses: $SILT_CRIU if set, else the one found at build
// time.
std::string CriuBinary();

// CRIU's version as MAJOR*10000 + MINOR*100 + SUBLEVEL (40101 for 4.1.1), asked
// of the binary through libcriu. FailedPrecondition when it is older than 4.1.
absl::StatusOr<int> CriuVersion();

}  // namespace silt::snapshot

#endif  // SILT_SNAPSHOT_CRIU_H_
