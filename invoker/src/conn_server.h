// A TCP listener that serves each connection, in order, on a thread of its
// own: the shape of both of the invoker's ports (the data port, for peers,
// and the call port, for the gateway), whose requests block while a shard
// moves or an instance works.
//
// Thread safety: thread-safe. The server owns its listener, its acceptor
// thread and the connections with their threads (guarded by its mutex).
#ifndef SILT_INVOKER_CONN_SERVER_H_
#define SILT_INVOKER_CONN_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace silt::invoker {

class ConnServer {
 public:
  // Serves one connection until it returns; the server closes the fd then.
  using Serve = std::function<void(int fd)>;

  // Binds `listen` (IPv4 host:port; port 0 picks one) without accepting yet.
  // InvalidArgument for a bad address, Unavailable when it cannot listen.
  static absl::StatusOr<std::unique_ptr<ConnServer>> Listen(
      const std::string& listen, Serve serve);
  // Binds the abstract unix socket "@`name`" (reachable only from this
  // network namespace) without accepting yet; address() is "@name".
  static absl::StatusOr<std::unique_ptr<ConnServer>> ListenAbstract(
      const std::string& name, Serve serve);
  ~ConnServer();  // Shutdown(), then Join()
  ConnServer(const ConnServer&) = delete;
  ConnServer& operator=(const ConnServer&) = delete;

  // host:port (with the port picked when 0 was asked for).
  const std::string& address() const { return address_; }
  // Starts accepting (once).
  void StartAccepting();
  // Stops accepting and shuts down every connection; their threads may still
  // be finishing what they were doing (Join). Idempotent.
  void Shutdown();
  // Joins the connection threads and closes the listener. Call after
  // Shutdown(). Idempotent.
  void Join();

 private:
  ConnServer(int listener, std::string address, Serve serve);
  void AcceptLoop();
  void Spawn(int fd);

  const Serve serve_;
  // Written only before the acceptor starts and after it is joined.
  int listener_;
  const std::string address_;
  std::thread acceptor_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_conn_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, int> conn_fds_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::thread> conn_threads_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_CONN_SERVER_H_
