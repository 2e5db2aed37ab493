// The snapshot images complete on this node (DATA_DIR/snapshots/<id>), and
// what derives from each: its fast-restore plan (or that it has none), and
// the working set its lazy restores touched (DATA_DIR/working-sets/<id>).
// Checkpointing, fetching from peers and restoring are the invoker's; this
// is what they agree on: which images exist here.
//
// Thread safety: thread-safe, under a lock of its own that it never holds
// while calling out. The invoker may call it while holding its own lock
// (never the other way round).
#ifndef SILT_INVOKER_IMAGE_CATALOG_H_
#define SILT_INVOKER_IMAGE_CATALOG_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "snapshot/fast_restore.h"
#include "snapshot/image.h"
#include "snapshot/working_set.h"

namespace silt::invoker {

class ImageCatalog {
 public:
  using Ranges = std::vector<snapshot::FileRange>;

  ImageCatalog(std::string images_dir, std::string working_sets_dir);

  // At start: takes in the images the directory holds for this kernel;
  // removes the rest (another kernel's, malformed, half-written ones) and
  // working sets whose image is gone.
  void Load();

  // Where image `id` lives (whether or not it is there).
  std::string Dir(const std::string& id) const;
  // A fresh directory beside the images, for one being written ("tmp") or
  // removed ("trash"); hidden from Load, which removes what it finds of them.
  std::string Aside(const std::string& what, const std::string& id) const;

  bool Has(const std::string& id) const;
  uint64_t Bytes(const std::string& id) const;  // 0 when absent
  std::vector<snapshot::Manifest> List() const;
  // An image now complete in Dir(m.id).
  void Add(const snapshot::Manifest& m);
  // Forgets the image and what derives from it (its plan, its working set,
  // on disk too); its directory is removed by the caller.
  void Forget(const std::string& id);

  // Held while the image is fetched from a peer: one fetch per image.
  std::shared_ptr<absl::Mutex> FetchLock(const std::string& id);

  // The image's fast-restore plan, built at first need. Unimplemented (and
  // remembered) for an image the fast restorer cannot take.
  absl::StatusOr<std::shared_ptr<const snapshot::FastPlan>> Plan(
      const std::string& id);
  // The fast restorer failed on it: CRIU restores it from now on.
  void RefuseFast(const std::string& id);
  bool FastRefused(const std::string& id) const;

  // What lazy restores of the image touched, loaded at first need; null
  // when none was recorded.
  std::shared_ptr<const Ranges> WorkingSet(const std::string& id);
  // Keeps (and saves) a working set recorded for the image.
  absl::Status SaveWorkingSet(const std::string& id, Ranges ranges);

 private:
  std::string WorkingSetPath(const std::string& id) const;

  const std::string dir_, working_sets_dir_;
  mutable absl::Mutex mu_;
  std::map<std::string, snapshot::Manifest> images_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<absl::Mutex>> fetch_locks_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<const snapshot::FastPlan>> plans_
      ABSL_GUARDED_BY(mu_);
  std::set<std::string> no_fast_ ABSL_GUARDED_BY(mu_);
  // By image; a null entry: looked for, none recorded.
  std::map<std::string, std::shared_ptr<const Ranges>> working_sets_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_IMAGE_CATALOG_H_
