// Image archives (OCI image layouts and `docker save` output, plain or
// gzipped) read without containerd: what a gateway checks an upload with
// before any node imports it. No gRPC here.
#ifndef SILT_CONTAINERD_ARCHIVE_H_
#define SILT_CONTAINERD_ARCHIVE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace silt::containerd {

// A reference as docker and containerd normalize it: "hello" is
// "docker.io/library/hello:latest", "me/x:1" "docker.io/me/x:1",
// "ghcr.io/a/b" "ghcr.io/a/b:latest"; a digest ("x@sha256:…") is kept.
// InvalidArgument for what is no reference.
absl::StatusOr<std::string> NormalizeImageName(const std::string& ref);

// The images an archive names (normalized, as Client::Import names them).
// InvalidArgument (saying what is wrong) for a file that is no image archive
// or names no image; NotFound when there is no such file.
absl::StatusOr<std::vector<std::string>> ArchiveImageNames(
    const std::string& path);

}  // namespace silt::containerd

#endif  // SILT_CONTAINERD_ARCHIVE_H_
