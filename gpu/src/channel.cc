#include "gpu/channel.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace silt::gpu {
namespace {

bool ReadFull(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

bool WriteFrame(int fd, std::initializer_list<std::string_view> parts) {
  uint64_t n = 0;
  for (std::string_view p : parts) n += p.size();
  std::vector<iovec> iov;
  iov.reserve(parts.size() + 1);
  iov.push_back({&n, sizeof(n)});
  for (std::string_view p : parts)
    if (!p.empty()) iov.push_back({const_cast<char*>(p.data()), p.size()});
  msghdr msg{};
  size_t first = 0;
  while (first < iov.size()) {
    msg.msg_iov = &iov[first];
    msg.msg_iovlen = iov.size() - first;
    ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    // Skip what went; resume inside a part sent halfway.
    auto left = static_cast<size_t>(w);
    while (first < iov.size() && left >= iov[first].iov_len)
      left -= iov[first++].iov_len;
    if (first < iov.size()) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return true;
}

bool ReadFrame(int fd, std::string* out) {
  uint64_t n = 0;
  if (!ReadFull(fd, &n, sizeof(n)) || n > kMaxFrameBytes) return false;
  out->resize(n);
  return ReadFull(fd, out->data(), n);
}

}  // namespace silt::gpu
