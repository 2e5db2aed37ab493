#include "instance_leases.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>  // Boost 1.74 Asio under C++20 + GCC 12 needs this first.

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "invoker/worker_call.h"

namespace silt::gateway {
namespace {

namespace asio = boost::asio;
namespace cw = invoker::call_wire;
namespace v1 = invoker::v1;
using Clock = std::chrono::steady_clock;
using ErrorCode = boost::system::error_code;
using Local = asio::local::stream_protocol;

// Leases of one function version held at most.
constexpr size_t kMaxPerFunction = 64;
// A call that finds every lease of its function busy waits this long for
// one (and at most this many wait), then goes to the call port, where the
// invoker starts an instance, queues it or refuses it, as for any call.
constexpr auto kWaitForLease = std::chrono::milliseconds(5);
constexpr size_t kMaxWaiting = 256;
// After the invoker had none to lend, the next ask waits this long (the
// calls meanwhile go to the call port).
constexpr auto kAskAgainAfter = std::chrono::milliseconds(1);
// How often idle leases are looked at (InstanceLeases::kIdleHold).
constexpr auto kSweepEvery = std::chrono::milliseconds(100);
// The instance channel's largest frame (invoker/src/channel.h).
constexpr uint32_t kMaxReplyFrame = 256u << 20;
// A lease frame from the invoker is small.
constexpr uint32_t kMaxLeaseFrame = 1u << 20;

const cw::Returned kInvokerGone{.failure = cw::Failure::kCrash,
                                .text = "ended: its node's invoker went away"};

struct Leased;

// A call waiting for a busy lease of its function.
struct Waiter {
  cw::Request* req;  // its owner's, alive until `done` or `elsewhere` runs
  CallClient::Done done;
  std::function<void()> elsewhere;
  Clock::time_point since;
  asio::io_context* ioc;  // the thread it came on, where it runs
  std::optional<asio::steady_timer> timer;  // on `ioc`
  bool taken = false;  // by a lease or `elsewhere` (InstanceLeases::Core::mu)
};

std::string KeyOf(const cw::Request& r) {
  return absl::StrCat(r.ns, "/", r.name, "/", r.generation);
}

}  // namespace

// The lease connection and the node's leases. A lease is used by one call at
// a time, on the thread of the call (its channel is registered with that
// thread's io_context, and moves when a call on another thread takes it).
struct InstanceLeases::Core : std::enable_shared_from_this<Core> {
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

namespace {

// An instance leased from the node, and the call on it. Its call state is
// touched only on the thread of the call.
struct Leased : std::enable_shared_from_this<Leased> {
  Leased(std::shared_ptr<InstanceLeases::Core> core, const cw::Leased& l,
         std::string key, int fd)
      : core(std::move(core)),
        id(l.lease),
        instance(l.instance),
        key(std::move(key)),
        timeout_ms(l.timeout_ms),
        fd(fd) {}
  ~Leased() { Close(); }

  const std::shared_ptr<InstanceLeases::Core> core;
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
  bool Bind(asio::io_context& on) {
    if (ioc == &on && sock) return true;
    ErrorCode ec;
    if (sock) {
      timer.reset();
      fd = sock->release(ec);
      sock.reset();
      if (ec) fd = -1;
    }
    if (fd < 0) return false;
    sock.emplace(on);
    sock->assign(Local(), fd, ec);
    if (ec) {
      sock.reset();
      return false;
    }
    fd = -1;
    ioc = &on;
    timer.emplace(on);
    return true;
  }
  void Close() {
    ErrorCode ignored;
    if (sock) sock->close(ignored);
    if (fd >= 0) close(fd);
    fd = -1;
  }

