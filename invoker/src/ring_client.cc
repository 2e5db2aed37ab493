#include "ring_client.h"

#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace silt::invoker {
namespace {

bool HungUp(int socket) {
  pollfd p{socket, POLLRDHUP, 0};
  return poll(&p, 1, 0) != 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

}  // namespace

bool RingClient::Open(int memory_fd, int doorbell_fd) {
  Close();
  struct stat st;
  void* p = MAP_FAILED;
  if (fstat(memory_fd, &st) == 0 &&
      static_cast<size_t>(st.st_size) >= sizeof(StateRing))
    p = mmap(nullptr, sizeof(StateRing), PROT_READ | PROT_WRITE, MAP_SHARED,
             memory_fd, 0);
  close(memory_fd);
  if (p == MAP_FAILED) {
    close(doorbell_fd);
    return false;
  }
  ring_ = static_cast<StateRing*>(p);
  doorbell_ = doorbell_fd;
  return true;
}

void RingClient::Close() {
  if (ring_ != nullptr) munmap(ring_, sizeof(StateRing));
  if (doorbell_ >= 0) close(doorbell_);
  ring_ = nullptr;
  doorbell_ = -1;
}

RingClient::Got RingClient::Call(std::string_view request, std::string* reply,
                                 int socket) {
  memcpy(ring_->data, request.data(), request.size());
  ring_->len.store(static_cast<uint32_t>(request.size()),
                   std::memory_order_relaxed);
  ring_->state.store(kRingRequest, std::memory_order_release);
  const uint64_t one = 1;
  if (write(doorbell_, &one, sizeof(one)) != sizeof(one)) return Got::kBroken;
  while (true) {
    uint32_t state = ring_->state.load(std::memory_order_acquire);
    if (state == kRingReply) {
      const uint32_t len = std::min<uint32_t>(
          ring_->len.load(std::memory_order_relaxed), StateRing::kDataBytes);
      reply->assign(ring_->data, len);
      ring_->state.store(kRingIdle, std::memory_order_relaxed);
      return Got::kReply;
    }
    if (state == kRingReplyOnSocket) {
      ring_->state.store(kRingIdle, std::memory_order_relaxed);
      return Got::kOnSocket;
    }
    // Announce the sleep, then look again (the loop stores the state before
    // it looks at `waiting`), then sleep unless it changed meanwhile.
    ring_->waiting.store(1, std::memory_order_seq_cst);
    state = ring_->state.load(std::memory_order_seq_cst);
    if (state == kRingRequest || state == kRingIdle) {
      timespec second{1, 0};  // now and then: is the invoker still there?
      long r = syscall(SYS_futex, reinterpret_cast<uint32_t*>(&ring_->state),
                       FUTEX_WAIT, state, &second, nullptr, 0);
      if (r != 0 && errno == ETIMEDOUT && HungUp(socket)) {
        ring_->waiting.store(0, std::memory_order_relaxed);
        return Got::kBroken;
      }
    }
    ring_->waiting.store(0, std::memory_order_relaxed);
  }
}

}  // namespace silt::invoker
