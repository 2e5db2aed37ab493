// How an archive's index names its images (archive.cc), for
// ArchiveImageNames and the importer alike.
#ifndef SILT_CONTAINERD_ARCHIVE_NAMES_H_
#define SILT_CONTAINERD_ARCHIVE_NAMES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace silt::containerd {

inline absl::Status BadArchive(absl::string_view what) {
  return absl::InvalidArgumentError(
      std::string("bad image archive: ").append(what.data(), what.size()));
}

// The normalized name of an entry of an OCI layout's index.json (its
// io.containerd.image.name, or an org.opencontainers.image.ref.name that is
// more than a tag).
absl::StatusOr<std::string> OciEntryName(const nlohmann::json& entry);
// The normalized RepoTags of an entry of `docker save`'s manifest.json.
absl::StatusOr<std::vector<std::string>> DockerEntryNames(
    const nlohmann::json& entry);

}  // namespace silt::containerd

#endif  // SILT_CONTAINERD_ARCHIVE_NAMES_H_
