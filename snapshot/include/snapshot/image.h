// Snapshot images: one directory per snapshot, CRIU's image files plus a
// manifest that names the function version it belongs to and the size and
// SHA-256 of every file. A directory is written under a temporary name and
// renamed into place when complete, so a present directory is a whole one;
// Verify() catches what happened to it since (truncation, flipped bytes).
#ifndef SILT_SNAPSHOT_IMAGE_H_
#define SILT_SNAPSHOT_IMAGE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::snapshot {

inline constexpr char kManifestName[] = "manifest.json";

struct ImageFile {
  std::string name;
  uint64_t size = 0;
  std::string sha256;  // hex
};

struct Manifest {
  std::string id;  // names the function version (see invoker: SnapshotId)
  std::string function;
  std::string ns;
  uint64_t generation = 0;
  std::string bundle_digest;  // a container's: its image's manifest digest
  std::string kind;           // native | exec | container
  int abi = 1;
  std::string kernel;  // uname -r of the node that took it
  int criu_version = 0;
  int64_t created_unix = 0;
  double checkpoint_ms = 0;
  uint64_t bytes = 0;  // all files
  std::vector<ImageFile> files;
};

std::string ManifestToJson(const Manifest& m);
absl::StatusOr<Manifest> ParseManifest(absl::string_view json);
absl::StatusOr<Manifest> ReadManifest(const std::string& dir);

// Checksums every regular file of `tmp_dir` into `m`, writes the manifest,
// syncs, and renames tmp_dir to final_dir (replacing nothing: AlreadyExists if
// final_dir is there).
absl::Status Seal(const std::string& tmp_dir, const std::string& final_dir,
                  Manifest* m);

// Checks `dir` against its manifest. With `full`, every file's SHA-256 (reads
// everything); without, sizes and a cache of earlier full checks keyed by each
// file's inode, size and mtime (any write since shows as a new mtime).
absl::StatusOr<Manifest> Verify(const std::string& dir, bool full = false);

// SHA-256 of a file, hex.
absl::StatusOr<std::string> FileSha256(const std::string& path);

// The running kernel's release (uname -r).
std::string KernelRelease();

// ---- CRIU ----

// A bind mount of the sandbox that differs per instance (or per node): it is
// recorded under `key` at dump and bound from `host_dir` at restore.
struct ExternalMount {
  std::string sandbox_path;  // e.g. /var/silt/bundle
  std::string key;           // e.g. bundle
  std::string host_dir;      // restore: what to bind there
};

struct DumpOptions {
  pid_t pid = -1;
  std::string images_dir;
  std::vector<ExternalMount> mounts;
  bool leave_running = false;
};

// Checkpoints the process tree rooted at `pid` (the init of its own PID
// namespace) through libcriu. The log goes to images_dir/dump.log.
absl::Status Dump(const DumpOptions& o);

struct RestoreOptions {
  std::string images_dir;
  std::string root_dir;  // empty directory with the sandbox's mount points
  std::string work_dir;  // writable, for restore.log
  std::vector<ExternalMount> mounts;
};

// Restores the tree as a child of the caller, in a new, empty network
// namespace (replaying the dumped one runs ip and iptables-restore: tens of
// ms; the caller brings loopback up); returns the new root's PID (in the
// caller's PID namespace). Tasks stay in the caller's cgroups.
absl::StatusOr<pid_t> Restore(const RestoreOptions& o);

}  // namespace silt::snapshot

#endif  // SILT_SNAPSHOT_IMAGE_H_
