#include "call_client.h"

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <utility>  // Boost 1.74 Asio under C++20 + GCC 12 needs this first.
#include <vector>

#include "absl/strings/str_cat.h"
#include "http_server.h"

namespace silt::gateway {
namespace {

namespace asio = boost::asio;
namespace cw = invoker::call_wire;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;

// Connections kept open per node beyond the calls in flight.
constexpr size_t kMaxIdle = 128;

std::optional<tcp::endpoint> ParseEndpoint(const std::string& address) {
  auto ep = ParseListenAddress(address);
  if (!ep.ok() || ep->port() == 0) return std::nullopt;
  return *ep;
}

}  // namespace

struct CallClient::Pool : std::enable_shared_from_this<Pool> {
  Pool(asio::io_context& ioc, std::string address, std::string key)
      : ioc(ioc),
        address(std::move(address)),
        endpoint(ParseEndpoint(this->address)) {
    cw::AppendHello(&hello, key);
  }
  asio::io_context& ioc;
  const std::string address;
  const std::optional<tcp::endpoint> endpoint;
  std::string hello;

  std::mutex mu;
  bool closed = false;   // no new calls, no idle connections; guarded by mu
  bool aborted = false;  // the calls in flight fail too; guarded by mu
  std::vector<std::shared_ptr<Conn>> idle;  // guarded by mu
  std::set<Conn*> busy;                     // guarded by mu

  bool Aborted() {
    std::lock_guard<std::mutex> l(mu);
    return aborted;
  }
};

// One connection. While a call is on it, only its strand touches it.
struct CallClient::Conn : std::enable_shared_from_this<Conn> {
  explicit Conn(std::shared_ptr<Pool> p)
      : pool(std::move(p)),
        strand(asio::make_strand(pool->ioc)),
        sock(strand),
        timer(strand) {}
  ~Conn() {
    std::lock_guard<std::mutex> l(pool->mu);
    pool->busy.erase(this);
  }

  const std::shared_ptr<Pool> pool;
  asio::strand<asio::io_context::executor_type> strand;
  tcp::socket sock;
  asio::steady_timer timer;

  // The call on it.
  std::shared_ptr<const std::string> out;  // its request frame
  std::string in;  // what has arrived and is not yet taken: in[0, have)
  size_t have = 0;
  Done done;
  std::chrono::steady_clock::time_point deadline;
  bool reused = false;  // kept from an earlier call
  bool timed_out = false;
  uint64_t seq = 0;  // which call (a timer that fired late is for an old one)
  // A streamed reply: its head was handed over and its body goes on; `pull`
  // waits for the next part (frames are read only while one waits).
  bool streaming = false;
  BodyStream::Next pull;
  // A request body that streams (kRequestHead): its parts go out as they
  // come, then the reply is read.
  std::shared_ptr<BodyStream> body_out;
  bool body_started = false;  // a part was asked for: the call cannot repeat
  std::string part_out;

  void Start() {
    timed_out = false;
    body_started = false;
    have = 0;
    timer.expires_at(deadline);
    timer.async_wait([self = shared_from_this(), seq = ++seq](ErrorCode ec) {
      // Cancelled (the reply came), or late for a call that is over.
      if (ec || seq != self->seq || (!self->done && !self->streaming)) return;
      self->timed_out = true;
      self->sock.close(ec);  // the pending operation ends with an error
    });
    if (sock.is_open()) return Write(false);
    if (!pool->endpoint)
      return Fail(absl::UnavailableError(absl::StrCat(
          "node call address ", pool->address, " is not ip:port")));
    sock.async_connect(*pool->endpoint,
                       [self = shared_from_this()](ErrorCode ec) {
                         if (ec) return self->Broken(ec, /*connecting=*/true);
                         self->sock.set_option(tcp::no_delay(true), ec);
                         self->Write(true);
                       });
  }

  void Write(bool with_hello) {
    std::array<asio::const_buffer, 2> bufs = {
        asio::buffer(with_hello ? pool->hello : std::string_view()),
        asio::buffer(*out)};
    asio::async_write(sock, bufs,
                      [self = shared_from_this()](ErrorCode ec, size_t) {
                        if (ec) return self->Broken(ec, false);
                        if (self->body_out) return self->SendBody();
                        self->Read();
                      });
  }

  // The next part of the request body, once it comes from the client.
  void SendBody() {
    body_started = true;
    body_out->Pull([self = shared_from_this(),
                    call = seq](absl::StatusOr<BodyStream::Part> part) mutable {
      asio::post(self->strand, [self, call, part = std::move(part)]() mutable {
        self->OnBodyPart(call, std::move(part));
      });
    });
  }

