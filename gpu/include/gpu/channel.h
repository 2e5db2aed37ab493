// The framing between the invoker and a GPU proclet's process
// (silt-gpu-host) over their socket pair: each message a u64 length (host
// byte order) and that many bytes. Requests and replies are gpu::Proclet's
// (proclet.h).
#ifndef SILT_GPU_CHANNEL_H_
#define SILT_GPU_CHANNEL_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace silt::gpu {

// The largest message either side accepts.
inline constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 40;

// Writes one message: `parts` joined (without copying them together). False
// when the peer is gone (no SIGPIPE).
bool WriteFrame(int fd, std::initializer_list<std::string_view> parts);
// Reads one message into *out. False at the end of the stream, on an error,
// or for one longer than kMaxFrameBytes.
bool ReadFrame(int fd, std::string* out);

}  // namespace silt::gpu

#endif  // SILT_GPU_CHANNEL_H_
