#include "common/callback_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace silt::testing {

std::string ReceivedRequest::Header(absl::string_view name) const {
  auto it = headers.find(absl::AsciiStrToLower(name));
  return it == headers.end() ? "" : it->second;
}

absl::StatusOr<std::unique_ptr<CallbackServer>> CallbackServer::Start() {
  std::unique_ptr<CallbackServer> s(new CallbackServer);
  s->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return absl::InternalError(strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(s->listen_fd_, 128) != 0 ||
      getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return absl::InternalError(absl::StrCat("listen: ", strerror(errno)));
  s->port_ = ntohs(a.sin_port);
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

CallbackServer::~CallbackServer() {
  stopping_ = true;
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

std::string CallbackServer::url() const {
  return absl::StrCat("http://127.0.0.1:", port_, "/");
}

void CallbackServer::Serve() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Handle(fd);
    close(fd);
  }
}

// One request per connection (the senders close after the answer).
void CallbackServer::Handle(int fd) {
  std::string in;
  char buf[65536];
  size_t header_end = std::string::npos;
  size_t want = 0;
  ReceivedRequest r;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) return;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return;
    in.append(buf, n);
    if (header_end == std::string::npos) {
      header_end = in.find("\r\n\r\n");
      if (header_end == std::string::npos) continue;
      std::vector<std::string> lines =
          absl::StrSplit(in.substr(0, header_end), "\r\n");
      std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
      if (first.size() >= 2) {
        r.method = first[0];
        r.target = first[1];
      }
      for (size_t i = 1; i < lines.size(); ++i) {
        size_t colon = lines[i].find(':');
        if (colon == std::string::npos) continue;
        r.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
            std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
      }
      size_t length = 0;
      if (!absl::SimpleAtoi(r.Header("Content-Length"), &length)) length = 0;
      want = header_end + 4 + length;
    }
    if (in.size() >= want) break;
  }
  r.body = in.substr(header_end + 4, want - header_end - 4);
  int status = status_;
  std::string answer = absl::StrCat("HTTP/1.1 ", status,
                                    " X\r\nContent-Length: 0\r\nConnection: "
                                    "close\r\n\r\n");
  (void)!write(fd, answer.data(), answer.size());
  {
    std::lock_guard<std::mutex> l(mu_);
    received_.push_back(std::move(r));
  }
  cv_.notify_all();
}

std::vector<ReceivedRequest> CallbackServer::WaitFor(
    size_t n, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, timeout, [&] { return received_.size() >= n; });
  return received_;
}

std::vector<ReceivedRequest> CallbackServer::Received() const {
  std::lock_guard<std::mutex> l(mu_);
  return received_;
}

}  // namespace silt::testing
