// Function calls to one invoker's call port (invoker/call_wire.h), over
// connections kept per io_context (the gateway runs one per thread), one call
// per connection at a time. A call asked for on a thread that runs one of the
// io_contexts (the HTTP request's) is written from that thread, and its reply
// is read and handed over on that same thread: no thread in between.
//
// Thread safety: thread-safe. Asio stays in call_client.cc.
#ifndef SILT_GATEWAY_CALL_CLIENT_H_
#define SILT_GATEWAY_CALL_CLIENT_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "http_types.h"
#include "invoker/call_wire.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace silt::gateway {

class CallClient {
 public:
  // The reply; or, for a streamed one, its head (Reply::head) and the rest of
  // its body, to be pulled (or cancelled) by the caller: the connection is
  // taken until the body ends. `rest` is null for a whole reply.
  using Done = std::function<void(absl::StatusOr<invoker::call_wire::Reply>,
                                  std::shared_ptr<BodyStream> rest)>;

  // Calls to `address` (host:port), each connection opening with `key`. The
  // io_contexts (at least one) must outlive the client.
  CallClient(const std::vector<boost::asio::io_context*>& contexts,
             std::string address, std::string key);
  // Closes the idle connections; calls in flight go on to their end.
  ~CallClient();
  CallClient(const CallClient&) = delete;
  CallClient& operator=(const CallClient&) = delete;

  const std::string& address() const;

  // Sends one call (a whole kRequest frame, shared so that a caller can send
  // it again elsewhere without a copy). `done` runs exactly once, on an
  // io_context thread or, when the client is closed, right here: the reply;
  // Unavailable when the node could not be reached or the connection broke
  // before the reply (a connection kept from an earlier call that turns out
  // closed is replaced once, silently); DeadlineExceeded when no reply came
  // by `deadline` (the connection is closed). The deadline covers a streamed
  // body too: past it the body breaks off.
  //
  // `body`: the rest of the request's body when `request_frame` is a
  // kRequestHead; its parts are pulled and sent before the reply is read. A
  // body that fails fails the call with its status; a connection lost once
  // a part was asked for fails it with Aborted (it cannot be sent again).
  void Call(std::shared_ptr<const std::string> request_frame,
            std::chrono::steady_clock::time_point deadline, Done done,
            std::shared_ptr<BodyStream> body = nullptr);

  // Closes the idle connections and fails the calls in flight with
  // Unavailable (their `done` runs on an io_context thread if it still runs).
  // Later calls fail at once. Idempotent.
  void Close();

 private:
  struct Pool;
  struct Conn;
  // The pool for the io_context this thread runs (else one in turn).
  Pool& PoolHere();

  std::vector<std::shared_ptr<Pool>> pools_;  // one per io_context
  std::atomic<size_t> next_{0};
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_CALL_CLIENT_H_
