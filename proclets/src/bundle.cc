#include "proclets/bundle.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "proclets/json_integer.h"

namespace silt::proclets {
namespace {

constexpr size_t kBlock = 512;
constexpr char kManifest[] = "manifest.json";

void PutOctal(char* field, size_t width, uint64_t v) {
  std::string s = absl::StrFormat("%0*o", static_cast<int>(width - 1), v);
  memcpy(field, s.data(), width - 1);
  field[width - 1] = '\0';
}

absl::Status CheckPath(absl::string_view path) {
  if (path.empty() || path.front() == '/' || path.size() > 99) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bundle path \"", path, "\" must be relative and under 100 bytes"));
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == ".." || part.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("bundle path \"", path, "\" is not allowed"));
    }
  }
  return absl::OkStatus();
}

std::string Header(const std::string& path, uint64_t size, uint32_t mode) {
  std::string h(kBlock, '\0');
  memcpy(h.data(), path.data(), path.size());
  PutOctal(&h[100], 8, mode);
  PutOctal(&h[108], 8, 0);
  PutOctal(&h[116], 8, 0);
  PutOctal(&h[124], 12, size);
  PutOctal(&h[136], 12, 0);
  h[156] = '0';
  memcpy(&h[257], "ustar", 6);
  memcpy(&h[263], "00", 2);
  memset(&h[148], ' ', 8);
  uint64_t sum = 0;
  for (unsigned char c : h) sum += c;
  PutOctal(&h[148], 7, sum);
  h[155] = ' ';
  return h;
}

absl::StatusOr<uint64_t> ParseOctal(absl::string_view f) {
  std::string s(f.substr(0, f.find('\0')));
  s = std::string(absl::StripAsciiWhitespace(s));
  if (s.empty()) return 0;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '7')
      return absl::DataLossError("bad octal field in bundle header");
    v = v * 8 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

}  // namespace

std::string ManifestJson(const BundleManifest& m) {
  nlohmann::ordered_json j;
  j["kind"] = m.kind;
  if (m.abi != 0) j["abi"] = m.abi;
  j["entry"] = m.entry;
  if (!m.mode.empty()) j["mode"] = m.mode;
  if (!m.upstream_url.empty()) j["upstream_url"] = m.upstream_url;
  if (!m.name.empty()) j["name"] = m.name;
  if (!m.lang.empty()) j["lang"] = m.lang;
  return j.dump(2) + "\n";
}

absl::StatusOr<BundleManifest> ParseManifest(absl::string_view text) {
  auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(
        "bundle manifest.json is not a JSON object");
  BundleManifest m;
  try {
    m.kind = j.value("kind", "");
    m.abi = JsonIntegerOr(j, "abi", 0u);
    m.entry = j.value("entry", "");
    m.mode = j.value("mode", "");
    m.upstream_url = j.value("upstream_url", "");
    m.name = j.value("name", "");
    m.lang = j.value("lang", "");
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("bundle manifest.json: ", e.what()));
  }
  if (m.kind != "native" && m.kind != "exec")
    return absl::InvalidArgumentError(absl::StrCat(
        "bundle manifest kind \"", m.kind, "\" must be native or exec"));
  if (m.entry.empty())
    return absl::InvalidArgumentError("bundle manifest has no entry");
  if (m.kind == "exec" && m.mode != "classic" && m.mode != "http")
    return absl::InvalidArgumentError(absl::StrCat(
        "exec bundle mode \"", m.mode, "\" must be classic or http"));
  return m;
}

absl::StatusOr<std::string> PackBundle(const BundleManifest& manifest,
                                       std::vector<BundleFile> files) {
  files.push_back({kManifest, ManifestJson(manifest), 0644});
  std::sort(
      files.begin(), files.end(),
      [](const BundleFile& a, const BundleFile& b) { return a.path < b.path; });
  std::string out;
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& f = files[i];
    if (auto s = CheckPath(f.path); !s.ok()) return s;
    if (i > 0 && files[i - 1].path == f.path)
      return absl::InvalidArgumentError(
          absl::StrCat("bundle file ", f.path, " given twice"));
    out += Header(f.path, f.content.size(), f.mode);
    out += f.content;
    out.append((kBlock - f.content.size() % kBlock) % kBlock, '\0');
  }
  out.append(2 * kBlock, '\0');
  return out;
}

