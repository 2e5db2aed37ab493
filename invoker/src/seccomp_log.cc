#include "seccomp_log.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace silt::invoker {
namespace {

// The number after `key` in a record ("pid=123 ... syscall=272").
std::optional<int> Field(std::string_view rec, std::string_view key) {
  size_t at = rec.find(key);
  if (at == rec.npos) return std::nullopt;
  std::string_view rest = rec.substr(at + key.size());
  std::string_view digits =
      rest.substr(0, rest.find_first_not_of("0123456789"));
  int v;
  if (!absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &v))
    return std::nullopt;
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SeccompLog>> SeccompLog::Start() {
  int kmsg = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (kmsg < 0)
    return absl::UnavailableError(
        absl::StrCat("cannot read /dev/kmsg: ", strerror(errno)));
  lseek(kmsg, 0, SEEK_END);  // only what happens from now on
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(kmsg);
    return absl::InternalError("eventfd failed");
  }
  auto log = std::unique_ptr<SeccompLog>(new SeccompLog(kmsg, wake));
  log->reader_ = std::thread([p = log.get()] { p->ReadLoop(); });
  return log;
}

SeccompLog::SeccompLog(int kmsg, int wake) : kmsg_(kmsg), wake_(wake) {}

SeccompLog::~SeccompLog() {
  uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
  if (reader_.joinable()) reader_.join();
  close(kmsg_);
  close(wake_);
}

void SeccompLog::ReadLoop() {
  char rec[8192];
  while (true) {
    pollfd fds[2] = {{kmsg_, POLLIN, 0}, {wake_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    while (true) {  // one record per read
      ssize_t n = read(kmsg_, rec, sizeof(rec));
      if (n < 0 && errno == EPIPE) continue;  // overwritten meanwhile
      if (n <= 0) break;
      std::string_view r(rec, static_cast<size_t>(n));
      if (r.find("type=1326") == r.npos) continue;
      auto pid = Field(r, " pid="), nr = Field(r, " syscall=");
      if (!pid || !nr) continue;
      absl::MutexLock l(&mu_);
      kills_.emplace_back(*pid, *nr);
      if (kills_.size() > kMaxRecords) kills_.pop_front();
    }
  }
}

std::optional<int> SeccompLog::KilledBy(pid_t pid, absl::Duration wait) {
  std::optional<int> nr;
  auto logged = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [p, n] : kills_)
      if (p == pid) nr = n;
    return nr.has_value();
  };
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&logged), wait);
  return nr;
}

}  // namespace silt::invoker
