#include "snapshot/image.h"

#include <criu/criu.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "proclets/json_integer.h"
#include "snapshot/criu.h"

namespace silt::snapshot {
namespace {

using nlohmann::json;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TailOfLog(const std::string& path) {
  std::string text = ReadAll(path);
  // The last few error lines say what went wrong.
  std::vector<std::string> errors;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("Error") != std::string::npos ||
        line.find("rror (") != std::string::npos)
      errors.push_back(line);
  }
  std::string out;
  size_t from = errors.size() > 3 ? errors.size() - 3 : 0;
  for (size_t i = from; i < errors.size(); ++i)
    absl::StrAppend(&out, out.empty() ? "" : " | ", errors[i]);
  return out.empty() ? "(no error lines in " + path + ")" : out;
}

// Cache of files whose full checksum matched: (dev, ino, size, mtime) → sha.
struct FileKey {
  dev_t dev;
  ino_t ino;
  off_t size;
  int64_t mtime_ns;
  bool operator<(const FileKey& o) const {
    return std::tie(dev, ino, size, mtime_ns) <
           std::tie(o.dev, o.ino, o.size, o.mtime_ns);
  }
};
std::mutex verified_mu;
std::map<FileKey, std::string>& Verified() {
  static auto* m = new std::map<FileKey, std::string>();
  return *m;
}

absl::StatusOr<FileKey> KeyOf(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  return FileKey{st.st_dev, st.st_ino, st.st_size,
                 static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                     st.st_mtim.tv_nsec};
}

class CriuOpts {
 public:
  CriuOpts() { ok_ = criu_local_init_opts(&o_) == 0; }
  ~CriuOpts() {
    if (o_ != nullptr) criu_local_free_opts(o_);
  }
  criu_opts* get() { return o_; }
  bool ok() const { return ok_; }

 private:
  criu_opts* o_ = nullptr;
  bool ok_ = false;
};

void CommonOptions(criu_opts* o, const std::string& binary) {
  criu_local_set_service_binary(o, binary.c_str());
  criu_local_set_log_level(o, 2);
  // The sandbox's network namespace is private and holds loopback only.
  criu_local_set_network_lock(o, CRIU_NETWORK_LOCK_SKIP);
  // /usr, /etc: bound from the node, the same on every node.
  criu_local_set_auto_ext_mnt(o, true);
  criu_local_set_ext_sharing(o, true);
  criu_local_set_ext_masters(o, true);
  // Cgroups are the invoker's business: a restored instance gets its own.
  criu_local_set_manage_cgroups(o, true);
  criu_local_set_manage_cgroups_mode(o, CRIU_CG_MODE_IGNORE);
}

}  // namespace

std::string ManifestToJson(const Manifest& m) {
  json files = json::array();
  for (const auto& f : m.files)
    files.push_back({{"name", f.name}, {"size", f.size}, {"sha256", f.sha256}});
  json j = {{"id", m.id},
            {"function", m.function},
            {"namespace", m.ns},
            {"generation", m.generation},
            {"bundleDigest", m.bundle_digest},
            {"kind", m.kind},
            {"abi", m.abi},
            {"kernel", m.kernel},
            {"criuVersion", m.criu_version},
            {"created", m.created_unix},
            {"checkpointMs", m.checkpoint_ms},
            {"bytes", m.bytes},
            {"files", files}};
  return j.dump(2) + "\n";
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::DataLossError("snapshot manifest is not JSON");
  Manifest m;
  try {
    m.id = j.at("id").get<std::string>();
    m.function = j.at("function").get<std::string>();
    m.ns = j.at("namespace").get<std::string>();
    m.generation = proclets::JsonIntegerAt<uint64_t>(j, "generation");
    m.bundle_digest = j.at("bundleDigest").get<std::string>();
    m.kind = j.value("kind", "");
    m.abi = proclets::JsonIntegerOr<int>(j, "abi", 1);
    m.kernel = j.value("kernel", "");
    m.criu_version = proclets::JsonIntegerOr<int>(j, "criuVersion", 0);
    m.created_unix = proclets::JsonIntegerOr<int64_t>(j, "created", 0);
    m.checkpoint_ms = j.value("checkpointMs", 0.0);
    m.bytes = proclets::JsonIntegerOr<uint64_t>(j, "bytes", 0);
    for (const auto& f : j.at("files")) {
      ImageFile file{f.at("name").get<std::string>(),
                     proclets::JsonIntegerAt<uint64_t>(f, "size"),
                     f.at("sha256").get<std::string>()};
      if (file.name.empty() || file.name.find('/') != std::string::npos ||
          file.name == "." || file.name == "..")
        return absl::DataLossError("snapshot manifest names a bad file");
      m.files.push_back(std::move(file));
    }
  } catch (const json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("snapshot manifest is incomplete: ", e.what()));
  }
  return m;
}

absl::StatusOr<Manifest> ReadManifest(const std::string& dir) {
  std::string path = dir + "/" + kManifestName;
  if (access(path.c_str(), R_OK) != 0)
    return absl::NotFoundError(absl::StrCat("no snapshot manifest in ", dir));
  return ParseManifest(ReadAll(path));
}

absl::StatusOr<std::string> FileSha256(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  ssize_t n;
  while ((n = read(fd, buf.data(), buf.size())) > 0)
    EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(n));
  int err = errno;
  close(fd);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  if (n < 0)
    return absl::DataLossError(absl::StrCat(path, ": ", std::strerror(err)));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[md[i] >> 4]);
    hex.push_back(kHex[md[i] & 15]);
  }
  return hex;
}

