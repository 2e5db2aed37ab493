#include "logs.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>

namespace silt::invoker {

int64_t WallNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

LogCollector::LogCollector(LogBook* book) : book_(book) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  int p[2];
  (void)!pipe2(p, O_CLOEXEC | O_NONBLOCK);
  wake_r_ = p[0];
  wake_w_ = p[1];
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_r_;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_r_, &ev);
  thread_ = std::thread([this] { Loop(); });
}

LogCollector::~LogCollector() {
  stop_ = true;
  (void)!write(wake_w_, "x", 1);
  thread_.join();
  for (auto& [fd, src] : sources_) close(fd);
  close(epfd_);
  close(wake_r_);
  close(wake_w_);
}

void LogCollector::Add(int fd, const std::string& fn_key,
                       const std::string& instance) {
  fcntl(fd, F_SETFL, O_NONBLOCK);
  {
    std::lock_guard<std::mutex> l(mu_);
    sources_[fd] = {fn_key, instance, ""};
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
}

void LogCollector::Loop() {
  epoll_event events[32];
  char buf[65536];
  while (!stop_) {
    int n = epoll_wait(epfd_, events, 32, -1);
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_r_) continue;
      ssize_t r = read(fd, buf, sizeof(buf));
      std::lock_guard<std::mutex> l(mu_);
      auto it = sources_.find(fd);
      if (it == sources_.end()) continue;
      if (r > 0) {
        it->second.partial.append(buf, static_cast<size_t>(r));
        size_t nl;
        while ((nl = it->second.partial.find('\n')) != std::string::npos) {
          book_->Append(it->second.fn_key, it->second.instance,
                        it->second.partial.substr(0, nl));
          it->second.partial.erase(0, nl + 1);
        }
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        if (!it->second.partial.empty())
          book_->Append(it->second.fn_key, it->second.instance,
                        it->second.partial);
        epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
        close(fd);
        sources_.erase(it);
      }
    }
  }
}
}  // namespace silt::invoker
