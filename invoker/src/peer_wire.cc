#include "peer_wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "silt/state_wire.h"

namespace silt::invoker {

std::unique_ptr<PeerConn> PeerPool::Take(const std::string& addr) {
  {
    absl::MutexLock l(&mu_);
    auto& pool = idle_[addr];
    while (!pool.empty()) {
      auto c = std::move(pool.back());
      pool.pop_back();
      // A pooled connection whose peer went away reads EOF or an error
      // right away: drop it rather than send on it.
      char b;
      ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return c;
    }
  }
  std::string hello = hello_();
  if (hello.empty()) return nullptr;
  auto fd = Dial(addr);
  if (!fd.ok()) return nullptr;
  auto c = std::make_unique<PeerConn>();
  c->fd = *fd;
  if (!WriteBytesFrame(c->fd, hello).ok()) return nullptr;
  c->reader = std::make_unique<FrameReader>(*fd, wire::kMaxFrameBytes + 64);
  return c;
}

void PeerPool::Give(const std::string& addr, std::unique_ptr<PeerConn> c) {
  absl::MutexLock l(&mu_);
  auto& pool = idle_[addr];
  if (pool.size() < max_idle_) pool.push_back(std::move(c));
}

std::string RunTaskFrame(const TaskTarget& t, std::string_view call) {
  std::string f;
  wire::Writer w(&f);
  w.U8(static_cast<uint8_t>(PeerOp::kRunTask));
  w.Str(t.ns);
  w.Str(t.function);
  w.U64(t.generation);
  w.U32(t.timeout_ms);
  w.Str(call);
  return f;
}

bool ReadRunTask(wire::Reader& r, TaskTarget* t, std::string_view* call) {
  std::string_view ns, fn;
  if (!r.Str(&ns) || !r.Str(&fn) || !r.U64(&t->generation) ||
      !r.U32(&t->timeout_ms) || !r.Str(call))
    return false;
  t->ns = std::string(ns);
  t->function = std::string(fn);
  return true;
}

absl::StatusOr<std::pair<std::string, uint16_t>> SplitHostPort(
    const std::string& addr) {
  size_t colon = addr.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(addr.substr(colon + 1), &port) || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("bad address \"", addr, "\" (want host:port)"));
  return std::make_pair(addr.substr(0, colon), static_cast<uint16_t>(port));
}

absl::StatusOr<int> Dial(const std::string& addr) {
  auto hp = SplitHostPort(addr);
  if (!hp.ok()) return hp.status();
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(hp->second);
  if (inet_pton(AF_INET, hp->first.c_str(), &sa.sin_addr) != 1)
    return absl::InvalidArgumentError(absl::StrCat("bad IPv4 address ", addr));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", addr, ": ", strerror(err)));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

void DataKey::Set(const std::string& key) {
  absl::MutexLock l(&mu_);
  key_ = key;
}

std::string DataKey::Hello() const {
  absl::MutexLock l(&mu_);
  if (key_.empty()) return "";
  std::string frame;
  wire::Writer w(&frame);
  w.U8(static_cast<uint8_t>(PeerOp::kHello));
  w.Str(key_);
  return frame;
}

bool DataKey::Matches(std::string_view key) const {
  absl::MutexLock l(&mu_);
  // A node that has just registered may be called before its first
  // assignment (which carries the key) is applied.
  mu_.AwaitWithTimeout(
      absl::Condition(
          +[](const std::string* k) { return !k->empty(); }, &key_),
      kKeyWait);
  if (key_.empty() || key.size() != key_.size()) return false;
  unsigned char diff = 0;  // constant time
  for (size_t i = 0; i < key.size(); ++i) diff |= key[i] ^ key_[i];
  return diff == 0;
}

MigrationPriority::MigrationPriority()
    : tid_(static_cast<int>(syscall(SYS_gettid))) {
  errno = 0;
  old_ = getpriority(PRIO_PROCESS, tid_);
  changed_ = errno == 0 && setpriority(PRIO_PROCESS, tid_, -10) == 0;
}

MigrationPriority::~MigrationPriority() {
  if (changed_) (void)setpriority(PRIO_PROCESS, tid_, old_);
}

RealtimeSection::RealtimeSection() : policy_(sched_getscheduler(0)) {
  if (policy_ < 0 || sched_getparam(0, &param_) != 0) return;
  sched_param rt{};
  rt.sched_priority = 1;  // the lowest: above every ordinary thread
  changed_ = sched_setscheduler(0, SCHED_FIFO, &rt) == 0;
}

RealtimeSection::~RealtimeSection() {
  if (changed_) (void)sched_setscheduler(0, policy_, &param_);
}

}  // namespace silt::invoker
