// A call on a lease (instance_leases_impl.h's Leased): the instance's frame
// out on its channel, its answer (whole or streamed) back, and what ends the
// call early (a broken channel, a timeout, a caller gone).
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "instance_leases_impl.h"
#include "invoker/worker_call.h"

namespace silt::gateway::leases {
namespace {

// The instance channel's largest frame (invoker/src/channel.h).
constexpr uint32_t kMaxReplyFrame = 256u << 20;

}  // namespace

void Leased::Unbind() {
  if (!sock) return;
  ErrorCode ec;
  timer.reset();
  fd = sock->release(ec);
  sock.reset();
  ioc = nullptr;
  if (ec) fd = -1;
}

bool Leased::Bind(asio::io_context& on) {
  if (ioc == &on && sock) return true;
  Unbind();
  if (fd < 0) return false;
  ErrorCode ec;
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

void Leased::Close() {
  ErrorCode ignored;
  if (sock) sock->close(ignored);
  if (fd >= 0) close(fd);
  fd = -1;
}

void Leased::Start(asio::io_context& on, cw::Request& req, CallClient::Done d,
                   Clock::duration waited) {
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
  const auto left =
      static_cast<uint32_t>(std::max<int64_t>(1, int64_t{call_ms} - waited_ms));
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

void Leased::Read() {
  if (in.size() < have + 4096) in.resize(have + 4096);
  sock->async_read_some(asio::buffer(in.data() + have, in.size() - have),
                        [self = shared_from_this()](ErrorCode ec, size_t n) {
                          if (!self->busy) return;  // the call is over
                          if (ec) return self->Fail(cw::ReturnHow::kBroken);
                          self->have += n;
                          self->TakeFrame();
                        });
}

void Leased::TakeFrame() {
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

cw::Reply Leased::ReplyOf(v1::WorkerReply& r, const std::string& instance) {
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

void Leased::Finish(v1::WorkerReply reply) {
  timer->cancel();
  busy = false;
  CallClient::Done d = std::move(done);
  cw::Reply r = ReplyOf(reply, instance);
  core->Free(shared_from_this());
  d(std::move(r), nullptr);
}

void Leased::Check(v1::WorkerReply reply) {
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

void Leased::Lost(v1::WorkerReply reply) {
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

void Leased::Head(v1::WorkerReply& reply) {
  streaming = true;
  cw::Reply head = ReplyOf(reply, instance);
  head.head = true;
  CallClient::Done d = std::move(done);
  d(std::move(head), std::make_shared<Body>(shared_from_this(), seq));
}

void Leased::TakePart(v1::WorkerReply& reply) {
  BodyStream::Next next = std::move(pull);
  pull = nullptr;
  if (reply.more())
    return next(BodyStream::Part{std::move(*reply.mutable_body()), false});
  timer->cancel();
  streaming = false;
  busy = false;
  // The handler failed after its head was out: the body breaks off.
  absl::StatusOr<BodyStream::Part> last =
      reply.error().empty() ? absl::StatusOr<BodyStream::Part>(BodyStream::Part{
                                  std::move(*reply.mutable_body()), true})
                            : absl::AbortedError(reply.error());
  core->Free(shared_from_this());
  next(std::move(last));
}

void Leased::Fail(cw::ReturnHow how) {
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

void Leased::Report(cw::ReturnHow how, const cw::Returned& why) {
  if (!busy) return;
  absl::Status s;
  switch (how) {
    case cw::ReturnHow::kTimedOut:
      s = absl::DeadlineExceededError(
          absl::StrCat("function ", name, " timed out after ", call_ms, " ms"));
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

void Leased::PullFor(uint64_t call, BodyStream::Next next) {
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

void Leased::CancelFor(uint64_t call) {
  asio::post(*ioc, [self = shared_from_this(), call] {
    if (call != self->seq || !self->streaming) return;
    self->Fail(cw::ReturnHow::kCallerGone);
  });
}

}  // namespace silt::gateway::leases
