#include "call_mux.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "call_port.h"
#include "channel.h"

namespace silt::invoker {
namespace {

size_t SizeOf(const v1::WorkerReply& frame) { return frame.body().size() + 64; }

std::chrono::milliseconds Left(CallMux::Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - CallMux::Clock::now()));
}

}  // namespace

CallMux::~CallMux() {
  absl::MutexLock l(&mu_);
  for (auto& [seq, box] : boxes_) close(box.wake);
  for (int fd : spare_wakes_) close(fd);
}

uint64_t CallMux::Begin() {
  absl::MutexLock l(&mu_);
  uint64_t seq = ++next_seq_;
  Box& box = boxes_[seq];
  if (!spare_wakes_.empty()) {
    box.wake = spare_wakes_.back();
    spare_wakes_.pop_back();
  } else {
    box.wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  }
  return seq;
}

void CallMux::End(uint64_t seq) {
  absl::MutexLock l(&mu_);
  auto it = boxes_.find(seq);
  if (it == boxes_.end()) return;
  for (const auto& frame : it->second.frames) queued_bytes_ -= SizeOf(frame);
  if (it->second.wake >= 0) {
    uint64_t drained;
    while (read(it->second.wake, &drained, sizeof(drained)) > 0) {
    }
    spare_wakes_.push_back(it->second.wake);
  }
  boxes_.erase(it);
  HandOff(seq);  // the frames it dropped may have been what held reading up
}

absl::Status CallMux::Send(uint64_t seq, v1::WorkerCall& call) {
  call.set_seq(seq);
  absl::Status s;
  {
    absl::MutexLock w(&write_mu_);
    s = WriteFrame(channel_, call);
  }
  if (!s.ok()) {
    absl::MutexLock l(&mu_);
    if (broken_.ok()) broken_ = s;
    for (const auto& [other, box] : boxes_) Wake(box);
  }
  return s;
}

absl::Status CallMux::Next(uint64_t seq, v1::WorkerReply* reply,
                           Clock::time_point deadline, int watch) {
  absl::MutexLock l(&mu_);
  Box& box = boxes_.at(seq);  // std::map: stays put while others come and go
  while (true) {
    if (!box.frames.empty()) {
      *reply = std::move(box.frames.front());
      box.frames.pop_front();
      queued_bytes_ -= SizeOf(*reply);
      HandOff(seq);
      return absl::OkStatus();
    }
    if (!broken_.ok()) return broken_;
    if (!reading_ && queued_bytes_ < kMaxQueuedBytes) {
      reading_ = true;
      v1::WorkerReply frame;
      absl::Status s;
      bool broke = false;
      mu_.Unlock();
      s = AwaitFrame(channel_, watch, Left(deadline));
      if (s.ok()) {
        // A frame is coming: it is read whole (a read that stopped halfway
        // would leave the channel out of step for every call).
        s = ReadFrame(channel_, &frame,
                      std::max(Left(deadline), std::chrono::milliseconds(100)));
        broke = !s.ok();
      } else {
        broke = !absl::IsDeadlineExceeded(s) && !absl::IsCancelled(s);
      }
      mu_.Lock();
      reading_ = false;
      if (broke) {
        if (broken_.ok()) broken_ = s;
        for (const auto& [other, b] : boxes_) Wake(b);
        return broken_;
      }
      if (!s.ok()) {  // this call's time is up, or its caller left
        HandOff(seq);
        return s;
      }
      if (auto owner = boxes_.find(frame.seq()); owner != boxes_.end()) {
        queued_bytes_ += SizeOf(frame);
        owner->second.frames.push_back(std::move(frame));
        if (owner->first != seq) Wake(owner->second);
      }  // else a frame of a call that ended: dropped
      continue;
    }
    box.waiting = true;
    int wake = box.wake;
    mu_.Unlock();
    Woke why = Sleep(wake, watch, deadline);
    mu_.Lock();
    box.waiting = false;
    uint64_t drained;
    while (read(wake, &drained, sizeof(drained)) > 0) {
    }
    if (why == Woke::kByCaller) {
      HandOff(seq);
      return absl::CancelledError("the caller's connection closed");
    }
    if (why == Woke::kByDeadline && box.frames.empty() && broken_.ok()) {
      HandOff(seq);
      return absl::DeadlineExceededError("no frame in time");
    }
  }
}

size_t CallMux::queued_bytes() {
  absl::MutexLock l(&mu_);
  return queued_bytes_;
}

void CallMux::HandOff(uint64_t seq) {
  // The reader reads on; or nobody may until calls take what is queued.
  if (reading_ || queued_bytes_ >= kMaxQueuedBytes) return;
  // A waiting call with a frame was woken when it came: it reads next only
  // if nothing else does.
  for (const auto& [other, box] : boxes_) {
    if (other != seq && box.waiting && box.frames.empty()) {
      Wake(box);
      return;
    }
  }
}

void CallMux::Wake(const Box& box) {
  uint64_t one = 1;
  if (box.wake >= 0) (void)!write(box.wake, &one, sizeof(one));
}

CallMux::Woke CallMux::Sleep(int wake, int watch, Clock::time_point deadline) {
  while (true) {
    pollfd p[2] = {{wake, POLLIN, 0}, {watch, POLLIN | POLLRDHUP, 0}};
    int n = poll(p, 2, static_cast<int>(Left(deadline).count()));
    if (n < 0 && errno == EINTR) continue;
    if (n > 0 && p[1].revents != 0) return Woke::kByCaller;
    if (n > 0) return Woke::kByMux;
    // Timed out (or poll failed: the caller gives up as at a timeout).
    return Woke::kByDeadline;
  }
}

}  // namespace silt::invoker
