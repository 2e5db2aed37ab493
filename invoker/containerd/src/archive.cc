#include "containerd/archive.h"

#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "archive_names.h"
#include "tar_reader.h"

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

absl::StatusOr<std::string> OciEntryName(const nlohmann::json& m) {
  std::string name;
  if (m.is_object() && m.contains("annotations") &&
      m["annotations"].is_object()) {
    const nlohmann::json& a = m["annotations"];
    for (const char* key :
         {"io.containerd.image.name", "org.opencontainers.image.ref.name"})
      if (a.contains(key) && a[key].is_string()) {
        std::string v = a[key].get<std::string>();
        // A bare tag ("latest") names no image by itself.
        if (key[0] == 'i' || absl::StrContains(v, '/') ||
            absl::StrContains(v, ':')) {
          name = v;
          break;
        }
      }
  }
  if (name.empty())
    return BadArchive(
        "index.json names no image (annotation io.containerd.image.name, "
        "or org.opencontainers.image.ref.name with a repository)");
  return NormalizeImageName(name);
}

absl::StatusOr<std::vector<std::string>> DockerEntryNames(
    const nlohmann::json& entry) {
  std::vector<std::string> names;
  if (entry.is_object() && entry.contains("RepoTags") &&
      entry["RepoTags"].is_array())
    for (const auto& tag : entry["RepoTags"]) {
      if (!tag.is_string()) continue;
      auto name = NormalizeImageName(tag.get<std::string>());
      if (!name.ok()) return name.status();
      names.push_back(*name);
    }
  if (names.empty())
    return BadArchive(
        "an image of manifest.json has no RepoTags: save it by name");
  return names;
}

absl::StatusOr<std::vector<std::string>> ArchiveImageNames(
    const std::string& path) {
  auto tar = TarReader::Open(path);
  if (!tar.ok()) return tar.status();
  std::map<std::string, std::string> meta;
  TarReader::Entry e;
  for (;;) {
    auto more = (*tar)->Next(&e);
    if (!more.ok()) return more.status();
    if (!*more) break;
    if (!e.regular || (e.name != "index.json" && e.name != "manifest.json"))
      continue;
    if (e.size > (4 << 20))
      return BadArchive(absl::StrCat(e.name, " is ", e.size, " bytes"));
    std::string data(e.size, '\0');
    auto n = (*tar)->Read(data.data(), data.size());
    if (!n.ok()) return n.status();
    meta[e.name] = std::move(data);
  }
  std::vector<std::string> names;
  if (auto it = meta.find("manifest.json"); it != meta.end()) {
    auto list = nlohmann::json::parse(it->second, nullptr, false);
    if (!list.is_array() || list.empty())
      return BadArchive("manifest.json lists no images");
    for (const auto& entry : list) {
      auto n = DockerEntryNames(entry);
      if (!n.ok()) return n.status();
      names.insert(names.end(), n->begin(), n->end());
    }
    return names;
  }
  auto it = meta.find("index.json");
  if (it == meta.end())
    return BadArchive(
        "neither an OCI image layout (index.json) nor a `docker save` "
        "archive (manifest.json)");
  auto index = nlohmann::json::parse(it->second, nullptr, false);
  if (!index.is_object() || !index.contains("manifests") ||
      !index["manifests"].is_array() || index["manifests"].empty())
    return BadArchive("index.json lists no manifests");
  for (const auto& m : index["manifests"]) {
    auto n = OciEntryName(m);
    if (!n.ok()) return n.status();
    names.push_back(*n);
  }
  return names;
}

}  // namespace silt::containerd
