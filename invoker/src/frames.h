// Length-prefixed byte frames (u32 little-endian length, then the bytes) on a
// blocking stream socket: the state data path (silt-worker <-> invoker, and
// invoker <-> invoker). Protobuf frames for control stay in channel.h.
#ifndef SILT_INVOKER_FRAMES_H_
#define SILT_INVOKER_FRAMES_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace silt::invoker {

// Writes one frame (one sendmsg for header and payload). Unavailable when the
// peer is gone.
absl::Status WriteBytesFrame(int fd, std::string_view payload);

// Reads frames from one socket, buffering so that a small frame costs one
// read. Not thread-safe: one reader per socket.
class FrameReader {
 public:
  explicit FrameReader(int fd, size_t max_frame) : fd_(fd), max_(max_frame) {}
  // The next frame's payload into *out. Unavailable when the peer closed,
  // DataLoss for a frame over the limit.
  absl::Status Next(std::string* out);

 private:
  int fd_;
  size_t max_;
  std::string buf_;
  size_t start_ = 0;  // unread bytes are buf_[start_, buf_.size())
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_FRAMES_H_
