// The instances' state data path on one invoker: a single epoll thread reads
// every instance's state connection, answers what it can at once (an
// operation on a shard held here), forwards operations on other nodes' shards
// over one multiplexed connection per peer, and hands everything else (first
// use of a structure, multi-shard operations, queue pops that wait, MOVED
// follow-ups) to a small pool of threads that may block.
//
// Why one thread and not one per connection: under load a loop wakes once for
// many ready connections, and all requests for a peer that arrive together
// leave in one write and come back in one read (the peer answers a batch with
// one write), so an operation on a remote shard costs about what a Redis
// request costs instead of four thread wake-ups and two TCP round trips.
#ifndef SILT_INVOKER_STATE_LOOP_H_
#define SILT_INVOKER_STATE_LOOP_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace silt::invoker {

// What the loop asks of the proclet host.
struct StateLoopBackend {
  // How to serve one request without blocking.
  struct Fast {
    enum class Path { kSlow, kReply, kForward } path = Path::kSlow;
    std::string reply;  // kReply: the answer
    std::string peer;   // kForward: the data address of the shard's node
    std::string frame;  // kForward: the frame to send there
  };
  // Must not block (no waiting on a frozen shard, no directory call).
  std::function<Fast(const std::string& ns, std::string_view request)> fast;
  // Serves a request fully (may block: runs on a pool thread).
  std::function<std::string(const std::string& ns, const std::string& function,
                            std::string_view request)>
      slow;
  // A kShareMap request (the instance maps the arenas of the map shards
  // held here and reads them itself): the reply, and the arenas' memory files
  // (dup'd; the loop sends them along and closes them). May block.
  struct Shared {
    std::string reply;
    std::vector<int> fds;
  };
  std::function<Shared(const std::string& ns, std::string_view request)> share;
  // A peer's reply to a forwarded frame; false: serve the request on the
  // slow path instead (it moved, or its node is unreachable).
  std::function<bool(std::string_view reply)> final_reply;
  // The reply when a forwarded frame's connection broke after it was sent
  // (it may or may not have been applied: never retried).
  std::function<std::string(const std::string& peer)> broken_reply;
  // The first frame of a new connection to a peer; empty: none can be made
  // yet (requests for peers then go the slow way).
  std::function<std::string()> hello;
  // The reply to a request that failed here (a bug caught at the boundary).
  std::function<std::string()> internal_error;
};

class StateLoop {
 public:
  static absl::StatusOr<std::unique_ptr<StateLoop>> Start(
      StateLoopBackend backend, size_t max_frame_bytes);
  ~StateLoop();  // stops the loop and the pool, closes every connection

  // Serves an instance's state connection (takes the fd) until it closes.
  void Attach(int fd, const std::string& ns, const std::string& function);

 private:
  struct Impl;
  explicit StateLoop(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_STATE_LOOP_H_
