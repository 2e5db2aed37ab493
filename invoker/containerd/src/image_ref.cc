#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "containerd/containerd.h"

namespace silt::containerd {
namespace {

bool ValidChars(const std::string& s) {
  for (char c : s)
    if (!(absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_' ||
          c == '/' || c == ':' || c == '@'))
      return false;
  return true;
}

}  // namespace

absl::StatusOr<std::string> NormalizeImageName(const std::string& ref) {
  if (ref.empty() || ref.size() > 512 || !ValidChars(ref))
    return absl::InvalidArgumentError(
        absl::StrCat("not an image reference: \"", ref,
                     "\" (expected [DOMAIN/]PATH[:TAG][@sha256:DIGEST])"));
  std::string name = ref, digest;
  if (size_t at = name.find('@'); at != std::string::npos) {
    digest = name.substr(at);
    name.resize(at);
    if (!absl::StartsWith(digest, "@sha256:") || digest.size() != 8 + 64)
      return absl::InvalidArgumentError(
          absl::StrCat("not an image reference: \"", ref,
                       "\" (a digest is sha256:<64 hex>)"));
  }
  // The tag is after the last ':' that follows the last '/'.
  size_t slash = name.rfind('/');
  size_t colon = name.rfind(':');
  std::string tag;
  if (colon != std::string::npos &&
      (slash == std::string::npos || colon > slash)) {
    tag = name.substr(colon + 1);
    name.resize(colon);
    if (tag.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("not an image reference: \"", ref, "\" (empty tag)"));
  }
  if (name.empty() || name.front() == '/' || name.back() == '/' ||
      absl::StrContains(name, "//"))
    return absl::InvalidArgumentError(
        absl::StrCat("not an image reference: \"", ref, "\""));
  // A first component with a '.' or ':', or "localhost", is a domain.
  size_t first = name.find('/');
  std::string head = name.substr(0, first);
  bool domain = first != std::string::npos &&
                (absl::StrContains(head, '.') || absl::StrContains(head, ':') ||
                 head == "localhost");
  if (!domain) {
    name = first == std::string::npos ? "docker.io/library/" + name
                                      : "docker.io/" + name;
  }
  // Paths are lower case (domains may not be, but are compared as given).
  std::string path = name.substr(name.find('/'));
  if (path != absl::AsciiStrToLower(path))
    return absl::InvalidArgumentError(
        absl::StrCat("not an image reference: \"", ref,
                     "\" (repository names are lower case)"));
  if (tag.empty() && digest.empty()) tag = "latest";
  return absl::StrCat(name, tag.empty() ? "" : ":", tag, digest);
}

}  // namespace silt::containerd
