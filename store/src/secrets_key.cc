#include "store/secrets_key.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace silt::store {
namespace {

absl::Status ErrnoError(absl::string_view op, const std::string& path,
                        int err) {
  std::string msg = absl::StrCat("store: ", op, " secrets key file ", path,
                                 ": ", strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// The size and mode rules of the header, on an open key file.
absl::Status CheckKeyFile(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoError("stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("secrets key file ", path, " is not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "secrets key file %s is mode %04o: group and others must have no "
        "access (chmod 600 %s)",
        path, st.st_mode & 07777, path));
  }
  if (st.st_size != static_cast<off_t>(kSecretsKeyBytes)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secrets key file ", path, " holds ", st.st_size, " bytes, not ",
        kSecretsKeyBytes, ": a key file is ", kSecretsKeyBytes,
        " raw bytes (openssl rand -out FILE ", kSecretsKeyBytes, ")"));
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const unsigned char* p, size_t n,
                      const std::string& path) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return ErrnoError("write", path, errno);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Writes a new random key to `tmp` (fsynced), then links it to `path`, which
// must not exist yet: a crash leaves either no key file or a whole one.
absl::Status CreateKeyFile(const std::string& path, const std::string& tmp) {
  unsigned char key[kSecretsKeyBytes];
  if (RAND_bytes(key, sizeof(key)) != 1)
    return absl::InternalError("store: RAND_bytes failed for the secrets key");
  absl::Status s;
  {
    Fd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.get() < 0) s = ErrnoError("create", tmp, errno);
    if (s.ok()) s = WriteAll(fd.get(), key, sizeof(key), tmp);
    if (s.ok() && fsync(fd.get()) != 0) s = ErrnoError("fsync", tmp, errno);
  }
  OPENSSL_cleanse(key, sizeof(key));
  if (s.ok() && link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST)
    s = ErrnoError("create", path, errno);
  unlink(tmp.c_str());
  return s;
}

}  // namespace

absl::StatusOr<std::string> ReadSecretsKeyFile(const std::string& path) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("open", path, errno);
  if (auto s = CheckKeyFile(fd.get(), path); !s.ok()) return s;
  std::string key(kSecretsKeyBytes, '\0');
  size_t got = 0;
  while (got < key.size()) {
    ssize_t r = pread(fd.get(), key.data() + got, key.size() - got, got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError("read", path, errno);
    if (r == 0) return absl::DataLossError("secrets key file shrank");
    got += static_cast<size_t>(r);
  }
  return key;
}

absl::StatusOr<std::string> LoadOrCreateSecretsKeyFile(const std::string& path,
                                                       bool* created) {
  *created = false;
  auto key = ReadSecretsKeyFile(path);
  if (!absl::IsNotFound(key.status())) return key;
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  if (auto s = CreateKeyFile(path, tmp); !s.ok()) return s;
  // Make the new name durable before anything is sealed with the key.
  std::string dir = std::filesystem::path(path).parent_path().string();
  Fd dfd(open(dir.empty() ? "." : dir.c_str(),
              O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) fsync(dfd.get());
  *created = true;
  return ReadSecretsKeyFile(path);
}

}  // namespace silt::store
