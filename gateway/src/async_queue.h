// Durable asynchronous calls (/async-function): the queue of accepted calls,
// the dispatcher that runs them on the nodes, retries with backoff, the
// callbacks and the dead letters.
//
// Every accepted call is a record in the store's async_queue table, fsync'd
// before Enqueue returns, so the gateway's 202 means the call will run at
// least once: a call in flight when the gateway dies is still queued when it
// restarts and runs again; a call whose node dies is retried. The record goes
// once the call has run and its callback (if any) was delivered; one that
// cannot complete stays as a dead letter until it is retried or removed.
//
// Outcomes of one run:
//  - the function answered a status it is not retried on (anything but 408,
//    429, 500, 502, 503, 504): done;
//  - it answered one of those, or timed out, or its node failed: the run
//    counts as an attempt and the call waits (exponential backoff, Retry-After
//    honoured) up to max_attempts runs, then becomes a dead letter;
//  - no node can run the function now: it waits without spending an attempt,
//    for at most max_age since it was accepted;
//  - the function no longer exists: dead letter.
// The callback (X-Callback-Url) receives the final answer (the function's
// status in X-Function-Status, 503 when it never ran), with X-Call-Id,
// X-Function-Name and X-Duration-Seconds; undeliverable callbacks are retried
// the same way, then dead-lettered with the result kept.
#ifndef SILT_GATEWAY_ASYNC_QUEUE_H_
#define SILT_GATEWAY_ASYNC_QUEUE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "http_types.h"
#include "store/store.h"

namespace silt::gateway {

class NodeRegistry;

struct AsyncQueueOptions {
  // Runs of a call before it is dead-lettered.
  uint32_t max_attempts = 10;
  // Waits between attempts double from initial_backoff up to max_backoff.
  std::chrono::milliseconds initial_backoff{std::chrono::seconds(2)};
  std::chrono::milliseconds max_backoff{std::chrono::seconds(120)};
  // A call no node could run for this long since it was accepted is
  // dead-lettered.
  std::chrono::milliseconds max_age{std::chrono::hours(6)};
  // Deliveries of a callback before the call is dead-lettered.
  uint32_t max_callback_attempts = 10;
  std::chrono::milliseconds callback_timeout{std::chrono::seconds(10)};
  // One run's limit (the function's exec_timeout may shorten it).
  std::chrono::milliseconds call_timeout{std::chrono::seconds(60)};
  // Runs of one function's calls at a time; the label
  // com.silt.async.max-inflight overrides it per function.
  uint32_t max_inflight_per_function = 4;
  // Calls waiting (not dead) over all functions before Enqueue refuses.
  size_t max_queued = 100000;
};

// A call as the gateway accepted it.
struct AsyncCall {
  std::string call_id;
  std::string ns, name;
  std::string path = "/";  // after /async-function/NAME
  std::string query;
  HeaderList headers;
  std::string body;
  std::string callback_url;  // http://...; empty: none
};

enum class AsyncState {
  kQueued = 1,    // waiting for a run (or running)
  kCallback = 2,  // ran; its result waits for the callback's delivery
  kDead = 3,      // gave up: `retry` puts it back
};
const char* AsyncStateName(AsyncState s);
// "queued", "callback", "dead"; InvalidArgument otherwise.
absl::StatusOr<AsyncState> ParseAsyncState(absl::string_view s);

struct AsyncView {
  std::string call_id, ns, name;
  AsyncState state = AsyncState::kQueued;
  bool running = false;
  uint32_t attempts = 0;           // runs so far
  uint32_t callback_attempts = 0;  // deliveries tried so far
  int64_t enqueued_unix_ms = 0;
  int64_t next_attempt_unix_ms = 0;
  int last_status = 0;  // the function's (0: never answered)
  std::string last_error;
  std::string callback_url;
};

struct AsyncFilter {
  std::string ns;    // empty: every namespace
  std::string name;  // empty: every function
  bool any_state = true;
  AsyncState state = AsyncState::kQueued;
};

class AsyncQueue {
 public:
  // Loads the queue from the store and starts dispatching. `store` and
  // `nodes` must outlive the queue.
  static absl::StatusOr<std::unique_ptr<AsyncQueue>> Start(
      const AsyncQueueOptions& options, store::Store* store,
      NodeRegistry* nodes);
  ~AsyncQueue();  // stops dispatching; waits for runs and callbacks in flight

  // Durable when OK. AlreadyExists: a call with this id is already held (the
  // caller's retry of the same request: accepted once). ResourceExhausted: the
  // queue is full. The caller validated the call.
  absl::Status Enqueue(AsyncCall call);

  std::vector<AsyncView> List(const AsyncFilter& filter) const;
  // Puts a dead letter back in the queue with its attempts reset (a call whose
  // callback failed gets only the callback again). NotFound; FailedPrecondition
  // when the call is not dead.
  absl::Status Retry(const std::string& call_id);
  // Every dead letter the filter selects; how many.
  absl::StatusOr<size_t> RetryAll(const AsyncFilter& filter);
  // Drops a call that is not running. NotFound; FailedPrecondition while it
  // runs.
  absl::Status Remove(const std::string& call_id);

  // Prometheus text: queue depth, oldest age, runs in flight, dead letters and
  // outcomes, per function.
  std::string RenderMetrics() const;

 private:
  struct Impl;
  explicit AsyncQueue(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_ASYNC_QUEUE_H_