  // `waited`: how long the call waited for this lease (its time counts).
  // On the thread of `on`.
  void Start(asio::io_context& on, cw::Request& req, CallClient::Done d,
             Clock::duration waited = {}) {
    busy = true;
    ++seq;
    name = std::move(req.name);
    done = std::move(d);
    broke = absl::OkStatus();
    if (!Bind(on)) return Fail(cw::ReturnHow::kBroken);
    // As the invoker's Impl::Timeout: the call's own (else 60 s), at most
    // the function's exec_timeout; what it waited is gone from it.
    call_ms = std::min(req.timeout_ms > 0 ? req.timeout_ms : 60000u,
                       timeout_ms > 0 ? timeout_ms : UINT32_MAX);
    const int64_t waited_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
    const auto left = static_cast<uint32_t>(
        std::max<int64_t>(1, int64_t{call_ms} - waited_ms));
    v1::WorkerCall call = invoker::TakeWorkerCall(req);
    call.set_timeout_ms(left);
    out.assign(4, '\0');
    call.AppendToString(&out);
    uint32_t len = static_cast<uint32_t>(out.size() - 4);
    memcpy(out.data(), &len, 4);
    // The instance's answer (a streamed one whole) is due within its time,
    // and 100 ms more (as the invoker waits).
    timer->expires_after(std::chrono::milliseconds(left) +
                         std::chrono::milliseconds(100));
    timer->async_wait([self = shared_from_this(), seq = seq](ErrorCode ec) {
      if (!ec && seq == self->seq && self->busy)
        self->Fail(cw::ReturnHow::kTimedOut);
    });
    asio::async_write(*sock, asio::buffer(out),
                      [self = shared_from_this()](ErrorCode ec, size_t) {
                        if (!self->busy) return;
                        if (ec) return self->Fail(cw::ReturnHow::kBroken);
                        if (self->out.capacity() > (1 << 20))
                          std::string().swap(self->out);
                        self->Read();
                      });
  }

  void Read() {
    if (in.size() < have + 4096) in.resize(have + 4096);
    sock->async_read_some(asio::buffer(in.data() + have, in.size() - have),
                          [self = shared_from_this()](ErrorCode ec, size_t n) {
                            if (!self->busy) return;  // the call is over
                            if (ec) return self->Fail(cw::ReturnHow::kBroken);
                            self->have += n;
                            self->TakeFrame();
                          });
  }

  // Handles the first frame in `in` if it is whole, else reads on.
  void TakeFrame() {
    if (have < 4) return Read();
    uint32_t len;
    memcpy(&len, in.data(), 4);
    if (len > kMaxReplyFrame) return Fail(cw::ReturnHow::kBroken);
    const size_t need = 4 + static_cast<size_t>(len);
    if (have < need) {
      if (in.size() < need) in.resize(need);
      return Read();
    }
    v1::WorkerReply reply;
    if (!reply.ParseFromArray(in.data() + 4, static_cast<int>(len)))
      return Fail(cw::ReturnHow::kBroken);
    memmove(in.data(), in.data() + need, have - need);
    have -= need;
    if (have == 0 && in.size() > (1 << 20)) std::string().swap(in);
    if (streaming) return TakePart(reply);
    if (reply.more()) return Head(reply);
    if (reply.instance_lost()) return Lost(std::move(reply));
    if (reply.status() >= 500) return Check(std::move(reply));
    Finish(std::move(reply));
  }

  static cw::Reply ReplyOf(v1::WorkerReply& r, const std::string& instance) {
    cw::Reply out;
    out.status = static_cast<uint16_t>(r.status());
    out.headers.reserve(r.headers_size());
    for (auto& h : *r.mutable_headers())
      out.headers.emplace_back(std::move(*h.mutable_name()),
                               std::move(*h.mutable_value()));
    out.body = std::move(*r.mutable_body());
    out.instance = instance;
    return out;
  }

  // The whole answer: the lease is free again before the caller hears it (a
  // call that follows at once finds it idle).
  void Finish(v1::WorkerReply reply) {
    timer->cancel();
    busy = false;
    CallClient::Done d = std::move(done);
    cw::Reply r = ReplyOf(reply, instance);
    core->Free(shared_from_this());
    d(std::move(r), nullptr);
  }

