// The shared-memory mailbox between an instance (silt-worker) and its
// invoker's state loop: the instance writes a request into it and rings a
// doorbell (an eventfd in the loop's epoll set); the loop writes the reply
// back and wakes the instance with a futex on `state` if it sleeps. Compared
// with a frame each way over the instance's socketpair this takes no socket
// buffers (allocated and charged per message), and no spurious wake-up of the
// instance when the invoker reads its request (a unix socket signals write
// space to whoever sleeps on it). The socketpair stays: it carries what does
// not fit, the memory files of kShareMap, and tells each side when the other
// is gone.
//
// The instance can write anything into the page: the loop reads `len` once,
// bounds it and copies the request out before looking at it.
#ifndef SILT_INVOKER_STATE_RING_H_
#define SILT_INVOKER_STATE_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace silt::invoker {

enum RingState : uint32_t {
  kRingIdle = 0,
  kRingRequest = 1,        // the instance posted a request
  kRingReply = 2,          // the reply is in data
  kRingReplyOnSocket = 3,  // the reply (too large) comes on the socketpair
};

struct StateRing {
  static constexpr size_t kDataBytes = 256 * 1024 - 64;
  std::atomic<uint32_t> state;    // RingState; the instance's futex word
  std::atomic<uint32_t> waiting;  // the instance sleeps on `state`
  std::atomic<uint32_t> len;      // bytes of the request or reply in data
  uint32_t reserved[13];
  char data[kDataBytes];
};
static_assert(sizeof(StateRing) == 256 * 1024);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

}  // namespace silt::invoker

#endif  // SILT_INVOKER_STATE_RING_H_
