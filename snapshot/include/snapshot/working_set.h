// The working set of a snapshot image: the parts of its pages file that a
// restored instance touched, recorded from the instance's page table after
// its first call, and read ahead in large sequential requests before the
// next restore that finds the image on disk only (REAP's and Spice's
// prefetch; ../shared/reference/snapshots.md). Restores map the pages file
// lazily: without this, each page the call touches is a fault that waits on
// its own small read.
#ifndef SILT_SNAPSHOT_WORKING_SET_H_
#define SILT_SNAPSHOT_WORKING_SET_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace silt::snapshot {

// Bytes [offset, offset + len) of a pages file.
struct FileRange {
  uint64_t offset = 0, len = 0;
  bool operator==(const FileRange&) const = default;
};

// The ranges of `pages_file` that process `pid` has in its page table
// through mappings of that file (pages it read or wrote since it was
// restored lazily from it), page-aligned, sorted, merged where less than
// `gap` bytes apart. NotFound: the process is gone or maps nothing of it.
absl::StatusOr<std::vector<FileRange>> TouchedRanges(
    pid_t pid, const std::string& pages_file, uint64_t gap = 256 << 10);

// Kept in a file of its own (`path`), written whole or not at all.
absl::Status SaveWorkingSet(const std::string& path,
                            const std::vector<FileRange>& ranges);
// NotFound when none was recorded; DataLoss when the file is damaged.
absl::StatusOr<std::vector<FileRange>> LoadWorkingSet(const std::string& path);

// Starts reading `ranges` of the open file `fd` into the page cache and
// returns without waiting for the reads: the restore's page faults then wait
// on reads already in flight instead of issuing their own. Ranges whose
// first page is cached already are skipped (a cheap probe: a recently used
// image costs nothing). Returns the bytes asked for.
uint64_t Prefetch(int fd, const std::vector<FileRange>& ranges);

// The ranges of `ranges` whose first page is not in the page cache (the
// probe Prefetch makes, without starting any read).
std::vector<FileRange> Uncached(int fd, const std::vector<FileRange>& ranges);

}  // namespace silt::snapshot

#endif  // SILT_SNAPSHOT_WORKING_SET_H_