  // A 5xx: the invoker says whether a process of the instance was killed at
  // its memory limit meanwhile (as its call port says in the body).
  void Check(v1::WorkerReply reply) {
    auto self = shared_from_this();
    auto r = std::make_shared<v1::WorkerReply>(std::move(reply));
    auto answer = [self, r, seq = seq](cw::Returned a) {
      if (a.failure == cw::Failure::kNone && !a.text.empty())
        r->set_body(absl::StrCat(r->body(), "silt: ", a.text, "\n"));
      if (self->busy && !self->ended && seq == self->seq)
        self->Finish(std::move(*r));
    };
    {
      std::lock_guard<std::mutex> l(core->mu);
      core->awaiting[id] = {answer, ioc};
    }
    std::string frame;
    cw::AppendReturn(&frame, {.lease = id, .how = cw::ReturnHow::kCheck});
    if (!core->Send(frame)) {
      {
        std::lock_guard<std::mutex> l(core->mu);
        core->awaiting.erase(id);
      }
      answer(cw::Returned{});
    }
  }

  // Its server is gone: the call says why; the lease ends.
  void Lost(v1::WorkerReply reply) {
    ended = true;
    timer->cancel();
    auto r = std::make_shared<v1::WorkerReply>(std::move(reply));
    core->GiveBack(
        *this, cw::ReturnHow::kLost,
        [self = shared_from_this(), r](cw::Returned a) {
          self->busy = false;
          r->set_body(absl::StrCat("function ", self->name, " instance ",
                                   self->instance, ": ", a.text, ": ",
                                   r->body()));
          CallClient::Done d = std::move(self->done);
          d(ReplyOf(*r, self->instance), nullptr);
        },
        ioc);
  }

  void Head(v1::WorkerReply& reply) {
    streaming = true;
    cw::Reply head = ReplyOf(reply, instance);
    head.head = true;
    CallClient::Done d = std::move(done);
    d(std::move(head), std::make_shared<Body>(shared_from_this(), seq));
  }

  void TakePart(v1::WorkerReply& reply) {
    BodyStream::Next next = std::move(pull);
    pull = nullptr;
    if (reply.more())
      return next(BodyStream::Part{std::move(*reply.mutable_body()), false});
    timer->cancel();
    streaming = false;
    busy = false;
    // The handler failed after its head was out: the body breaks off.
    absl::StatusOr<BodyStream::Part> last =
        reply.error().empty()
            ? absl::StatusOr<BodyStream::Part>(
                  BodyStream::Part{std::move(*reply.mutable_body()), true})
            : absl::AbortedError(reply.error());
    core->Free(shared_from_this());
    next(std::move(last));
  }

  // The call ends without the instance's answer; so does the lease.
  void Fail(cw::ReturnHow how) {
    if (ended) return;
    ended = true;
    if (timer) timer->cancel();
    std::function<void(cw::Returned)> answer;
    if (cw::ReturnAnswered(how))
      answer = [self = shared_from_this(), how](cw::Returned a) {
        self->Report(how, a);
      };
    core->GiveBack(*this, how, std::move(answer), ioc);
    if (!cw::ReturnAnswered(how)) Report(how, {});
  }

