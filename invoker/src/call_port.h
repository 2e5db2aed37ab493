// The invoker's call port: where the gateway's calls arrive
// (invoker/call_wire.h). Each connection carries one call at a time and is
// served on a thread of its own, which runs the call in an instance itself.
//
// Thread safety: thread-safe; the handler is called from many threads at once.
#ifndef SILT_INVOKER_CALL_PORT_H_
#define SILT_INVOKER_CALL_PORT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "conn_server.h"
#include "invoker/call_wire.h"
#include "peer_wire.h"

namespace silt::invoker {

class CallPort {
 public:
  // Runs one call to its end and fills in its reply.
  using Handler =
      std::function<void(call_wire::Request& req, call_wire::Reply* reply)>;

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
