// Compute jobs: the futures that silt::Context::ParallelFor, Map and Spawn
// (silt/function.h) return, and the requests behind them. A job runs as
// compute proclets: shares of its work that the function's invoker hands to
// instances of the same function on nodes with free CPU (this one or
// others), each in its own sandbox.
#ifndef SILT_COMPUTE_H_
#define SILT_COMPUTE_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "silt/abi.h"
#include "silt/state.h"
#include "silt/state_wire.h"

namespace silt {

struct TaskOptions {
  // The elements of an input vector to run over: [first, first + count), to
  // the end with wire::kAll. A job over a map runs over all of it.
  uint64_t first = 0;
  uint64_t count = wire::kAll;
  // Whether fn may run again for an element when the node running it is lost
  // mid-way (a ParallelFor or Spawn: at-least-once). Without it such a job
  // fails with kUnavailable instead. A Map always may: its output is written
  // by the runtime, so running an element twice writes the same value.
  bool idempotent = false;
};

// Where a job's work ran: per node, the elements (1 for a Spawn) and shares
// its compute proclets did there.
struct JobPlacement {
  std::string node;
  uint64_t elements = 0;
  uint32_t shares = 0;
};

// How far a ParallelFor or Map had got: elements done by the end of a share
// (wall clock, microseconds since the Unix epoch), in the order shares
// ended (the first 4096 shares).
struct JobProgress {
  int64_t unix_us = 0;
  uint64_t done = 0;
};

// The outcome of a job, once it ends. Movable, not copyable; Get() may be
// called again and returns the same outcome.
template <typename T>
class Future {
 public:
  Future(const silt_state_api* api, uint64_t id) : api_(api), id_(id) {}
  // A job that could not start.
  Future(StateCode code, std::string message)
      : done_(Result<T>(code, std::move(message))) {}
  Future(Future&&) = default;
  Future& operator=(Future&&) = default;

  // Blocks until the job ends: its result or why it failed.
  const Result<T>& Get() {
    while (!done_) Poll(1000);
    return *done_;
  }
  // Once it ended well: where it ran.
  const std::vector<JobPlacement>& placement() const { return placement_; }
  // Once it ended well: its progress over time (empty for a Spawn, or from
  // an invoker that does not record it).
  const std::vector<JobProgress>& progress() const { return progress_; }
  // Waits up to `timeout`; true when the job has ended.
  bool WaitFor(std::chrono::milliseconds timeout) {
    if (!done_) Poll(static_cast<uint32_t>(timeout.count()));
    return done_.has_value();
  }

 private:
  void Poll(uint32_t timeout_ms) {
    std::string req;
    wire::WriteRequestHeader(&req, wire::StateOp::kJobWait,
                             wire::StateKind::kVector, {});
    wire::Writer w(&req);
    w.U64(id_);
    w.U32(timeout_ms);
    std::string reply;
    if (api_ == nullptr ||
        api_->call(api_->host, req.data(), req.size(), &reply,
                   internal::AppendTo) != 0 ||
        reply.empty()) {
      done_ = Result<T>(StateCode::kUnavailable,
                        "lost the connection to the invoker running the job");
      return;
    }
    auto code = static_cast<StateCode>(static_cast<uint8_t>(reply[0]));
    if (code == StateCode::kRetry) return;  // still running
    if (code != StateCode::kOk) {
      done_ = Result<T>(code, reply.substr(1));
      return;
    }
    wire::Reader r(std::string_view(reply).substr(1));
    std::string_view result;
    if (!r.Str(&result)) {
      done_ = Result<T>(StateCode::kInternal, "bad reply");
      return;
    }
    uint32_t n = 0;
    (void)r.U32(&n);
    for (uint32_t i = 0; i < n; ++i) {
      JobPlacement p;
      std::string_view node;
      if (!r.Str(&node) || !r.U64(&p.elements) || !r.U32(&p.shares)) break;
      p.node = std::string(node);
      placement_.push_back(std::move(p));
    }
    uint32_t m = 0;
    if (r.U32(&m)) {
      for (uint32_t i = 0; i < m; ++i) {
        uint64_t at = 0, done = 0;
        if (!r.U64(&at) || !r.U64(&done)) break;
        progress_.push_back({static_cast<int64_t>(at), done});
      }
    }
    if constexpr (std::is_same_v<T, Done>) {
      done_ = Result<T>(Done{});
    } else {
      done_ = internal::DecodeOne<T>(result);
    }
  }

  const silt_state_api* api_ = nullptr;
  uint64_t id_ = 0;
  std::optional<Result<T>> done_;
  std::vector<JobPlacement> placement_;
  std::vector<JobProgress> progress_;
};

namespace internal {

// Asks the invoker to start a job; its future.
template <typename T>
Future<T> StartJob(const silt_state_api* api, wire::JobKind kind,
                   wire::StateKind input_kind, std::string_view task,
                   std::string_view input, std::string_view output,
                   std::string_view argument, const TaskOptions& o) {
  std::string req;
  wire::WriteRequestHeader(&req, wire::StateOp::kJobStart, input_kind, input);
  wire::Writer w(&req);
  w.U8(static_cast<uint8_t>(kind));
  w.Str(task);
  w.Str(output);
  w.U64(o.first);
  w.U64(o.count);
  w.Str(argument);
  w.U8(o.idempotent ? wire::kJobIdempotent : 0);
  std::string reply;
  if (api == nullptr ||
      api->call(api->host, req.data(), req.size(), &reply, AppendTo) != 0 ||
      reply.empty())
    return Future<T>(StateCode::kUnavailable,
                     "the invoker cannot be reached to run the job");
  auto code = static_cast<StateCode>(static_cast<uint8_t>(reply[0]));
  if (code != StateCode::kOk) return Future<T>(code, reply.substr(1));
  wire::Reader r(std::string_view(reply).substr(1));
  uint64_t id;
  if (!r.U64(&id)) return Future<T>(StateCode::kInternal, "bad reply");
  return Future<T>(api, id);
}

}  // namespace internal
}  // namespace silt

#endif  // SILT_COMPUTE_H_
