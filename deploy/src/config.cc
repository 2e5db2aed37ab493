#include "deploy/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace silt::deploy {

std::string ConfigDir() {
  if (const char* d = std::getenv("OPENFAAS_CONFIG");
      d != nullptr && *d != '\0')
    return d;
  if (const char* ci = std::getenv("CI");
      ci != nullptr && std::string(ci) == "true")
    return ".openfaas";
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : ".", "/.openfaas");
}

std::string ConfigPath() { return ConfigDir() + "/config.yml"; }

absl::StatusOr<std::vector<AuthEntry>> ReadAuthEntries() {
  std::vector<AuthEntry> out;
  std::string path = ConfigPath();
  if (!std::filesystem::exists(path)) return out;
  try {
    YAML::Node root = YAML::LoadFile(path);
    if (root && root["auths"] && root["auths"].IsSequence()) {
      for (const auto& n : root["auths"]) {
        AuthEntry e;
        if (n["gateway"]) e.gateway = n["gateway"].as<std::string>();
        if (n["auth"]) e.auth = n["auth"].as<std::string>();
        if (n["token"]) e.token = n["token"].as<std::string>();
        out.push_back(std::move(e));
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::DataLossError(
        absl::StrCat("cannot parse ", path, ": ", e.what()));
  }
  return out;
}

namespace {

absl::Status WriteEntries(const std::vector<AuthEntry>& entries) {
  std::string dir = ConfigDir();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", dir, ": ", ec.message()));
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "auths" << YAML::Value
      << YAML::BeginSeq;
  for (const auto& e : entries) {
    out << YAML::BeginMap << YAML::Key << "gateway" << YAML::Value << e.gateway
        << YAML::Key << "auth" << YAML::Value << e.auth << YAML::Key << "token"
        << YAML::Value << e.token << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  std::string path = ConfigPath();
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  std::string text = std::string(out.c_str()) + "\n";
  bool ok = ::write(fd, text.data(), text.size()) ==
            static_cast<ssize_t>(text.size());
  ok = ::fsync(fd) == 0 && ok;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0)
    return absl::InternalError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveAuth(const AuthEntry& entry) {
  auto entries = ReadAuthEntries();
  if (!entries.ok()) return entries.status();
  bool replaced = false;
  for (auto& e : *entries) {
    if (e.gateway == entry.gateway) {
      e = entry;
      replaced = true;
    }
  }
  if (!replaced) entries->push_back(entry);
  return WriteEntries(*entries);
}

absl::Status RemoveAuth(const std::string& gateway) {
  auto entries = ReadAuthEntries();
  if (!entries.ok()) return entries.status();
  size_t before = entries->size();
  std::erase_if(*entries,
                [&](const AuthEntry& e) { return e.gateway == gateway; });
  if (entries->size() == before)
    return absl::NotFoundError(
        absl::StrCat("no credentials saved for ", gateway));
  return WriteEntries(*entries);
}

std::optional<std::string> AuthorizationFor(const std::string& gateway) {
  auto entries = ReadAuthEntries();
  if (!entries.ok()) return std::nullopt;
  for (const auto& e : *entries) {
    if (e.gateway != gateway) continue;
    if (e.auth == "basic") return "Basic " + e.token;
    if (e.auth == "oauth2") return "Bearer " + e.token;
  }
  return std::nullopt;
}

std::string BasicToken(const std::string& user, const std::string& password) {
  return absl::Base64Escape(user + ":" + password);
}

}  // namespace silt::deploy
