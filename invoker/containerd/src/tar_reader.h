// Reads a tar archive (ustar, GNU long names, pax paths), plain or gzipped,
// one entry at a time, as image archives are: OCI image layouts and
// `docker save` output. Names come without a leading "./".
#ifndef SILT_CONTAINERD_TAR_READER_H_
#define SILT_CONTAINERD_TAR_READER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace silt::containerd {

class TarReader {
 public:
  struct Entry {
    std::string name;
    uint64_t size = 0;
    bool regular = false;  // a file (not a directory, link, device)
  };

  // NotFound when the file does not exist.
  static absl::StatusOr<std::unique_ptr<TarReader>> Open(
      const std::string& path);
  ~TarReader();

  // Moves to the next entry (what is left of the one before is skipped):
  // false at the archive's end. InvalidArgument for a malformed archive,
  // naming the offset.
  absl::StatusOr<bool> Next(Entry* entry);
  // Reads up to `n` bytes of the current entry's data: 0 at its end.
  absl::StatusOr<size_t> Read(char* buf, size_t n);

 private:
  explicit TarReader(void* gz);
  absl::Status ReadExactly(char* buf, size_t n);
  absl::Status Skip(uint64_t n);

  void* gz_;              // gzFile: reads plain files as they are
  uint64_t left_ = 0;     // of the current entry's data
  uint64_t padding_ = 0;  // after it, to a 512-byte block
  uint64_t offset_ = 0;   // in the (uncompressed) archive
};

}  // namespace silt::containerd

#endif  // SILT_CONTAINERD_TAR_READER_H_