  void OnBodyPart(uint64_t call, absl::StatusOr<BodyStream::Part> part) {
    if (call != seq || !done || !body_out) return;  // the call is over
    // The client's body broke off (or is over the limit): so does the call.
    if (!part.ok()) return Fail(part.status());
    const bool last = part->last;
    part_out.clear();
    if (last) {
      cw::AppendBodyEnd(&part_out, part->bytes);
    } else {
      cw::AppendBodyPart(&part_out, part->bytes);
    }
    asio::async_write(sock, asio::buffer(part_out),
                      [self = shared_from_this(), last](ErrorCode ec, size_t) {
                        if (ec) return self->Broken(ec, false);
                        if (!last) return self->SendBody();
                        self->body_out.reset();
                        std::string().swap(self->part_out);
                        self->Read();
                      });
  }

  void Read() {
    if (in.size() < have + 4096) in.resize(have + 4096);
    sock.async_read_some(asio::buffer(in.data() + have, in.size() - have),
                         [self = shared_from_this()](ErrorCode ec, size_t n) {
                           if (ec) return self->Broken(ec, false);
                           self->have += n;
                           self->TakeFrame();
                         });
  }

  // Handles the first frame in `in` if it is whole, else reads on.
  void TakeFrame() {
    if (have < 4) return Read();
    uint32_t len;
    memcpy(&len, in.data(), 4);
    if (len > cw::kMaxFrameBytes)
      return Malformed(
          absl::StrCat("node ", pool->address, " sent a reply over the limit"));
    size_t need = 4 + static_cast<size_t>(len);
    if (have < need) {
      if (in.size() < need) in.resize(need);
      return Read();
    }
    std::string_view payload(in.data() + 4, len);
    if (streaming) return TakePart(payload, need);
    cw::Reply reply;
    // Nothing may follow a whole reply; parts may follow a head.
    if (!cw::ParseReply(payload, &reply) || (!reply.head && have != need))
      return Malformed(
          absl::StrCat("node ", pool->address, " sent a malformed reply"));
    Consume(need);
    Done d = std::move(done);
    out.reset();
    if (reply.head) {
      streaming = true;
      return d(std::move(reply),
               std::make_shared<Body>(shared_from_this(), seq));
    }
    timer.cancel();
    Idle();
    d(std::move(reply), nullptr);
  }

  // A frame of a streamed body: a part, or the reply that ends it.
  void TakePart(std::string_view payload, size_t need) {
    BodyStream::Next next = std::move(pull);
    pull = nullptr;
    std::string_view bytes;
    if (cw::ParseBodyPart(payload, &bytes)) {
      BodyStream::Part part{std::string(bytes), false};
      Consume(need);
      return next(std::move(part));
    }
    cw::Reply end;
    if (!cw::ParseReply(payload, &end) || end.head || have != need) {
      pull = std::move(next);
      return Malformed(absl::StrCat("node ", pool->address,
                                    " sent a malformed part of a reply"));
    }
    Consume(need);
    streaming = false;
    timer.cancel();
    Idle();
    if (end.outcome == cw::Outcome::kAnswered &&
        end.failure == cw::Failure::kNone)
      return next(BodyStream::Part{std::move(end.body), true});
    next(absl::AbortedError(end.error.empty() ? "the function's instance died"
                                              : end.error));
  }

  void Consume(size_t n) {
    memmove(in.data(), in.data() + n, have - n);
    have -= n;
    if (have == 0 && in.size() > (1 << 20)) std::string().swap(in);
  }

  // The call is over and the connection is clean: kept for the next one.
  void Idle() {
    std::lock_guard<std::mutex> l(pool->mu);
    pool->busy.erase(this);
    if (!pool->closed && pool->idle.size() < kMaxIdle)
      pool->idle.push_back(shared_from_this());
  }

  void Malformed(std::string why) {
    ErrorCode ignored;
    sock.close(ignored);
    Fail(absl::InternalError(std::move(why)));
  }