std::string KernelRelease() {
  struct utsname u;
  return uname(&u) == 0 ? u.release : "";
}

absl::Status Seal(const std::string& tmp_dir, const std::string& final_dir,
                  Manifest* m) {
  m->files.clear();
  m->bytes = 0;
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(tmp_dir, ec)) {
    if (!e.is_regular_file()) continue;
    std::string name = e.path().filename().string();
    if (name == kManifestName) continue;
    names.push_back(name);
  }
  if (ec) return absl::InternalError(absl::StrCat(tmp_dir, ": ", ec.message()));
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    std::string path = tmp_dir + "/" + name;
    auto sha = FileSha256(path);
    if (!sha.ok()) return sha.status();
    auto key = KeyOf(path);
    if (!key.ok()) return key.status();
    m->files.push_back({name, static_cast<uint64_t>(key->size), *sha});
    m->bytes += static_cast<uint64_t>(key->size);
    std::lock_guard<std::mutex> l(verified_mu);
    Verified()[*key] = *sha;
  }
  {
    std::string path = tmp_dir + "/" + kManifestName;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << ManifestToJson(*m);
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  // Data first, then the rename that makes the directory visible.
  for (const auto& name : names) {
    int fd = open((tmp_dir + "/" + name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      fdatasync(fd);
      close(fd);
    }
  }
  if (std::filesystem::exists(final_dir, ec))
    return absl::AlreadyExistsError(
        absl::StrCat("snapshot ", final_dir, " exists"));
  if (rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
    return absl::InternalError(absl::StrCat(
        "rename ", tmp_dir, " → ", final_dir, ": ", std::strerror(errno)));
  std::string parent = std::filesystem::path(final_dir).parent_path().string();
  int dfd = open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<Manifest> Verify(const std::string& dir, bool full) {
  auto m = ReadManifest(dir);
  if (!m.ok()) return m.status();
  if (m->files.empty())
    return absl::DataLossError(
        absl::StrCat("snapshot ", dir, " lists no files"));
  for (const auto& f : m->files) {
    std::string path = dir + "/" + f.name;
    auto key = KeyOf(path);
    if (!key.ok())
      return absl::DataLossError(
          absl::StrCat("snapshot ", m->id, ": ", f.name, " is missing"));
    if (static_cast<uint64_t>(key->size) != f.size)
      return absl::DataLossError(absl::StrCat(
          "snapshot ", m->id, ": ", f.name, " has ", key->size,
          " bytes, the manifest says ", f.size, " (truncated or grown)"));
    if (!full) {
      std::lock_guard<std::mutex> l(verified_mu);
      auto it = Verified().find(*key);
      if (it != Verified().end() && it->second == f.sha256) continue;
    }
    auto sha = FileSha256(path);
    if (!sha.ok()) return sha.status();
    if (*sha != f.sha256)
      return absl::DataLossError(absl::StrCat("snapshot ", m->id, ": ", f.name,
                                              " does not match its checksum"));
    std::lock_guard<std::mutex> l(verified_mu);
    Verified()[*key] = *sha;
  }
  return m;
}

absl::Status Dump(const DumpOptions& o) {
  CriuOpts opts;
  if (!opts.ok()) return absl::InternalError("criu_local_init_opts failed");
  int dir = open(o.images_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0)
    return absl::InternalError(
        absl::StrCat(o.images_dir, ": ", std::strerror(errno)));
  std::string binary = CriuBinary();
  criu_opts* c = opts.get();
  CommonOptions(c, binary);
  criu_local_set_images_dir_fd(c, dir);
  criu_local_set_log_file(c, "dump.log");
  criu_local_set_pid(c, o.pid);
  criu_local_set_leave_running(c, o.leave_running);
  for (const auto& m : o.mounts)
    criu_local_add_ext_mount(c, m.sandbox_path.c_str(), m.key.c_str());
  int rc = criu_local_dump(c);
  close(dir);
  if (rc < 0) {
    return absl::InternalError(
        absl::StrCat("criu dump of pid ", o.pid, " failed (", rc,
                     "): ", TailOfLog(o.images_dir + "/dump.log")));
  }
  return absl::OkStatus();
}

absl::StatusOr<pid_t> Restore(const RestoreOptions& o) {
  CriuOpts opts;
  if (!opts.ok()) return absl::InternalError("criu_local_init_opts failed");
  int dir = open(o.images_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0)
    return absl::NotFoundError(
        absl::StrCat(o.images_dir, ": ", std::strerror(errno)));
  int work = open(o.work_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (work < 0) {
    close(dir);
    return absl::InternalError(
        absl::StrCat(o.work_dir, ": ", std::strerror(errno)));
  }
  std::string binary = CriuBinary();
  criu_opts* c = opts.get();
  CommonOptions(c, binary);
  criu_local_set_images_dir_fd(c, dir);
  criu_local_set_work_dir_fd(c, work);
  criu_local_set_log_file(c, "restore.log");
  criu_local_set_root(c, o.root_dir.c_str());
  criu_local_set_empty_ns(c, CLONE_NEWNET);
  for (const auto& m : o.mounts)
    criu_local_add_ext_mount(c, m.key.c_str(), m.host_dir.c_str());
  int pid = criu_local_restore_child(c);
  close(dir);
  close(work);
  if (pid <= 0) {
    return absl::InternalError(
        absl::StrCat("criu restore failed (", pid,
                     "): ", TailOfLog(o.work_dir + "/restore.log")));
  }
  return static_cast<pid_t>(pid);
}

}  // namespace silt::snapshot
