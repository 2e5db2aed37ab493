#include "conn_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "peer_wire.h"

namespace silt::invoker {

absl::StatusOr<std::unique_ptr<ConnServer>> ConnServer::Listen(
    const std::string& listen, Serve serve) {
  auto hp = SplitHostPort(listen);
  if (!hp.ok()) return hp.status();
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(hp->second);
  if (inet_pton(AF_INET, hp->first.c_str(), &sa.sin_addr) != 1)
    return absl::InvalidArgumentError(
        absl::StrCat("bad listen address ", listen));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  int one = 1;  // a restart binds its port again despite TIME_WAIT
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(fd, 128) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, ": ", strerror(err)));
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  return std::unique_ptr<ConnServer>(new ConnServer(
      fd, absl::StrCat(hp->first, ":", ntohs(sa.sin_port)), std::move(serve)));
}

absl::StatusOr<std::unique_ptr<ConnServer>> ConnServer::ListenAbstract(
    const std::string& name, Serve serve) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(sa.sun_path))
    return absl::InvalidArgumentError(
        absl::StrCat("bad abstract socket name ", name));
  memcpy(sa.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  socklen_t len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      ::listen(fd, 128) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on @", name, ": ", strerror(err)));
  }
  return std::unique_ptr<ConnServer>(
      new ConnServer(fd, absl::StrCat("@", name), std::move(serve)));
}

ConnServer::ConnServer(int listener, std::string address, Serve serve)
    : serve_(std::move(serve)),
      listener_(listener),
      address_(std::move(address)) {}

ConnServer::~ConnServer() {
  Shutdown();
  Join();
}

void ConnServer::StartAccepting() {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

void ConnServer::Shutdown() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    for (auto& [id, fd] : conn_fds_) shutdown(fd, SHUT_RDWR);
  }
  if (listener_ >= 0) shutdown(listener_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
}

void ConnServer::Join() {
  std::map<uint64_t, std::thread> threads;
  {
    absl::MutexLock l(&mu_);
    threads.swap(conn_threads_);
  }
  for (auto& [id, t] : threads) t.join();
  if (listener_ >= 0) close(listener_);
  listener_ = -1;
}

void ConnServer::AcceptLoop() {
  while (true) {
    int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    int one = 1;  // (fails harmlessly on a unix socket)
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Spawn(fd);
  }
}

void ConnServer::Spawn(int fd) {
  absl::MutexLock l(&mu_);
  for (uint64_t id : finished_) {
    auto it = conn_threads_.find(id);
    if (it != conn_threads_.end()) {
      it->second.join();
      conn_threads_.erase(it);
    }
  }
  finished_.clear();
  if (stopping_) {
    close(fd);
    return;
  }
  uint64_t id = next_conn_++;
  conn_fds_[id] = fd;
  conn_threads_[id] = std::thread([this, id, fd] {
    serve_(fd);
    absl::MutexLock l(&mu_);
    conn_fds_.erase(id);
    close(fd);
    finished_.push_back(id);
  });
}

}  // namespace silt::invoker