  void Report(cw::ReturnHow how, const cw::Returned& why) {
    if (!busy) return;
    absl::Status s;
    switch (how) {
      case cw::ReturnHow::kTimedOut:
        s = absl::DeadlineExceededError(absl::StrCat(
            "function ", name, " timed out after ", call_ms, " ms"));
        break;
      case cw::ReturnHow::kCallerGone:
        s = absl::CancelledError("the body is no longer wanted");
        break;
      default:
        s = absl::AbortedError(absl::StrCat("function ", name, " instance ",
                                            instance, " ", why.text));
        break;
    }
    busy = false;
    if (streaming) {
      streaming = false;
      broke = s.code() == absl::StatusCode::kDeadlineExceeded
                  ? absl::AbortedError(s.message())
                  : s;
      BodyStream::Next next = std::move(pull);
      pull = nullptr;
      if (next) next(broke);
      return;
    }
    CallClient::Done d = std::move(done);
    if (how != cw::ReturnHow::kBroken) return d(std::move(s), nullptr);
    // As the call port answers for an instance that died: a 502 saying why.
    cw::Reply r;
    r.status = 502;
    r.failure = why.failure;
    r.instance = instance;
    r.body = absl::StrCat("function ", name, " instance ", instance, " ",
                          why.text, "\n");
    r.headers.emplace_back("Content-Type", "text/plain; charset=utf-8");
    d(std::move(r), nullptr);
  }

  // For the body of call `call` (Body). Posted, never inline (to the
  // thread of the call: a streamed answer keeps its lease till it ends).
  void PullFor(uint64_t call, BodyStream::Next next) {
    asio::post(*ioc, [self = shared_from_this(), call,
                      next = std::move(next)]() mutable {
      if (call != self->seq)
        return next(absl::FailedPreconditionError("the body is over"));
      if (!self->streaming)
        return next(self->broke.ok()
                        ? absl::FailedPreconditionError("the body is over")
                        : self->broke);
      self->pull = std::move(next);
      self->TakeFrame();
    });
  }
  void CancelFor(uint64_t call) {
    asio::post(*ioc, [self = shared_from_this(), call] {
      if (call != self->seq || !self->streaming) return;
      self->Fail(cw::ReturnHow::kCallerGone);
    });
  }

