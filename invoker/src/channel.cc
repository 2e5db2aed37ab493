#include "channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "frames.h"

namespace silt::invoker {
namespace {

absl::Status WriteAll(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return absl::UnavailableError(
          absl::StrCat("channel write: ", strerror(errno)));
    data += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* data, size_t len,
                     std::chrono::steady_clock::time_point deadline,
                     bool has_deadline) {
  while (len > 0) {
    int wait_ms = -1;
    if (has_deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        return absl::DeadlineExceededError("channel read timed out");
      wait_ms = static_cast<int>(left.count());
    }
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return absl::DeadlineExceededError("channel read timed out");
    ssize_t n = read(fd, data, len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) return absl::UnavailableError("channel closed by the peer");
    if (n < 0)
      return absl::UnavailableError(
          absl::StrCat("channel read: ", strerror(errno)));
    data += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& msg) {
  std::string buf(4, '\0');
  if (!msg.AppendToString(&buf))
    return absl::InternalError("cannot serialize channel message");
  uint32_t len = static_cast<uint32_t>(buf.size() - 4);
  memcpy(buf.data(), &len, 4);
  return WriteAll(fd, buf.data(), buf.size());
}

absl::Status ReadFrame(int fd, google::protobuf::MessageLite* msg,
                       std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool has_deadline = timeout.count() >= 0;
  uint32_t len = 0;
  if (auto s =
          ReadAll(fd, reinterpret_cast<char*>(&len), 4, deadline, has_deadline);
      !s.ok())
    return s;
  if (len > kMaxFrameBytes)
    return absl::DataLossError(
        absl::StrCat("channel frame of ", len, " bytes"));
  std::string buf(len, '\0');
  if (auto s = ReadAll(fd, buf.data(), len, deadline, has_deadline); !s.ok())
    return s;
  if (!msg->ParseFromString(buf))
    return absl::DataLossError("malformed channel message");
  return absl::OkStatus();
}

absl::Status SendFds(int sock, const int* fds, int count) {
  char marker = 'F';
  if (SendWithRights(sock, std::string_view(&marker, 1), fds,
                     static_cast<size_t>(count), MSG_NOSIGNAL) != 1)
    return absl::UnavailableError(
        absl::StrCat("passing descriptors: ", strerror(errno)));
  return absl::OkStatus();
}

absl::Status RecvFds(int sock, int* fds, int count,
                     std::chrono::milliseconds timeout) {
  if (timeout.count() >= 0) {
    pollfd p{sock, POLLIN, 0};
    int r;
    while ((r = poll(&p, 1, static_cast<int>(timeout.count()))) < 0 &&
           errno == EINTR) {
    }
    if (r == 0) return absl::DeadlineExceededError("no descriptors in time");
  }
  char marker = 0;
  iovec iov{&marker, 1};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * count));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  while ((n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  if (n <= 0)
    return absl::UnavailableError("channel closed while passing descriptors");
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS ||
      c->cmsg_len != CMSG_LEN(sizeof(int) * count) ||
      (msg.msg_flags & MSG_CTRUNC))
    return absl::DataLossError("expected descriptors on the channel");
  memcpy(fds, CMSG_DATA(c), sizeof(int) * count);
  return absl::OkStatus();
}

}  // namespace silt::invoker
