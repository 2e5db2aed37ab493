// The insides of InstanceLeases (instance_leases.h), shared by its two
// files: instance_leases.cc (the lease connection and the node's leases) and
// leased_call.cc (a call on a lease). Included by those two only: Asio and
// the generated instance frames are here.
#ifndef SILT_GATEWAY_INSTANCE_LEASES_IMPL_H_
#define SILT_GATEWAY_INSTANCE_LEASES_IMPL_H_

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>  // Boost 1.74 Asio under C++20 + GCC 12 needs this first.
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "call_client.h"
#include "http_types.h"
#include "instance_leases.h"
#include "invoker/call_wire.h"
#include "invoker/proto/worker.pb.h"

namespace silt::gateway::leases {

namespace asio = boost::asio;
namespace cw = invoker::call_wire;
namespace v1 = invoker::v1;
using Clock = std::chrono::steady_clock;
using ErrorCode = boost::system::error_code;
using Local = asio::local::stream_protocol;

struct Leased;

// A call waiting for a busy lease of its function.
struct Waiter {
  cw::Request* req;  // its owner's, alive until `done` or `elsewhere` runs
  CallClient::Done done;
  std::function<void()> elsewhere;
  Clock::time_point since;
  asio::io_context* ioc;  // the thread it came on, where it runs
  std::optional<asio::steady_timer> timer;  // on `ioc`
  bool taken = false;  // by a lease or `elsewhere` (Core::mu)
};

// The lease connection and the node's leases. A lease is used by one call at
// a time, on the thread of the call (its channel is registered with that
// thread's io_context, and moves when a call on another thread takes it).
struct Core : std::enable_shared_from_this<Core> {
  ~Core() {
    if (fd >= 0) close(fd);
  }
  int fd = -1;
  std::mutex write_mu;  // a frame at a time
  std::vector<asio::io_context*> contexts;
  std::thread reader;
  std::atomic<bool> down{false};

  std::mutex mu;
  uint64_t next_ask ABSL_GUARDED_BY(mu) = 1;
  std::map<uint64_t, std::string> asks ABSL_GUARDED_BY(mu);  // its key
  absl::flat_hash_set<std::string> asking ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, Clock::time_point> ask_after
      ABSL_GUARDED_BY(mu);
  // Keyed by ns/name/generation. `idle` leases are nobody's call's.
  absl::flat_hash_map<std::string, std::vector<std::shared_ptr<Leased>>> idle
      ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, size_t> held_count ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, std::deque<std::shared_ptr<Waiter>>> waiting
      ABSL_GUARDED_BY(mu);
  std::map<uint64_t, std::shared_ptr<Leased>> held ABSL_GUARDED_BY(mu);
  // Leases given back (or checked) whose answer is awaited: what runs with
  // it, and on which thread.
  struct Answer {
    std::function<void(cw::Returned)> fn;
    asio::io_context* ioc;
  };
  absl::flat_hash_map<uint64_t, Answer> awaiting ABSL_GUARDED_BY(mu);
  std::optional<asio::steady_timer> sweep;  // on contexts[0]
  bool sweeping ABSL_GUARDED_BY(mu) = false;

  asio::io_context* ContextHere() {
    for (auto* c : contexts)
      if (c->get_executor().running_in_this_thread()) return c;
    return nullptr;
  }

