#include "frames.h"

#include <limits.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace silt::invoker {

absl::Status WriteBytesFrame(int fd, std::string_view payload) {
  uint32_t len = static_cast<uint32_t>(payload.size());
  iovec iov[2] = {{&len, 4},
                  {const_cast<char*>(payload.data()), payload.size()}};
  return WriteAllV(fd, iov, 2);
}

absl::Status WriteAllV(int fd, iovec* iov, size_t count) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min<size_t>(count, IOV_MAX);
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    size_t done = static_cast<size_t>(n);
    while (count > 0 && done >= iov->iov_len) {
      done -= iov->iov_len;
      ++iov;
      --count;
    }
    if (done > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + done;
      iov->iov_len -= done;
    }
  }
  return absl::OkStatus();
}

void AppendFrame(std::string* out, std::string_view payload) {
  uint32_t len = static_cast<uint32_t>(payload.size());
  out->append(reinterpret_cast<const char*>(&len), 4);
  out->append(payload);
}

absl::Status WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

ssize_t SendWithRights(int sock, std::string_view bytes, const int* fds,
                       size_t count, int flags) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * count));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * count);
  memcpy(CMSG_DATA(c), fds, sizeof(int) * count);
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, flags);
  } while (n < 0 && errno == EINTR);
  return n;
}

absl::Status SendFileRange(int fd, int file, uint64_t offset, uint64_t length) {
  off_t at = static_cast<off_t>(offset);
  while (length > 0) {
    ssize_t n = sendfile(fd, file, &at, std::min<uint64_t>(length, 1 << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return absl::UnavailableError(
          absl::StrCat("sendfile: ", strerror(errno)));
    if (n == 0)
      return absl::DataLossError(
          absl::StrCat("the file ends before offset ", offset + length));
    length -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FrameReader::ReadRaw(char* dst, size_t n) {
  size_t buffered = std::min(n, end_ - start_);
  if (buffered > 0) {
    memcpy(dst, buf_.get() + start_, buffered);
    start_ += buffered;
    if (start_ == end_) start_ = end_ = 0;
    dst += buffered;
    n -= buffered;
  }
  while (n > 0) {
    ssize_t got = recv(fd_, dst, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return absl::UnavailableError(
          got == 0 ? std::string("closed by the peer")
                   : absl::StrCat("recv: ", strerror(errno)));
    dst += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

bool FrameReader::HasFrame() const {
  size_t have = end_ - start_;
  if (have < 4) return false;
  uint32_t len;
  memcpy(&len, buf_.get() + start_, 4);
  return have >= 4 + size_t{len};
}

absl::Status FrameReader::Next(std::string* out) {
  constexpr size_t kReadSize = 64 * 1024;
  while (true) {
    size_t have = end_ - start_;
    size_t need = kReadSize;
    if (have >= 4) {
      uint32_t len;
      memcpy(&len, buf_.get() + start_, 4);
      if (len > max_)
        return absl::DataLossError(absl::StrCat("frame of ", len, " bytes"));
      if (have >= 4 + size_t{len}) {
        out->assign(buf_.get() + start_ + 4, len);
        start_ += 4 + len;
        if (start_ == end_) start_ = end_ = 0;
        return absl::OkStatus();
      }
      need = std::max(need, 4 + size_t{len});
    }
    // Room for the whole frame after the unread bytes, in one read where
    // possible.
    if (cap_ - start_ < need) {
      if (cap_ < need) {
        auto bigger = std::make_unique<char[]>(need);
        // (buf_ is null before the first read: no memcpy from null)
        if (have > 0) memcpy(bigger.get(), buf_.get() + start_, have);
        buf_ = std::move(bigger);
        cap_ = need;
      } else {
        memmove(buf_.get(), buf_.get() + start_, have);
      }
      start_ = 0;
      end_ = have;
    }
    ssize_t n = recv(fd_, buf_.get() + end_, cap_ - end_, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return absl::UnavailableError(
          n == 0 ? std::string("closed by the peer")
                 : absl::StrCat("recv: ", strerror(errno)));
    end_ += static_cast<size_t>(n);
  }
}

}  // namespace silt::invoker

namespace silt::invoker {
namespace {

// Fills [p, p + n) with recvmsg, keeping any fds that arrive.
absl::Status RecvWithFds(int fd, char* p, size_t n, std::vector<int>* fds) {
  while (n > 0) {
    iovec iov{p, n};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 64)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t got = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == EINTR) continue;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); got >= 0 && c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->push_back(received);
      }
    }
    if (got <= 0)
      return absl::UnavailableError(got == 0 ? "connection closed"
                                             : strerror(errno));
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadFrameWithFds(int fd, size_t max_frame, std::string* out,
                              std::vector<int>* fds) {
  uint32_t len = 0;
  absl::Status s = RecvWithFds(fd, reinterpret_cast<char*>(&len), 4, fds);
  if (s.ok() && len > max_frame)
    s = absl::DataLossError(absl::StrCat("frame of ", len, " bytes"));
  if (s.ok()) {
    out->resize(len);
    s = RecvWithFds(fd, out->data(), len, fds);
  }
  if (!s.ok()) {
    for (int f : *fds) close(f);
    fds->clear();
  }
  return s;
}

}  // namespace silt::invoker
