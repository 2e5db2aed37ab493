// The gateway's OCI images (silt image import): the archives users upload,
// kept under DATA_DIR/images by digest so nodes that join later import them
// too, the image names each archive brings (records in the store's meta
// table, "images/NAME"), and what each node reports it holds. The nodes do
// the importing (invoker/container_images.h); this owns only the catalog.
//
// Thread safety: every method may be called from any thread.
#ifndef SILT_GATEWAY_IMAGES_H_
#define SILT_GATEWAY_IMAGES_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "store/store.h"

namespace silt::gateway {

class ImageArchives {
 public:
  struct Record {
    std::string name;     // normalized ("docker.io/library/hello:latest")
    std::string archive;  // the archive's digest, "sha256:<hex>"
    uint64_t archive_size = 0;
    int64_t created_unix = 0;
  };
  // What one node says of one image.
  struct NodeImage {
    std::string digest;  // the image's manifest digest
    uint64_t size = 0;
    std::string archive;  // the archive the node imported it from
  };
  // A node's import of an archive that failed.
  struct Failure {
    bool bad_archive = false;  // the archive's fault, not the node's
    std::string message;
  };

  ImageArchives(store::Store* store, std::string dir);

  // Takes the uploaded archive at `path` (moved into the catalog): the
  // records of the images it names (replacing records of the same names).
  // InvalidArgument (what is wrong) for a file that is no image archive.
  absl::StatusOr<std::vector<Record>> Add(const std::string& path,
                                          const std::string& digest,
                                          uint64_t size);
  // A new file in the catalog's directory for an upload (Add moves it).
  std::string UploadPath() const;
  // Forgets an image (a name as a user writes it); its archive goes once no
  // image needs it. NotFound when there is none.
  absl::Status Remove(const std::string& name);
  // Forgets every image of an archive that no node could import because
  // the archive is bad.
  void RemoveArchive(const std::string& archive);
  std::vector<Record> List() const;
  // Whether the catalog has the image (a normalized name).
  bool Has(const std::string& name) const;
  // The archive's file; empty when there is none.
  std::string PathOf(const std::string& archive) const;

  // A node's images now (name → image) and its failed imports (archive →
  // why); a node that left reports nothing. An archive a node found bad is
  // dropped from the catalog (no node can import it): true when one was,
  // and the nodes must be told.
  bool Report(const std::string& node, std::map<std::string, NodeImage> images,
              std::map<std::string, Failure> failures);
  void NodeGone(const std::string& node);
  // Which nodes hold `name`, with what each says of it.
  std::map<std::string, NodeImage> Holders(const std::string& name) const;
  // Waits until each of `nodes` holds every image of `archive` as imported
  // from it (not an earlier import of the same name) or failed to import
  // it, or `timeout` passes: the failures by node.
  std::map<std::string, Failure> Await(const std::string& archive,
                                       const std::set<std::string>& nodes,
                                       std::chrono::milliseconds timeout);

 private:
  absl::Status LoadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SettledLocked(const std::string& archive, const std::string& node,
                     std::map<std::string, Failure>* failures) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropUnusedArchivesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveArchiveLocked(const std::string& archive)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  store::Store* const store_;
  const std::string dir_;
  mutable absl::Mutex mu_;
  std::map<std::string, Record> records_ ABSL_GUARDED_BY(mu_);  // by name
  struct NodeState {
    std::map<std::string, NodeImage> images;  // by name
    std::map<std::string, Failure> failures;  // by archive
  };
  std::map<std::string, NodeState> nodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_IMAGES_H_