  void Broken(ErrorCode ec, bool connecting) {
    if (!done && !streaming) {
      // The call ended already (a streamed body cancelled): this is the read
      // it left pending.
      ErrorCode ignored;
      sock.close(ignored);
      return;
    }
    if (timed_out)
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          "node ", pool->address, " did not answer within the call's time")));
    if (pool->Aborted())
      return Fail(absl::UnavailableError("the gateway is shutting down"));
    ErrorCode ignored;
    sock.close(ignored);
    if (reused && have == 0 && !connecting && !streaming && !body_started) {
      // Closed by the node while it sat idle here (say, the invoker
      // restarted): the call goes once more, on a new connection.
      reused = false;
      timer.cancel();
      return Start();
    }
    std::string why =
        absl::StrCat(connecting ? "cannot reach node " : "lost node ",
                     pool->address, ": ", ec.message());
    // Once its body began to go out, a call cannot go elsewhere.
    Fail(body_started ? absl::AbortedError(why) : absl::UnavailableError(why));
  }

  void Fail(absl::Status s) {
    if (body_out) {
      // A body not yet pulled stays whole for a try elsewhere.
      if (body_started) body_out->Cancel();
      body_out.reset();
    }
    timer.cancel();
    ErrorCode ignored;
    sock.close(ignored);
    {
      std::lock_guard<std::mutex> l(pool->mu);
      pool->busy.erase(this);
    }
    if (streaming) {
      streaming = false;
      BodyStream::Next next = std::move(pull);
      pull = nullptr;
      if (next) next(std::move(s));
      return;
    }
    Done d = std::move(done);
    if (d) d(std::move(s), nullptr);
  }

  // For the body of call `call` (Body). Posted, never inline: a caller that
  // pulls again from its `next` does not recurse.
  void PullFor(uint64_t call, BodyStream::Next next) {
    asio::post(strand, [self = shared_from_this(), call,
                        next = std::move(next)]() mutable {
      if (call != self->seq || !self->streaming)
        return next(absl::FailedPreconditionError("the body is over"));
      self->pull = std::move(next);
      self->TakeFrame();
    });
  }
  void CancelFor(uint64_t call) {
    asio::post(strand, [self = shared_from_this(), call] {
      if (call != self->seq || !self->streaming) return;
      self->Fail(absl::CancelledError("the body is no longer wanted"));
    });
  }

  // The body of one streamed reply. Its connection goes back to the pool
  // when the body ends and may then carry a later call: what a late Pull or
  // Cancel asks is for this call only.
  struct Body final : BodyStream {
    Body(std::shared_ptr<Conn> conn, uint64_t call)
        : conn(std::move(conn)), call(call) {}
    void Pull(Next next) override { conn->PullFor(call, std::move(next)); }
    void Cancel() override { conn->CancelFor(call); }
    const std::shared_ptr<Conn> conn;
    const uint64_t call;
  };
};

CallClient::CallClient(const std::vector<asio::io_context*>& contexts,
                       std::string address, std::string key) {
  for (asio::io_context* ioc : contexts)
    pools_.push_back(std::make_shared<Pool>(*ioc, address, key));
}

CallClient::Pool& CallClient::PoolHere() {
  for (auto& p : pools_)
    if (p->ioc.get_executor().running_in_this_thread()) return *p;
  return *pools_[next_.fetch_add(1, std::memory_order_relaxed) % pools_.size()];
}

CallClient::~CallClient() {
  for (auto& pool : pools_) {
    std::vector<std::shared_ptr<Conn>> idle;
    {
      std::lock_guard<std::mutex> l(pool->mu);
      pool->closed = true;
      idle.swap(pool->idle);
    }
    for (auto& c : idle) {
      ErrorCode ignored;
      c->sock.close(ignored);  // no operation is pending on an idle one
    }
  }
}

const std::string& CallClient::address() const { return pools_[0]->address; }

void CallClient::Call(std::shared_ptr<const std::string> request_frame,
                      std::chrono::steady_clock::time_point deadline, Done done,
                      std::shared_ptr<BodyStream> body) {
  Pool& pool = PoolHere();
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> l(pool.mu);
    if (!pool.closed) {
      if (!pool.idle.empty()) {
        c = std::move(pool.idle.back());
        pool.idle.pop_back();
        c->reused = true;
      } else {
        c = std::make_shared<Conn>(pool.shared_from_this());
      }
      pool.busy.insert(c.get());
    }
  }
  if (!c)
    return done(absl::UnavailableError("the gateway is shutting down"),
                nullptr);  // (a body not pulled yet goes with the call)
  c->out = std::move(request_frame);
  c->body_out = std::move(body);
  c->done = std::move(done);
  c->deadline = deadline;
  // Inline when this thread runs the io_context (and the strand is free).
  asio::dispatch(c->strand, [c] { c->Start(); });
}

void CallClient::Close() {
  std::vector<std::shared_ptr<Conn>> idle, busy;
  for (auto& pool : pools_) {
    std::lock_guard<std::mutex> l(pool->mu);
    pool->closed = true;
    pool->aborted = true;
    for (auto& c : pool->idle) idle.push_back(std::move(c));
    pool->idle.clear();
    for (Conn* c : pool->busy)
      if (auto p = c->weak_from_this().lock()) busy.push_back(std::move(p));
  }
  for (auto& c : idle) {
    ErrorCode ignored;
    c->sock.close(ignored);  // no operation is pending on an idle one
  }
  for (auto& c : busy)
    asio::post(c->strand, [c] {
      ErrorCode ignored;
      c->sock.close(ignored);
    });
}

}  // namespace silt::gateway