  struct Body final : BodyStream {
    Body(std::shared_ptr<Leased> l, uint64_t call)
        : l(std::move(l)), call(call) {}
    void Pull(Next next) override { l->PullFor(call, std::move(next)); }
    void Cancel() override { l->CancelFor(call); }
    const std::shared_ptr<Leased> l;
    const uint64_t call;
  };
};

}  // namespace

std::string InstanceLeases::Core::AskLocked(const std::string& key,
                                            const std::string& ns,
                                            const std::string& name,
                                            uint64_t generation) {
  if (down || asking.contains(key) || held_count[key] >= kMaxPerFunction)
    return "";
  if (auto it = ask_after.find(key);
      it != ask_after.end() && Clock::now() < it->second)
    return "";
  cw::LeaseAsk ask{
      .ask = next_ask++, .ns = ns, .name = name, .generation = generation};
  asks[ask.ask] = key;
  asking.insert(key);
  std::string frame;
  cw::AppendLeaseAsk(&frame, ask);
  return frame;
}

void InstanceLeases::Core::Free(std::shared_ptr<Leased> l) {
  std::unique_lock<std::mutex> g(mu);
  l->last_used = Clock::now();
  if (l->recalled || down) {
    g.unlock();
    l->ended = true;
    return GiveBack(*l, cw::ReturnHow::kIdle);
  }
  auto w = waiting.find(l->key);
  if (w == waiting.end() || w->second.empty()) {
    idle[l->key].push_back(std::move(l));
    ArmSweepLocked();
    return;
  }
  std::shared_ptr<Waiter> next = std::move(w->second.front());
  w->second.pop_front();
  if (w->second.empty()) waiting.erase(w);
  next->taken = true;
  g.unlock();
  auto run = [l, next] {
    next->timer->cancel();
    l->Start(*next->ioc, *next->req, std::move(next->done),
             Clock::now() - next->since);
  };
  if (next->ioc->get_executor().running_in_this_thread()) return run();
  // Its channel leaves this thread's io_context here, where nothing is
  // pending on it, and joins the waiter's there.
  if (l->sock) {
    ErrorCode ec;
    l->timer.reset();
    l->fd = l->sock->release(ec);
    l->sock.reset();
    l->ioc = nullptr;
    if (ec) l->fd = -1;
  }
  asio::post(*next->ioc, std::move(run));
}

void InstanceLeases::Core::Elsewhere(
    std::deque<std::shared_ptr<Waiter>> calls) {
  for (auto& w : calls)
    asio::post(*w->ioc, [w] {
      w->timer->cancel();
      w->elsewhere();
    });
}

void InstanceLeases::Core::GiveBack(Leased& l, cw::ReturnHow how,
                                    std::function<void(cw::Returned)> answer,
                                    asio::io_context* ioc) {
  l.Close();
  std::deque<std::shared_ptr<Waiter>> orphans;
  {
    std::lock_guard<std::mutex> g(mu);
    // The calls that wait for its function, with no lease of it left.
    if (held.erase(l.id) > 0 && --held_count[l.key] == 0) {
      if (auto w = waiting.find(l.key); w != waiting.end()) {
        orphans = std::move(w->second);
        waiting.erase(w);
        for (auto& c : orphans) c->taken = true;
      }
    }
    awaiting.erase(l.id);  // (a kCheck's, for a call that timed out)
    if (answer && !down) awaiting[l.id] = {answer, ioc};
  }
  Elsewhere(std::move(orphans));
  std::string frame;
  cw::AppendReturn(&frame, {.lease = l.id, .how = how});
  bool sent = !down && Send(frame);
  if (answer && !sent) {
    {
      std::lock_guard<std::mutex> g(mu);
      awaiting.erase(l.id);
    }
    answer(kInvokerGone);
  }
}

void InstanceLeases::Core::ArmSweepLocked() {
  if (sweeping || !sweep) return;
  sweeping = true;
  sweep->expires_after(kSweepEvery);
  sweep->async_wait([self = shared_from_this()](ErrorCode ec) {
    {
      std::lock_guard<std::mutex> g(self->mu);
      self->sweeping = false;
    }
    if (!ec) self->Sweep();
  });
}

void InstanceLeases::Core::Sweep() {
  const auto cutoff = Clock::now() - InstanceLeases::kIdleHold;
  std::vector<std::shared_ptr<Leased>> back;
  {
    std::lock_guard<std::mutex> g(mu);
    for (auto it = idle.begin(); it != idle.end();) {
      auto& v = it->second;
      auto keep = std::partition(v.begin(), v.end(),
                                 [&](const std::shared_ptr<Leased>& l) {
                                   return l->last_used > cutoff;
                                 });
      for (auto i = keep; i != v.end(); ++i) back.push_back(std::move(*i));
      v.erase(keep, v.end());
      if (v.empty()) {
        idle.erase(it++);
      } else {
        ++it;
      }
    }
    if (!idle.empty()) ArmSweepLocked();
  }
  // (Nobody's call's: closed here, whatever thread had them.)
  for (auto& l : back) {
    l->ended = true;
    GiveBack(*l, cw::ReturnHow::kIdle);
  }
}

void InstanceLeases::Core::LinkDown() {
  std::vector<std::shared_ptr<Leased>> idle_ones;
  absl::flat_hash_map<uint64_t, Answer> answers;
  std::deque<std::shared_ptr<Waiter>> calls;
  {
    std::lock_guard<std::mutex> g(mu);
    down = true;
    for (auto& [key, v] : waiting)
      for (auto& w : v) {
        w->taken = true;
        calls.push_back(std::move(w));
      }
    waiting.clear();
    for (auto& [key, v] : idle)
      for (auto& l : v) idle_ones.push_back(std::move(l));
    idle.clear();
    answers.swap(awaiting);
  }
  for (auto& l : idle_ones) {
    l->ended = true;
    GiveBack(*l, cw::ReturnHow::kIdle);
  }
  for (auto& [lease, a] : answers)
    asio::post(*a.ioc, [fn = std::move(a.fn)] { fn(kInvokerGone); });
  Elsewhere(std::move(calls));
}

void InstanceLeases::Core::Handle(std::string_view frame,
                                  std::deque<int>& fds) {
  switch (static_cast<cw::Op>(cw::OpOf(frame))) {
    case cw::Op::kLeased: {
      cw::Leased got;
      if (!cw::ParseLeased(frame, &got) || fds.empty()) break;
      const int channel = fds.front();
      fds.pop_front();
      std::shared_ptr<Leased> l;
      {
        std::lock_guard<std::mutex> g(mu);
        auto it = asks.find(got.ask);
        if (it == asks.end()) {
          close(channel);
          return;
        }
        std::string key = std::move(it->second);
        asks.erase(it);
        asking.erase(key);
        l = std::make_shared<Leased>(shared_from_this(), got, key, channel);
        held[l->id] = l;
        ++held_count[key];
      }
      Free(std::move(l));
      return;
    }
    case cw::Op::kNoLease: {
      uint64_t ask;
      if (!cw::ParseNoLease(frame, &ask)) break;
      std::lock_guard<std::mutex> g(mu);
      auto it = asks.find(ask);
      if (it == asks.end()) return;
      asking.erase(it->second);
      ask_after[it->second] = Clock::now() + kAskAgainAfter;
      asks.erase(it);
      return;
    }
    case cw::Op::kReturned: {
      cw::Returned r;
      if (!cw::ParseReturned(frame, &r)) break;
      Answer a;
      {
        std::lock_guard<std::mutex> g(mu);
        auto it = awaiting.find(r.lease);
        if (it == awaiting.end()) return;
        a = std::move(it->second);
        awaiting.erase(it);
      }
      asio::post(*a.ioc, [fn = std::move(a.fn), r = std::move(r)]() mutable {
        fn(std::move(r));
      });
      return;
    }
    case cw::Op::kRecall: {
      uint64_t lease;
      if (!cw::ParseRecall(frame, &lease)) break;
      std::shared_ptr<Leased> l;
      {
        std::lock_guard<std::mutex> g(mu);
        auto it = held.find(lease);
        if (it == held.end()) return;
        it->second->recalled = true;  // a busy one goes when its call ends
        auto v = idle.find(it->second->key);
        if (v == idle.end()) return;
        auto at = std::find(v->second.begin(), v->second.end(), it->second);
        if (at == v->second.end()) return;
        l = std::move(*at);
        v->second.erase(at);
      }
      l->ended = true;
      GiveBack(*l, cw::ReturnHow::kIdle);
      return;
    }
    default:
      break;
  }
  fprintf(stderr, "silt-gateway: malformed lease frame from an invoker\n");
  shutdown(fd, SHUT_RDWR);
}

void InstanceLeases::Core::ReadLoop() {
  std::string buf;
  size_t have = 0;
  std::deque<int> fds;
  while (true) {
    if (buf.size() < have + 4096) buf.resize(have + 4096);
    iovec iov{buf.data() + have, buf.size() - have};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int got;
        memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.push_back(got);
      }
    }
    if (n <= 0) break;
    have += static_cast<size_t>(n);
    size_t at = 0;
    bool bad = false;
    while (have - at >= 4) {
      uint32_t len;
      memcpy(&len, buf.data() + at, 4);
      if (len > kMaxLeaseFrame) {
        bad = true;
        break;
      }
      if (have - at < 4 + static_cast<size_t>(len)) break;
      Handle(std::string_view(buf.data() + at + 4, len), fds);
      at += 4 + len;
    }
    if (bad) break;
    memmove(buf.data(), buf.data() + at, have - at);
    have -= at;
  }
  for (int f : fds) close(f);
  LinkDown();
}

