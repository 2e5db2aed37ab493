// The frames a worker (a function's own code, untrusted) sends the invoker on
// the state data path: whatever bytes arrive, the reader yields frames within
// its limit or an error, never a crash or an overlong frame.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "frames.h"

namespace {

constexpr size_t kMaxFrame = 1 << 16;

// Both ends of a socket pair holding `bytes` as sent, the writer closed.
bool Stream(const uint8_t* data, size_t size, int* reader) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
  int buf = 4 << 20;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  size_t off = 0;
  while (off < size) {
    ssize_t n = write(sv[0], data + off, size - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  close(sv[0]);
  *reader = sv[1];
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  int fd = -1;
  if (!Stream(data, size, &fd)) return 0;
  silt::invoker::FrameReader reader(fd, kMaxFrame);
  std::string frame;
  for (int i = 0; i < 1024; ++i) {
    if (!reader.Next(&frame).ok()) break;
    if (frame.size() > kMaxFrame) abort();
  }
  close(fd);
  if (!Stream(data, size, &fd)) return 0;
  std::vector<int> fds;
  for (int i = 0; i < 1024; ++i) {
    if (!silt::invoker::ReadFrameWithFds(fd, kMaxFrame, &frame, &fds).ok())
      break;
    if (frame.size() > kMaxFrame) abort();
  }
  for (int f : fds) close(f);
  close(fd);
  return 0;
}
