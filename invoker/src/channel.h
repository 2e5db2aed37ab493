// Length-prefixed protobuf messages on a stream socket (invoker <->
// silt-worker).
#ifndef SILT_INVOKER_CHANNEL_H_
#define SILT_INVOKER_CHANNEL_H_

#include <chrono>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"

namespace silt::invoker {

inline constexpr size_t kMaxFrameBytes = 256u << 20;

absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& msg);
// Waits at most `timeout` (negative: forever). DeadlineExceeded on timeout,
// Unavailable when the peer closed the channel.
absl::Status ReadFrame(
    int fd, google::protobuf::MessageLite* msg,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

// Passes open file descriptors (SCM_RIGHTS) with one marker byte. Frames and
// fd passes are not interleaved by either side: a pass comes before the frame
// that needs it.
absl::Status SendFds(int sock, const int* fds, int count);
// Receives exactly `count` descriptors (close-on-exec) into `fds`.
absl::Status RecvFds(
    int sock, int* fds, int count,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

}  // namespace silt::invoker

#endif  // SILT_INVOKER_CHANNEL_H_
