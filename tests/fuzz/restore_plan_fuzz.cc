// CRIU image files as the invoker digests them into a restore plan (images on
// a node's disk, or copied from a peer): a plan or an error, never a crash.
// The input is a little archive written out as the images directory: entries
// of [name length: 1 byte][name][size: u32 little-endian][bytes].
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "snapshot/fast_restore.h"

namespace {

// The images directory, removed when the fuzzer exits.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/silt-restore-plan-fuzz-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

const std::string& Dir() {
  static TempDir dir;
  return dir.path;
}

bool SafeName(const std::string& n) {
  if (n.empty() || n == "." || n == "..") return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '-'))
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = Dir();
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    std::filesystem::remove(e.path(), ec);
  size_t at = 0;
  for (int files = 0; files < 32 && at < size; ++files) {
    size_t name_len = data[at++];
    if (at + name_len + 4 > size) break;
    std::string name(reinterpret_cast<const char*>(data + at), name_len);
    at += name_len;
    uint32_t len = 0;
    memcpy(&len, data + at, 4);
    at += 4;
    if (len > size - at) len = static_cast<uint32_t>(size - at);
    if (SafeName(name)) {
      std::ofstream(dir + "/" + name, std::ios::binary)
          .write(reinterpret_cast<const char*>(data + at), len);
    }
    at += len;
  }
  (void)silt::snapshot::BuildRestorePlan(dir);
  return 0;
}
