#include "auth.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace silt::gateway {
namespace {

absl::StatusOr<std::string> ReadTrimmed(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

// Writes `content` to `path` with mode 0600 via a temporary file and rename, so
// a crash never leaves a half-written credential.
absl::Status WriteSecretFile(const std::string& path,
                             absl::string_view content) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  bool ok = ::write(fd, content.data(), content.size()) ==
                static_cast<ssize_t>(content.size()) &&
            ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string RandomPassword() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  std::string out;
  for (unsigned char b : bytes) out.push_back(kAlphabet[b % 62]);
  return out;
}

}  // namespace

absl::StatusOr<Credentials> LoadOrCreateCredentials(
    const std::string& secrets_dir) {
  std::error_code ec;
  std::filesystem::create_directories(secrets_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", secrets_dir, ": ", ec.message()));
  }
  ::chmod(secrets_dir.c_str(), 0700);
  Credentials c;
  std::string user_file = secrets_dir + "/basic-auth-user";
  c.password_file = secrets_dir + "/basic-auth-password";
  if (!std::filesystem::exists(user_file)) {
    if (auto s = WriteSecretFile(user_file, "admin"); !s.ok()) return s;
    c.generated = true;
  }
  if (!std::filesystem::exists(c.password_file)) {
    if (auto s = WriteSecretFile(c.password_file, RandomPassword()); !s.ok())
      return s;
    c.generated = true;
  }
  auto user = ReadTrimmed(user_file);
  if (!user.ok()) return user.status();
  auto password = ReadTrimmed(c.password_file);
  if (!password.ok()) return password.status();
  if (user->empty() || password->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("empty basic-auth user or password in ", secrets_dir,
                     ": delete both files to generate new ones"));
  }
  c.user = *std::move(user);
  c.password = *std::move(password);
  return c;
}

bool CheckBasicAuth(const Credentials& creds, absl::string_view authorization) {
  absl::string_view prefix = "Basic ";
  if (authorization.size() < prefix.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, prefix.size()), prefix)) {
    return false;
  }
  std::string decoded;
  if (!absl::Base64Unescape(
          absl::StripAsciiWhitespace(authorization.substr(prefix.size())),
          &decoded)) {
    return false;
  }
  size_t colon = decoded.find(':');
  if (colon == std::string::npos) return false;
  absl::string_view user(decoded.data(), colon);
  absl::string_view password(decoded.data() + colon + 1,
                             decoded.size() - colon - 1);
  // Constant time over the expected password's length.
  unsigned char diff = password.size() == creds.password.size() ? 0 : 1;
  for (size_t i = 0; i < creds.password.size(); ++i) {
    unsigned char a = static_cast<unsigned char>(creds.password[i]);
    unsigned char b =
        i < password.size() ? static_cast<unsigned char>(password[i]) : 0;
    diff |= a ^ b;
  }
  return user == creds.user && diff == 0;
}

}  // namespace silt::gateway
