#include "call_port.h"

#include <cstdio>
#include <exception>
#include <utility>

#include "absl/status/status.h"
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
    try {
      handler_(req, &reply);
    } catch (const std::exception& e) {
      fprintf(stderr, "silt-invoker: call to %s/%s: %s\n", req.ns.c_str(),
              req.name.c_str(), e.what());
      reply = call_wire::Reply();
      reply.outcome = call_wire::Outcome::kError;
      reply.error_code = static_cast<uint8_t>(absl::StatusCode::kInternal);
      reply.error = "internal error";
    }
    out.clear();
    call_wire::AppendReply(&out, reply);
    if (!WriteAll(fd, out).ok()) return;
    if (out.capacity() > (1 << 20)) std::string().swap(out);
  }
}

}  // namespace silt::invoker