  // One frame to the invoker; false once the connection is gone.
  bool Send(const std::string& frame) {
    std::lock_guard<std::mutex> l(write_mu);
    for (size_t at = 0; at < frame.size();) {
      ssize_t n = send(fd, frame.data() + at, frame.size() - at, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      at += static_cast<size_t>(n);
    }
    return true;
  }

  // The frame that asks for a lease of the function version, unless one is
  // asked for already (or too many are held): "" then.
  std::string AskLocked(const std::string& key, const std::string& ns,
                        const std::string& name, uint64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A lease that became free (new, or its call over) takes the call that
  // waited longest for its function, or joins the idle ones.
  void Free(std::shared_ptr<Leased> l);
  // The calls waiting for `key`'s leases, taken off the queue.
  std::deque<std::shared_ptr<Waiter>> TakeWaitersLocked(const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Sends each of `calls` to the call port, on its own thread.
  static void Elsewhere(std::deque<std::shared_ptr<Waiter>> calls);
  // Ends lease `l` (its channel closed): `answer` runs, on `ioc`, with the
  // invoker's answer when `how` has one (kInvokerGone when the connection is
  // gone).
  void GiveBack(Leased& l, cw::ReturnHow how,
                std::function<void(cw::Returned)> answer = nullptr,
                asio::io_context* ioc = nullptr);
  void ArmSweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Sweep();
  void LinkDown();
  void ReadLoop();
  void Handle(std::string_view frame, std::deque<int>& fds);
};

// An instance leased from the node, and the call on it. Its call state is
// touched only on the thread of the call.
struct Leased : std::enable_shared_from_this<Leased> {
  Leased(std::shared_ptr<Core> core, const cw::Leased& l, std::string key,
         int fd)
      : core(std::move(core)),
        id(l.lease),
        instance(l.instance),
        key(std::move(key)),
        timeout_ms(l.timeout_ms),
        fd(fd) {}
  ~Leased() { Close(); }

  const std::shared_ptr<Core> core;
  const uint64_t id;
  const std::string instance, key;
  const uint32_t timeout_ms;  // the function's exec_timeout (or the most)
  // The channel: `fd` while no thread's io_context has it, else `sock`.
  int fd;
  asio::io_context* ioc = nullptr;
  std::optional<Local::socket> sock;
  std::optional<asio::steady_timer> timer;
  // Guarded by core->mu.
  Clock::time_point last_used = Clock::now();
  bool recalled = false;

  // The call on it.
  bool busy = false;
  bool ended = false;  // given back: no more calls
  uint64_t seq = 0;
  std::string name;
  uint32_t call_ms = 0;
  CallClient::Done done;
  std::string out, in;  // in[0, have): arrived, not yet taken
  size_t have = 0;
  // A streamed reply: its head was handed over; `pull` waits for a part.
  bool streaming = false;
  BodyStream::Next pull;
  absl::Status broke;  // why a streamed body ended early

  // Registers the channel with `on` (this thread's), moving it from the
  // io_context that had it (no operation is pending on it then).
  bool Bind(asio::io_context& on);
  // Takes the channel off the io_context that has it (nothing pending).
  void Unbind();
  void Close();

  // `waited`: how long the call waited for this lease (its time counts).
  // On the thread of `on`.
  void Start(asio::io_context& on, cw::Request& req, CallClient::Done d,
             Clock::duration waited = {});

  void Read();

  // Handles the first frame in `in` if it is whole, else reads on.
  void TakeFrame();

  static cw::Reply ReplyOf(v1::WorkerReply& r, const std::string& instance);

  // The whole answer: the lease is free again before the caller hears it (a
  // call that follows at once finds it idle).
  void Finish(v1::WorkerReply reply);

  // A 5xx: the invoker says whether a process of the instance was killed at
  // its memory limit meanwhile (as its call port says in the body).
  void Check(v1::WorkerReply reply);

  // Its server is gone: the call says why; the lease ends.
  void Lost(v1::WorkerReply reply);

  void Head(v1::WorkerReply& reply);

  void TakePart(v1::WorkerReply& reply);

  // The call ends without the instance's answer; so does the lease.
  void Fail(cw::ReturnHow how);

  void Report(cw::ReturnHow how, const cw::Returned& why);

  // For the body of call `call` (Body). Posted, never inline (to the
  // thread of the call: a streamed answer keeps its lease till it ends).
  void PullFor(uint64_t call, BodyStream::Next next);
  void CancelFor(uint64_t call);

  struct Body final : BodyStream {
    Body(std::shared_ptr<Leased> l, uint64_t call)
        : l(std::move(l)), call(call) {}
    void Pull(Next next) override { l->PullFor(call, std::move(next)); }
    void Cancel() override { l->CancelFor(call); }
    const std::shared_ptr<Leased> l;
    const uint64_t call;
  };
};

}  // namespace silt::gateway::leases

#endif  // SILT_GATEWAY_INSTANCE_LEASES_IMPL_H_
