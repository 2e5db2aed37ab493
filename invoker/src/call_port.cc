#include "call_port.h"

#include <poll.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "frames.h"

namespace silt::invoker {

absl::StatusOr<std::unique_ptr<CallPort>> CallPort::Listen(
    const std::string& listen, const DataKey& key, Handler handler) {
  std::unique_ptr<CallPort> port(new CallPort(key, std::move(handler)));
  auto server = ConnServer::Listen(
      listen, [p = port.get()](int fd) { p->ServeGateway(fd); });
  if (!server.ok()) return server.status();
  port->server_ = *std::move(server);
  port->server_->StartAccepting();
  return port;
}

absl::Status AwaitFrame(int channel, int watch,
                        std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    pollfd p[2] = {{channel, POLLIN, 0}, {watch, POLLIN | POLLRDHUP, 0}};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    int n = poll(p, 2, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
    if (p[1].revents != 0)
      return absl::CancelledError("the caller's connection closed");
    if (p[0].revents != 0) return absl::OkStatus();
    if (n == 0) return absl::DeadlineExceededError("no frame in time");
  }
}

bool ReplyStream::Head(const call_wire::Reply& head) {
  if (broken_ || started_) return false;
  started_ = true;
  call_wire::Reply r = head;
  r.head = true;
  out_.clear();
  call_wire::AppendReply(&out_, r);
  broken_ = !WriteAll(fd_, out_).ok();
  return !broken_;
}

bool ReplyStream::Part(std::string_view bytes) {
  if (broken_ || !started_) return false;
  if (bytes.empty()) return true;
  char prefix[5];
  uint32_t n = static_cast<uint32_t>(bytes.size() + 1);
  memcpy(prefix, &n, 4);
  prefix[4] = static_cast<char>(call_wire::Op::kBodyPart);
  iovec iov[2] = {{prefix, sizeof(prefix)},
                  {const_cast<char*>(bytes.data()), bytes.size()}};
  broken_ = !WriteAllV(fd_, iov, 2).ok();
  return !broken_;
}

absl::Status RequestBody::Next(std::string_view* bytes, bool* last) {
  if (done_) return absl::FailedPreconditionError("the body is over");
  absl::Status s = reader_.Next(&frame_);
  if (s.ok() && !call_wire::ParseRequestPart(frame_, bytes, last))
    s = absl::UnavailableError("the gateway sent no part of a body");
  if (!s.ok()) {
    done_ = true;
    return absl::UnavailableError(
        absl::StrCat("the request body broke off: ", s.message()));
  }
  done_ = *last;
  return absl::OkStatus();
}

absl::Status RequestBody::Drain() {
  std::string_view part;
  bool last = false;
  while (!done_)
    if (absl::Status s = Next(&part, &last); !s.ok()) return s;
  return absl::OkStatus();
}

CallPort::CallPort(const DataKey& key, Handler handler)
    : key_(key), handler_(std::move(handler)) {}

CallPort::~CallPort() { Stop(); }

void CallPort::Stop() {
  if (!server_) return;  // Listen failed
  server_->Shutdown();
  server_->Join();
}

void CallPort::ServeGateway(int fd) {
  FrameReader reader(fd, call_wire::kMaxFrameBytes);
  std::string frame, out;
  {
    std::string_view key;
    if (!reader.Next(&frame).ok() || !call_wire::ParseHello(frame, &key) ||
        !key_.Matches(key))
      return;
  }
  while (reader.Next(&frame).ok()) {
    call_wire::Request req;
    if (!call_wire::ParseRequest(frame, &req)) {
      fprintf(stderr, "silt-invoker: malformed call frame; closing\n");
      return;
    }
    if (frame.capacity() > (1 << 20)) std::string().swap(frame);
    call_wire::Reply reply;
    ReplyStream stream(fd);
    std::optional<RequestBody> body;
    if (req.head) body.emplace(reader);
    try {
      handler_(req, body ? &*body : nullptr, &reply, stream);
    } catch (const std::exception& e) {
      fprintf(stderr, "silt-invoker: call to %s/%s: %s\n", req.ns.c_str(),
              req.name.c_str(), e.what());
      reply = call_wire::Reply();
      reply.outcome = call_wire::Outcome::kError;
      reply.error_code = static_cast<uint8_t>(absl::StatusCode::kInternal);
      reply.error = "internal error";
    }
    if (stream.broken()) return;
    // The gateway reads the answer once it has sent the whole body.
    if (body && !body->Drain().ok()) return;
    reply.head = false;
    out.clear();
    call_wire::AppendReply(&out, reply);
    if (!WriteAll(fd, out).ok()) return;
    if (out.capacity() > (1 << 20)) std::string().swap(out);
  }
}

}  // namespace silt::invoker
