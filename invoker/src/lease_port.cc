#include "lease_port.h"

#include <sys/socket.h>

#include <cstdio>
#include <exception>
#include <utility>

#include "frames.h"

namespace silt::invoker {

absl::StatusOr<std::unique_ptr<LeasePort>> LeasePort::Listen(
    const std::string& name, const DataKey& key, Handlers handlers) {
  std::unique_ptr<LeasePort> port(new LeasePort(key, std::move(handlers)));
  auto server = ConnServer::ListenAbstract(
      name, [p = port.get()](int fd) { p->Serve(fd); });
  if (!server.ok()) return server.status();
  port->server_ = *std::move(server);
  port->server_->StartAccepting();
  return port;
}

LeasePort::~LeasePort() { Stop(); }

void LeasePort::Stop() {
  if (!server_) return;
  server_->Shutdown();
  server_->Join();
}

bool LeasePort::Send(Conn& conn, const std::string& frame, int fd) {
  std::lock_guard<std::mutex> l(conn.write_mu);
  if (fd < 0) return WriteAll(conn.fd, frame).ok();
  // The descriptor goes with the frame's first byte; the rest follows.
  ssize_t n = SendWithRights(conn.fd, frame, &fd, 1, MSG_NOSIGNAL);
  if (n <= 0) return false;
  return WriteAll(conn.fd, std::string_view(frame).substr(n)).ok();
}

void LeasePort::Recall(uint64_t conn, uint64_t lease) {
  std::shared_ptr<Conn> c;
  {
    absl::MutexLock l(&mu_);
    auto it = conns_.find(conn);
    if (it == conns_.end()) return;
    c = it->second;
  }
  std::string frame;
  call_wire::AppendRecall(&frame, lease);
  Send(*c, frame);  // a broken connection gives everything back (closed)
}

void LeasePort::Serve(int fd) {
  FrameReader reader(fd, 1 << 20);
  std::string frame;
  {
    std::string_view key;
    if (!reader.Next(&frame).ok() || !call_wire::ParseHello(frame, &key) ||
        !key_.Matches(key))
      return;
  }
  auto conn = std::make_shared<Conn>(fd);
  uint64_t id;
  {
    absl::MutexLock l(&mu_);
    id = next_conn_++;
    conns_[id] = conn;
  }
  std::string out;
  try {
    while (reader.Next(&frame).ok()) {
      out.clear();
      call_wire::LeaseAsk ask;
      call_wire::Return ret;
      if (call_wire::ParseLeaseAsk(frame, &ask)) {
        std::optional<Lent> lent = handlers_.lend(id, ask);
        if (!lent) {
          call_wire::AppendNoLease(&out, ask.ask);
          if (!Send(*conn, out)) break;
          continue;
        }
        call_wire::AppendLeased(&out, {.ask = ask.ask,
                                       .lease = lent->lease,
                                       .instance = std::move(lent->instance),
                                       .timeout_ms = lent->timeout_ms});
        if (!Send(*conn, out, lent->channel)) break;
      } else if (call_wire::ParseReturn(frame, &ret)) {
        call_wire::Returned answer = handlers_.take_back(id, ret);
        if (!call_wire::ReturnAnswered(ret.how)) continue;
        answer.lease = ret.lease;
        call_wire::AppendReturned(&out, answer);
        if (!Send(*conn, out)) break;
      } else {
        fprintf(stderr, "silt-invoker: malformed lease frame; closing\n");
        break;
      }
    }
  } catch (const std::exception& e) {
    fprintf(stderr, "silt-invoker: lease connection: %s\n", e.what());
  }
  {
    absl::MutexLock l(&mu_);
    conns_.erase(id);
  }
  handlers_.closed(id);
}

}  // namespace silt::invoker
