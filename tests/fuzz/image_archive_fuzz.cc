// Image archives as users upload them to the gateway (POST /system/images),
// which reads each one's index before any node imports it (tar, gzip, pax
// and GNU headers, index.json, manifest.json): names or an error, never a
// crash or a hang.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "containerd/archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One in-memory file, rewritten for each input.
  static int fd = memfd_create("archive", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0 ||
      pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    abort();
  auto names = silt::containerd::ArchiveImageNames(path);
  if (names.ok() && names->empty()) abort();  // names one image at least
  return 0;
}
