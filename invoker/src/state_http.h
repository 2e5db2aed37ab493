// The any-language state API: a small HTTP/1.1 server on 127.0.0.1 inside an
// instance's sandbox. It turns each request into the state request the C++
// SDK would send (silt/state_wire.h) over the worker's state link, and the
// reply into an HTTP answer, so validation and error codes are the state
// service's own. silt-worker runs it for exec functions (`lang: python`,
// `lang: exec`) and tells their processes where it is in SILT_STATE_URL.
//
// Routes. NAME and KEY are percent-decoded path segments (KEY is the rest of
// the path: it may contain '/'); values are the raw request and response
// bodies:
//   GET    /state/maps/NAME/KEY        the value; 404 when absent
//   HEAD   /state/maps/NAME/KEY        200 when present, 404 when absent
//   PUT    /state/maps/NAME/KEY        stores the body; 204
//   DELETE /state/maps/NAME/KEY        204; 404 when absent
//   GET    /state/maps/NAME            {"size":N}
//   POST   /state/vectors/NAME         appends the body; {"index":N}
//   GET    /state/vectors/NAME/INDEX   the element; 404 past the end
//   PUT    /state/vectors/NAME/INDEX   replaces it; 204; 404 past the end
//   GET    /state/vectors/NAME         {"size":N}
//   POST   /state/queues/NAME          pushes the body; 204
//   POST   /state/queues/NAME/pop[?timeout_ms=N]
//                                      the oldest value, waiting up to N ms
//                                      (default 0); 408 when none came
//   GET    /state/queues/NAME          {"size":N}
// Errors: 404 not found, 400 invalid (bad name, bad request), 409 the name
// holds another kind of structure, 413 key or value too large, 408 pop timed
// out, 503 the state service or the node holding the shard is unavailable or
// lost it; a text/plain body says what happened and X-Silt-State-Code names
// the state code. Malformed HTTP gets 400 and the connection is closed.
//
// Lifetime. The server runs only while its worker serves: Start() after the
// worker is ready, resumed or forked, Stop() before it parks, is
// checkpointed or becomes a fork template (no thread, socket or connection of
// it may be in an image or a template). Start() binds the port it had before
// when that is free, so that a long-lived function server started with
// SILT_STATE_URL keeps a valid address across checkpoint and restore.
//
// Thread-safety: Start(), Stop() and port() are called from one thread (the
// worker's main thread). The server thread serves its connections one
// request at a time through the state link, whose own lock serializes it
// with any other user. A queue pop waits in short slices so that the other
// connections are still served while it waits.
#ifndef SILT_INVOKER_STATE_HTTP_H_
#define SILT_INVOKER_STATE_HTTP_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "silt/abi.h"

namespace silt::invoker {

struct StateHttpOptions {
  // Largest request body. The state service itself refuses values over
  // 1 MiB (413 with its message); bodies up to this reach it.
  size_t max_body_bytes = 4u << 20;
  // Largest request line plus headers (a 64 KiB key percent-encoded fits).
  size_t max_head_bytes = 256u << 10;
  // Connections served at once; more wait in the listen backlog.
  int max_connections = 32;
  // How long one step of a waiting queue pop blocks the server thread.
  std::chrono::milliseconds pop_slice{50};
};

class StateHttpServer {
 public:
  // `api` is the worker's state link (never null; outlives the server).
  explicit StateHttpServer(const silt_state_api* api,
                           StateHttpOptions options = {});
  ~StateHttpServer();  // Stop()
  StateHttpServer(const StateHttpServer&) = delete;
  StateHttpServer& operator=(const StateHttpServer&) = delete;

  // Listens on 127.0.0.1, on the previous Start's port if it is free (else
  // on any free port), and starts the server thread. FailedPrecondition if it
  // is running; Unavailable if no socket can be bound.
  absl::Status Start();
  // Stops the thread and closes the listening socket and every connection (a
  // queue pop still waiting is answered 503). Returns once the thread has
  // left the process, so a checkpoint or fork may follow. Idempotent.
  void Stop();

  // The port of the last successful Start (0 before any).
  uint16_t port() const { return port_; }
  // "http://127.0.0.1:PORT".
  std::string url() const;

 private:
  void Run();

  const silt_state_api* api_;
  StateHttpOptions options_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop() wakes the thread's poll
  std::thread thread_;
  std::atomic<int> thread_tid_{0};
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_STATE_HTTP_H_
