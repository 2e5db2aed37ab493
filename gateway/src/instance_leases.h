// Calls straight to instances leased from an invoker on this machine
// (invoker/call_wire.h, "Leases"): the node-local call path. A call runs on
// an idle lease from the thread that parsed the HTTP request (any gateway
// thread: a lease's channel is registered with the io_context of the thread
// that calls it, and moves only when a call on another thread takes it),
// writing the instance's frame (worker.proto) to its channel and reading the
// answer on that same thread: the invoker is not on the path, so a warm call
// crosses the same processes as one nginx hop (client, gateway, instance).
// A call that finds every lease of its function busy waits for one, a few
// milliseconds at most. What the lease path does not take goes to the call
// port (call_client.h), where the invoker queues it or starts an instance as
// for any call: a call to a function with no lease or whose wait ran out (a
// lease is asked for after it), a streamed
// request body, a forced cold start. A lease is given back after kIdleHold
// without a call, when the invoker recalls it (a call through the call port
// waits for an instance) and when its instance breaks.
//
// Thread safety: thread-safe. Asio stays in instance_leases.cc.
#ifndef SILT_GATEWAY_INSTANCE_LEASES_H_
#define SILT_GATEWAY_INSTANCE_LEASES_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "call_client.h"
#include "invoker/call_wire.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace silt::gateway {
namespace leases {
struct Core;  // the lease connection and the leases (instance_leases_impl.h)
}  // namespace leases

class InstanceLeases {
 public:
  // A lease not used for this long goes back (the invoker's idle instances
  // are its to reap, checkpoint or hand to other callers).
  static constexpr std::chrono::milliseconds kIdleHold{250};

  // Connects to the invoker's lease port `socket` ("@name") and says `key`.
  // Unavailable when it cannot be reached (the invoker runs in another
  // network namespace: its calls go to its call port).
  static absl::StatusOr<std::unique_ptr<InstanceLeases>> Connect(
      const std::vector<boost::asio::io_context*>& contexts,
      const std::string& socket, const std::string& key);
  ~InstanceLeases();  // Close()
  InstanceLeases(const InstanceLeases&) = delete;
  InstanceLeases& operator=(const InstanceLeases&) = delete;

  // Runs `req` (a whole-body request, cold start kAny) on an instance of its
  // function version leased here. kStarted: on an idle one, at once. kWaits:
  // every lease of it is busy (or one is asked for), and the call waits for
  // one, at most 5 ms, then `elsewhere` runs instead (the call port,
  // where the invoker starts an instance, queues the call or refuses it).
  // Either way `done` runs once, as CallClient::Call's does (a 502 saying
  // why when the instance died; DeadlineExceeded past the function's time),
  // unless `elsewhere` runs; `req` must live until one of them has. kNo:
  // none is leased or asked for (or this thread runs none of the
  // io_contexts), and nothing is touched.
  enum class Took { kNo, kStarted, kWaits };
  Took TryCall(invoker::call_wire::Request& req, CallClient::Done& done,
               std::function<void()>& elsewhere);

  // A call of the function version went through the call port and was
  // answered: its instance is idle on the node now, and a lease of it is
  // asked for (unless one is idle here or asked for already). Asking after
  // the call, not before it, keeps the lease from taking the instance the
  // call would have found.
  void AskAfterCall(const std::string& ns, const std::string& name,
                    uint64_t generation);

  // Closes the lease connection: the invoker stops what was lent (calls in
  // flight on leases break). Later TryCalls say false. Idempotent.
  void Close();

 private:
  explicit InstanceLeases(std::shared_ptr<leases::Core> core);
  const std::shared_ptr<leases::Core> core_;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_INSTANCE_LEASES_H_
