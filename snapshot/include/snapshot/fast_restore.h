// Silt's own restore path for CRIU images of a single-threaded worker: the
// invoker digests the image once into a RestorePlan (restore_plan.h), and a
// pre-spawned silt-restorer in a ready sandbox maps the image's pages
// (MAP_PRIVATE of pages-N.img: no copy) and becomes the checkpointed process.
// Images this path cannot restore exactly are refused here, and then CRIU
// restores them.
#ifndef SILT_SNAPSHOT_FAST_RESTORE_H_
#define SILT_SNAPSHOT_FAST_RESTORE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace silt::snapshot {

struct FastPlan {
  std::string bytes;       // PlanHeader + tables, ready to send
  std::string pages_file;  // the pages-N.img the plan's runs refer to
  // Files the process maps (paths inside its sandbox), in PlanFile order.
  std::vector<std::string> mapped_files;
};

// Unimplemented when the image holds something the restorer does not
// handle (several processes or threads, shared or special mappings, open
// files other than /dev/null, pending signals, timers).
absl::StatusOr<FastPlan> BuildRestorePlan(const std::string& images_dir);

}  // namespace silt::snapshot

#endif  // SILT_SNAPSHOT_FAST_RESTORE_H_
