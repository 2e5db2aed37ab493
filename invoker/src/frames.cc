#include "frames.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace silt::invoker {

absl::Status WriteBytesFrame(int fd, std::string_view payload) {
  uint32_t len = static_cast<uint32_t>(payload.size());
  iovec iov[2] = {{&len, 4},
                  {const_cast<char*>(payload.data()), payload.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  size_t left = 4 + payload.size();
  while (left > 0) {
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    left -= static_cast<size_t>(n);
    size_t done = static_cast<size_t>(n);
    while (done > 0 && msg.msg_iovlen > 0) {
      if (done >= msg.msg_iov[0].iov_len) {
        done -= msg.msg_iov[0].iov_len;
        ++msg.msg_iov;
        --msg.msg_iovlen;
      } else {
        msg.msg_iov[0].iov_base =
            static_cast<char*>(msg.msg_iov[0].iov_base) + done;
        msg.msg_iov[0].iov_len -= done;
        done = 0;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status FrameReader::Next(std::string* out) {
  while (true) {
    size_t have = buf_.size() - start_;
    if (have >= 4) {
      uint32_t len;
      memcpy(&len, buf_.data() + start_, 4);
      if (len > max_)
        return absl::DataLossError(absl::StrCat("frame of ", len, " bytes"));
      if (have >= 4 + size_t{len}) {
        out->assign(buf_, start_ + 4, len);
        start_ += 4 + len;
        if (start_ == buf_.size()) {
          buf_.clear();
          start_ = 0;
        }
        return absl::OkStatus();
      }
      // Make room for the whole frame in one read where possible.
      if (start_ > 0) {
        buf_.erase(0, start_);
        start_ = 0;
      }
    }
    size_t old = buf_.size();
    size_t want = 64 * 1024;
    if (have >= 4) {
      uint32_t len;
      memcpy(&len, buf_.data(), 4);
      want = std::max<size_t>(want, 4 + size_t{len} - have);
    }
    buf_.resize(old + want);
    ssize_t n = recv(fd_, buf_.data() + old, want, 0);
    if (n < 0 && errno == EINTR) {
      buf_.resize(old);
      continue;
    }
    if (n <= 0) {
      buf_.resize(old);
      return absl::UnavailableError(
          n == 0 ? std::string("closed by the peer")
                 : absl::StrCat("recv: ", strerror(errno)));
    }
    buf_.resize(old + static_cast<size_t>(n));
  }
}

}  // namespace silt::invoker