absl::StatusOr<std::unique_ptr<InstanceLeases>> InstanceLeases::Connect(
    const std::vector<asio::io_context*>& contexts, const std::string& socket,
    const std::string& key) {
  if (contexts.empty() || socket.size() < 2 || socket[0] != '@' ||
      socket.size() > sizeof(sockaddr_un::sun_path))
    return absl::InvalidArgumentError(
        absl::StrCat("bad lease socket ", socket));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path + 1, socket.data() + 1, socket.size() - 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  socklen_t len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", socket, ": ", strerror(err)));
  }
  auto core = std::make_shared<Core>();
  core->fd = fd;
  core->contexts = contexts;
  core->sweep.emplace(*contexts[0]);
  std::string hello;
  cw::AppendHello(&hello, key);
  if (!core->Send(hello))
    return absl::UnavailableError(absl::StrCat("cannot reach ", socket));
  core->reader = std::thread([c = core.get()] { c->ReadLoop(); });
  return std::unique_ptr<InstanceLeases>(new InstanceLeases(std::move(core)));
}

InstanceLeases::InstanceLeases(std::shared_ptr<Core> core)
    : core_(std::move(core)) {}

InstanceLeases::~InstanceLeases() {
  Close();
  if (core_->reader.joinable()) core_->reader.join();
}

