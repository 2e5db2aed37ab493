// Calls in flight at once on one instance's channel: a function that takes
// several (SILT_CONCURRENCY; worker_main.cc CallThreads).
//
// Each WorkerCall carries a seq that the worker echoes in its replies. The
// calls waiting for frames take turns reading the channel for all of them
// (leader/follower): the reader hands each frame to its call and, once it has
// its own, wakes one waiting call to read on. The mux has no thread: between
// calls the channel is as quiet as that of an instance taking one call at a
// time, so it may be parked, templated or checkpointed the same way.
//
// Frames read for calls that have not taken them yet are held here, up to
// kMaxQueuedBytes: past that nobody reads the channel until calls take theirs
// (a streamed reply whose caller reads slowly holds the others up rather than
// filling the invoker's memory; the worker's writes then wait on the channel).
#ifndef SILT_INVOKER_CALL_MUX_H_
#define SILT_INVOKER_CALL_MUX_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "invoker/proto/worker.pb.h"

namespace silt::invoker {

class CallMux {
 public:
  using Clock = std::chrono::steady_clock;

  // `channel` stays the caller's (the instance's); the mux only uses it.
  explicit CallMux(int channel) : channel_(channel) {}
  ~CallMux();
  CallMux(const CallMux&) = delete;
  CallMux& operator=(const CallMux&) = delete;

  // Registers a call: the seq to send it with (Send sets it) and to read its
  // frames by. Each Begin is followed by one End.
  uint64_t Begin();
  // Sends `call` as call `seq`. An error breaks the channel for every call.
  absl::Status Send(uint64_t seq, v1::WorkerCall& call);
  // The next frame of call `seq`. DeadlineExceeded at `deadline`; Cancelled
  // when `watch` (if >= 0: the caller's connection) becomes readable or
  // closes; Unavailable (or the read's error) once the channel broke, for
  // every call from then on.
  absl::Status Next(uint64_t seq, v1::WorkerReply* reply,
                    Clock::time_point deadline, int watch = -1);
  // Forgets call `seq`: frames that still come for it are dropped.
  void End(uint64_t seq);

  static constexpr size_t kMaxQueuedBytes = 8u << 20;
  // The bytes of frames held for calls that have not taken them yet.
  size_t queued_bytes();

 private:
  struct Box {
    std::deque<v1::WorkerReply> frames;
    int wake = -1;  // an eventfd: written when a frame (or the turn) came
    bool waiting = false;  // polls `wake`
  };
  // As call `seq` leaves Next: if no call reads the channel, wakes one
  // that waits with nothing to take, to read on.
  void HandOff(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Wake(const Box& box);
  enum class Woke { kByMux, kByCaller, kByDeadline };
  // Waits for `wake` (the call's eventfd) or `watch` until `deadline`.
  static Woke Sleep(int wake, int watch, Clock::time_point deadline);

  const int channel_;
  absl::Mutex write_mu_;  // one frame at a time onto the channel
  absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Box> boxes_ ABSL_GUARDED_BY(mu_);
  std::vector<int> spare_wakes_
      ABSL_GUARDED_BY(mu_);                    // eventfds of ended calls
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a call has the read turn
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_CALL_MUX_H_
