// The invoker's lease port (invoker/call_wire.h, "Leases"): an abstract unix
// socket where a gateway in this network namespace leases warm instances and
// then calls them itself. The port is the transport: what is lent, and what
// a return does, is its handlers' (the invoker's pools). Each connection is
// served on a thread of its own, one frame at a time.
//
// Thread safety: thread-safe. Handlers of one connection run one at a time,
// on its thread; those of different connections at once.
#ifndef SILT_INVOKER_LEASE_PORT_H_
#define SILT_INVOKER_LEASE_PORT_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "conn_server.h"
#include "invoker/call_wire.h"
#include "peer_wire.h"

namespace silt::invoker {

class LeasePort {
 public:
  // An instance lent: its lease, its id, its channel (passed to the gateway;
  // the instance keeps its own) and the function's longest call.
  struct Lent {
    uint64_t lease = 0;
    std::string instance;
    int channel = -1;
    uint32_t timeout_ms = 0;
  };
  struct Handlers {
    // An idle instance of the version lent on connection `conn`; nullopt
    // when none is (the gateway uses the call port meanwhile).
    std::function<std::optional<Lent>(uint64_t conn,
                                      const call_wire::LeaseAsk&)>
        lend;
    // A lease of `conn` given back (or checked). The answer is sent when
    // call_wire::ReturnAnswered(how).
    std::function<call_wire::Returned(uint64_t conn, const call_wire::Return&)>
        take_back;
    // Connection `conn` closed: what is still lent on it comes back broken.
    std::function<void(uint64_t conn)> closed;
  };

  // Listens on "@`name`". Connections must open with `key`, which must
  // outlive the port.
  static absl::StatusOr<std::unique_ptr<LeasePort>> Listen(
      const std::string& name, const DataKey& key, Handlers handlers);
  ~LeasePort();  // Stop()
  LeasePort(const LeasePort&) = delete;
  LeasePort& operator=(const LeasePort&) = delete;

  // "@name": what the gateway connects to (Register.call_socket).
  const std::string& address() const { return server_->address(); }

  // Asks the gateway on `conn` to give `lease` back once its call ends. A
  // connection that is gone has given it back already (closed).
  void Recall(uint64_t conn, uint64_t lease);

  // Closes every connection and joins their threads (each one's `closed`
  // has run). Idempotent.
  void Stop();

 private:
  struct Conn {
    explicit Conn(int fd) : fd(fd) {}
    const int fd;
    std::mutex write_mu;  // a frame at a time: answers and recalls
  };
  LeasePort(const DataKey& key, Handlers handlers)
      : key_(key), handlers_(std::move(handlers)) {}
  void Serve(int fd);
  // One frame, with `fd` passed along when >= 0. False when the peer is gone.
  static bool Send(Conn& conn, const std::string& frame, int fd = -1);

  const DataKey& key_;
  const Handlers handlers_;
  std::unique_ptr<ConnServer> server_;
  absl::Mutex mu_;
  uint64_t next_conn_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_LEASE_PORT_H_
