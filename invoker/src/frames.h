// Length-prefixed byte frames (u32 little-endian length, then the bytes) on a
// blocking stream socket: the state data path (silt-worker <-> invoker, and
// invoker <-> invoker). Protobuf frames for control stay in channel.h.
#ifndef SILT_INVOKER_FRAMES_H_
#define SILT_INVOKER_FRAMES_H_

#include <cstddef>
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

 private:
  int fd_;
  size_t max_;
  // Unread bytes are buf_[start_, end_); grown, never zero-filled.
  std::unique_ptr<char[]> buf_;
  size_t cap_ = 0, start_ = 0, end_ = 0;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_FRAMES_H_