absl::StatusOr<std::vector<BundleFile>> ReadBundle(absl::string_view tar) {
  std::vector<BundleFile> files;
  size_t off = 0;
  while (true) {
    if (off + kBlock > tar.size())
      return absl::DataLossError("bundle archive is truncated (no end marker)");
    absl::string_view h = tar.substr(off, kBlock);
    if (h.find_first_not_of('\0') == absl::string_view::npos)
      break;  // end of archive
    uint64_t sum = 0;
    for (size_t i = 0; i < kBlock; ++i)
      sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
    auto want = ParseOctal(h.substr(148, 8));
    if (!want.ok() || *want != sum)
      return absl::DataLossError(
          absl::StrCat("bundle header checksum mismatch at offset ", off));
    std::string path(h.substr(0, 100).substr(0, h.substr(0, 100).find('\0')));
    auto size = ParseOctal(h.substr(124, 12));
    auto mode = ParseOctal(h.substr(100, 8));
    if (!size.ok() || !mode.ok())
      return absl::DataLossError("bad bundle header");
    char type = h[156];
    off += kBlock;
    if (off + *size > tar.size())
      return absl::DataLossError("bundle archive is truncated");
    if (type == '0' || type == '\0') {
      if (auto s = CheckPath(path); !s.ok()) return s;
      files.push_back({path, std::string(tar.substr(off, *size)),
                       static_cast<uint32_t>(*mode)});
    } else if (type != '5') {
      return absl::InvalidArgumentError(absl::StrCat(
          "bundle entry ", path, " is not a regular file or directory"));
    }
    off += (*size + kBlock - 1) / kBlock * kBlock;
  }
  return files;
}

absl::StatusOr<BundleManifest> ReadBundleManifest(absl::string_view tar) {
  auto files = ReadBundle(tar);
  if (!files.ok()) return files.status();
  for (const auto& f : *files) {
    if (f.path == kManifest) return ParseManifest(f.content);
  }
  return absl::InvalidArgumentError("bundle has no manifest.json");
}

absl::Status UnpackBundle(absl::string_view tar, const std::string& dir) {
  auto files = ReadBundle(tar);
  if (!files.ok()) return files.status();
  for (const auto& f : *files) {
    std::filesystem::path p = std::filesystem::path(dir) / f.path;
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat("mkdir ", p.parent_path().string(), ": ", ec.message()));
    int fd =
        ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
               f.mode & 0755);
    if (fd < 0)
      return absl::InternalError(
          absl::StrCat("create ", p.string(), ": ", strerror(errno)));
    size_t done = 0;
    while (done < f.content.size()) {
      ssize_t n = ::write(fd, f.content.data() + done, f.content.size() - done);
      if (n <= 0) {
        ::close(fd);
        return absl::InternalError(
            absl::StrCat("write ", p.string(), ": ", strerror(errno)));
      }
      done += static_cast<size_t>(n);
    }
    ::fchmod(fd, f.mode & 0755);
    ::close(fd);
  }
  return absl::OkStatus();
}

std::string Sha256Digest(absl::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  std::string out = "sha256:";
  for (unsigned int i = 0; i < len; ++i)
    absl::StrAppendFormat(&out, "%02x", md[i]);
  return out;
}

bool IsDigest(absl::string_view s) {
  if (!absl::ConsumePrefix(&s, "sha256:") || s.size() != 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
  });
}

absl::StatusOr<std::string> BundleDigestOf(absl::string_view image) {
  size_t at = image.rfind('@');
  absl::string_view ref =
      at == absl::string_view::npos ? image : image.substr(at + 1);
  if (IsDigest(ref)) return std::string(ref);
  return absl::NotFoundError(
      absl::StrCat("image \"", image, "\" names no Silt bundle"));
}

}  // namespace silt::proclets
