// The invoker's call port: where the gateway's calls arrive
// (invoker/call_wire.h). Each connection carries one call at a time and is
// served on a thread of its own, which runs the call in an instance itself.
//
// Thread safety: thread-safe; the handler is called from many threads at once.
#ifndef SILT_INVOKER_CALL_PORT_H_
#define SILT_INVOKER_CALL_PORT_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "conn_server.h"
#include "frames.h"
#include "invoker/call_wire.h"
#include "peer_wire.h"

namespace silt::invoker {

// The head and parts of a streamed reply, sent on the call's connection while
// the call runs (call_wire.h): Head once, then Part any number of times; the
// handler's Reply ends it. Each returns false once the connection is gone.
// Used by the connection's own thread only.
class ReplyStream {
 public:
  explicit ReplyStream(int fd) : fd_(fd) {}
  bool Head(const call_wire::Reply& head);  // sent as a kReplyHead
  bool Part(std::string_view bytes);
  bool started() const { return started_; }
  bool broken() const { return broken_; }
  int fd() const { return fd_; }  // the gateway's connection

 private:
  const int fd_;
  bool started_ = false, broken_ = false;
  std::string out_;
};

// The rest of a streamed request body (call_wire.h kRequestHead), read from
// the call's connection as the call consumes it. Used by the connection's
// own thread only.
class RequestBody {
 public:
  explicit RequestBody(FrameReader& reader) : reader_(reader) {}
  // The next part (valid until the next call); *last once it is the final
  // one. Unavailable when the connection broke off or sent something else
  // (the body is then over too).
  absl::Status Next(std::string_view* bytes, bool* last);
  bool done() const { return done_; }
  // Reads and drops what is left (a call that did not run).
  absl::Status Drain();

 private:
  FrameReader& reader_;
  std::string frame_;
  bool done_ = false;
};

// Waits until `channel` has something to read. Cancelled as soon as `watch`
// has anything (a connection that must stay quiet meanwhile: it closed, or
// broke its protocol), DeadlineExceeded after `timeout`.
absl::Status AwaitFrame(int channel, int watch,
                        std::chrono::milliseconds timeout);

class CallPort {
 public:
  // Runs one call to its end and fills in its reply (or its end, after a
  // streamed head). `body`: the rest of a streamed request body (null when
  // `req` holds it whole); what the handler leaves of it is drained.
  using Handler =
      std::function<void(call_wire::Request& req, RequestBody* body,
                         call_wire::Reply* reply, ReplyStream& stream)>;

  // Binds `listen` (IPv4 host:port; 0 picks a port) and starts accepting.
  // Connections must open with `key` (they are closed until it is set).
  // `key` must outlive the port.
  static absl::StatusOr<std::unique_ptr<CallPort>> Listen(
      const std::string& listen, const DataKey& key, Handler handler);
  ~CallPort();  // Stop()

  const std::string& address() const { return server_->address(); }
  // Takes no more calls and waits for those running to end. Idempotent.
  void Stop();

 private:
  CallPort(const DataKey& key, Handler handler);
  void ServeGateway(int fd);

  const DataKey& key_;
  const Handler handler_;
  std::unique_ptr<ConnServer> server_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_CALL_PORT_H_
