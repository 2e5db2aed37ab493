#include "snapshot/working_set.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace silt::snapshot {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kPresent = 1ull << 63;
constexpr uint64_t kSwapped = 1ull << 62;
constexpr char kMagic[] = "silt-working-set 1";

bool ParseHex(absl::string_view s, uint64_t* out) {
  return absl::SimpleHexAtoi(s, out);
}

// Appends [offset, offset + len) to `out`, sorted input assumed per mapping.
void Add(std::vector<FileRange>* out, uint64_t offset, uint64_t len) {
  if (!out->empty() && out->back().offset + out->back().len == offset) {
    out->back().len += len;
    return;
  }
  out->push_back({offset, len});
}

std::vector<FileRange> Merge(std::vector<FileRange> r, uint64_t gap) {
  std::sort(r.begin(), r.end(), [](const FileRange& a, const FileRange& b) {
    return a.offset < b.offset;
  });
  std::vector<FileRange> out;
  for (const FileRange& x : r) {
    if (!out.empty() && x.offset <= out.back().offset + out.back().len + gap) {
      uint64_t end =
          std::max(out.back().offset + out.back().len, x.offset + x.len);
      out.back().len = end - out.back().offset;
      continue;
    }
    out.push_back(x);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<FileRange>> TouchedRanges(
    pid_t pid, const std::string& pages_file, uint64_t gap) {
  struct stat st;
  if (stat(pages_file.c_str(), &st) != 0)
    return absl::NotFoundError(absl::StrCat("no ", pages_file));
  char dev[32];  // as /proc/PID/maps writes it
  snprintf(dev, sizeof(dev), "%02x:%02x", major(st.st_dev), minor(st.st_dev));
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  if (!maps) return absl::NotFoundError(absl::StrCat("no process ", pid));
  int pagemap = open(absl::StrCat("/proc/", pid, "/pagemap").c_str(),
                     O_RDONLY | O_CLOEXEC);
  if (pagemap < 0) return absl::NotFoundError(absl::StrCat("no process ", pid));
  std::vector<FileRange> touched;
  bool maps_it = false;
  std::vector<uint64_t> entries;
  std::string line;
  while (std::getline(maps, line)) {
    // start-end perms offset dev inode path
    std::vector<absl::string_view> f =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t start = 0, end = 0, offset = 0, inode = 0;
    if (f.size() < 6 || f[3] != dev || !absl::SimpleAtoi(f[4], &inode) ||
        inode != st.st_ino)
      continue;
    std::vector<absl::string_view> range = absl::StrSplit(f[0], '-');
    if (range.size() != 2 || !ParseHex(range[0], &start) ||
        !ParseHex(range[1], &end) || !ParseHex(f[2], &offset) || end <= start)
      continue;
    maps_it = true;
    uint64_t pages = (end - start) / kPage;
    entries.resize(pages);
    ssize_t n = pread(pagemap, entries.data(), pages * 8, (start / kPage) * 8);
    if (n < 0) continue;
    for (uint64_t i = 0; i < static_cast<uint64_t>(n) / 8; ++i)
      if (entries[i] & (kPresent | kSwapped))
        Add(&touched, offset + i * kPage, kPage);
  }
  close(pagemap);
  if (!maps_it)
    return absl::NotFoundError(
        absl::StrCat("process ", pid, " maps nothing of ", pages_file));
  return Merge(std::move(touched), gap);
}

absl::Status SaveWorkingSet(const std::string& path,
                            const std::vector<FileRange>& ranges) {
  std::string text = absl::StrCat(kMagic, "\n");
  for (const FileRange& r : ranges)
    absl::StrAppend(&text, r.offset, " ", r.len, "\n");
  absl::StrAppend(&text, "end\n");
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  bool ok =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FileRange>> LoadWorkingSet(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no working set at ", path));
  std::string line;
  if (!std::getline(in, line) || line != kMagic)
    return absl::DataLossError(absl::StrCat(path, " is not a working set"));
  std::vector<FileRange> out;
  while (std::getline(in, line)) {
    if (line == "end") return out;
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    FileRange r;
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &r.offset) ||
        !absl::SimpleAtoi(f[1], &r.len) || r.len == 0 ||
        r.offset + r.len < r.offset)
      break;
    out.push_back(r);
  }
  return absl::DataLossError(absl::StrCat(path, " is damaged or cut short"));
}

namespace {

// cachestat(2), Linux 6.5 (Debian 12's headers predate it).
constexpr long kSysCachestat = 451;
struct CachestatRange {
  uint64_t off, len;
};
struct Cachestat {
  uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

// Whether the page at `offset` is in the page cache. cachestat reads the
// cache's state and nothing else. The fallback, a read that may not block,
// is not a pure probe: RWF_NOWAIT still starts the readahead of a missing
// page, and on a fast disk (a VM's, backed by the host's cache) that read
// can finish before the kernel looks again, so an uncached page read as
// cached and Prefetch skipped the range it should have read.
bool Cached(int fd, uint64_t offset) {
  CachestatRange range{offset, 1};
  Cachestat cs{};
  if (syscall(kSysCachestat, fd, &range, &cs, 0) == 0) return cs.nr_cache > 0;
  char byte;
  iovec iov{&byte, 1};
  return preadv2(fd, &iov, 1, static_cast<off_t>(offset), RWF_NOWAIT) == 1;
}

}  // namespace

std::vector<FileRange> Uncached(int fd, const std::vector<FileRange>& ranges) {
  std::vector<FileRange> out;
  for (const FileRange& r : ranges)
    if (!Cached(fd, r.offset)) out.push_back(r);
  return out;
}

uint64_t Prefetch(int fd, const std::vector<FileRange>& ranges) {
  uint64_t asked = 0;
  for (const FileRange& r : ranges) {
    if (Cached(fd, r.offset)) continue;
    posix_fadvise(fd, static_cast<off_t>(r.offset), static_cast<off_t>(r.len),
                  POSIX_FADV_WILLNEED);
    asked += r.len;
  }
  return asked;
}

}  // namespace silt::snapshot