void InstanceLeases::Close() {
  // The reader sees the end and takes the leases down.
  shutdown(core_->fd, SHUT_RDWR);
}

InstanceLeases::Took InstanceLeases::TryCall(cw::Request& req,
                                             CallClient::Done& done,
                                             std::function<void()>& elsewhere) {
  if (core_->down.load(std::memory_order_relaxed)) return Took::kNo;
  asio::io_context* here = core_->ContextHere();
  if (here == nullptr) return Took::kNo;
  std::string key = KeyOf(req);
  std::shared_ptr<Leased> l;
  std::shared_ptr<Waiter> w;
  {
    std::lock_guard<std::mutex> g(core_->mu);
    if (core_->down) return Took::kNo;
    if (auto it = core_->idle.find(key);
        it != core_->idle.end() && !it->second.empty()) {
      // One this thread had last, if any (its channel stays put).
      auto& v = it->second;
      auto mine = std::find_if(v.rbegin(), v.rend(), [here](const auto& c) {
        return c->ioc == here;
      });
      auto at = mine != v.rend() ? std::next(mine).base() : v.end() - 1;
      l = std::move(*at);
      v.erase(at);
    } else if (auto held = core_->held_count.find(key);
               held != core_->held_count.end() && held->second > 0 &&
               core_->waiting[key].size() < kMaxWaiting) {
      // Every lease of it is busy: the call waits for one, a while.
      w = std::make_shared<Waiter>();
      w->req = &req;
      w->done = std::move(done);
      w->elsewhere = std::move(elsewhere);
      w->since = Clock::now();
      w->ioc = here;
      w->timer.emplace(*here);
      core_->waiting[key].push_back(w);
    } else {
      return Took::kNo;
    }
  }
  if (l) {
    l->Start(*here, req, std::move(done));
    return Took::kStarted;
  }
  w->timer->expires_after(kWaitForLease);
  w->timer->async_wait([core = core_, w, key](ErrorCode ec) {
    if (ec) return;
    {
      std::lock_guard<std::mutex> g(core->mu);
      if (w->taken) return;
      w->taken = true;
      auto it = core->waiting.find(key);
      if (it != core->waiting.end()) {
        auto& v = it->second;
        v.erase(std::remove(v.begin(), v.end(), w), v.end());
        if (v.empty()) core->waiting.erase(it);
      }
    }
    w->elsewhere();
  });
  return Took::kWaits;
}

void InstanceLeases::AskAfterCall(const std::string& ns,
                                  const std::string& name,
                                  uint64_t generation) {
  if (core_->down.load(std::memory_order_relaxed)) return;
  std::string key = absl::StrCat(ns, "/", name, "/", generation);
  std::string frame;
  {
    std::lock_guard<std::mutex> g(core_->mu);
    if (auto it = core_->idle.find(key);
        it != core_->idle.end() && !it->second.empty())
      return;  // one is idle already
    frame = core_->AskLocked(key, ns, name, generation);
  }
  if (!frame.empty()) core_->Send(frame);
}

}  // namespace silt::gateway
