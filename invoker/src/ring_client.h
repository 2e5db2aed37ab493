// silt-worker's side of the state mailbox it shares with its invoker
// (state_ring.h): post a request, ring the doorbell, sleep on a futex until
// the reply is there. Not thread-safe (StateLink serialises calls).
#ifndef SILT_INVOKER_RING_CLIENT_H_
#define SILT_INVOKER_RING_CLIENT_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "state_ring.h"

namespace silt::invoker {

class RingClient {
 public:
  RingClient() = default;
  ~RingClient() { Close(); }
  RingClient(const RingClient&) = delete;
  RingClient& operator=(const RingClient&) = delete;

  // Takes the mailbox's memory file and doorbell (closes both; false when
  // they are not a mailbox).
  bool Open(int memory_fd, int doorbell_fd);
  // Unmaps it (before a checkpoint: nothing of the invoker may stay).
  void Close();
  bool usable(size_t request_bytes) const {
    return ring_ != nullptr && request_bytes <= StateRing::kDataBytes;
  }

  enum class Got {
    kReply,     // *reply holds it
    kOnSocket,  // too large for the mailbox: read it from the socketpair
    kBroken,    // the invoker is gone (`socket` hung up)
  };
  Got Call(std::string_view request, std::string* reply, int socket);

 private:
  StateRing* ring_ = nullptr;
  int doorbell_ = -1;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_RING_CLIENT_H_
