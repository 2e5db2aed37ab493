// Length-prefixed byte frames (u32 little-endian length, then the bytes) on a
// blocking stream socket: the state data path (silt-worker <-> invoker, and
// invoker <-> invoker). Protobuf frames for control stay in channel.h.
#ifndef SILT_INVOKER_FRAMES_H_
#define SILT_INVOKER_FRAMES_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace silt::invoker {

// Writes one frame (one sendmsg for header and payload). Unavailable when the
// peer is gone.
absl::Status WriteBytesFrame(int fd, std::string_view payload);

// Appends one frame to *out (to send several with one WriteAll).
void AppendFrame(std::string* out, std::string_view payload);
// Writes all of `bytes`. Unavailable when the peer is gone.
absl::Status WriteAll(int fd, std::string_view bytes);
// Writes every byte of iov[0, count) with as few sendmsg calls as it takes
// (the entries are consumed). Unavailable when the peer is gone.
absl::Status WriteAllV(int fd, iovec* iov, size_t count);
// Sends `length` bytes of file `file` from `offset` with sendfile (from the
// page cache, no copy into this process). Unavailable when the peer is gone,
// DataLoss when the file ends first.
absl::Status SendFileRange(int fd, int file, uint64_t offset, uint64_t length);

// One sendmsg of `bytes` on a unix socket with `count` file descriptors
// passed along (SCM_RIGHTS), retried on EINTR; `flags` as for sendmsg. How
// many bytes went, or -1 with errno set.
ssize_t SendWithRights(int sock, std::string_view bytes, const int* fds,
                       size_t count, int flags);

// Reads exactly one frame (nothing past it) from a unix socket, collecting
// the file descriptors sent along with any of its bytes (close-on-exec).
// Unavailable when the peer closed, DataLoss for a frame over the limit (the
// fds received are closed then).
absl::Status ReadFrameWithFds(int fd, size_t max_frame, std::string* out,
                              std::vector<int>* fds);

// Reads frames from one socket, buffering so that a small frame costs one
// read. Not thread-safe: one reader per socket.
class FrameReader {
 public:
  explicit FrameReader(int fd, size_t max_frame) : fd_(fd), max_(max_frame) {}
  // The next frame's payload into *out. Unavailable when the peer closed,
  // DataLoss for a frame over the limit.
  absl::Status Next(std::string* out);
  // Whether a whole frame is buffered (Next would not read).
  bool HasFrame() const;
  // Fills [dst, dst + n) with the next n bytes of the stream (unframed
  // bytes that follow a frame): what is buffered first, then straight from
  // the socket. Unavailable when the peer closed first.
  absl::Status ReadRaw(char* dst, size_t n);

 private:
  int fd_;
  size_t max_;
  // Unread bytes are buf_[start_, end_); grown, never zero-filled.
  std::unique_ptr<char[]> buf_;
  size_t cap_ = 0, start_ = 0, end_ = 0;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_FRAMES_H_
