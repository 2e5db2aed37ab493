#include "instance_leases.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "instance_leases_impl.h"

namespace silt::gateway {
namespace leases {
namespace {

// Leases of one function version held at most.
constexpr size_t kMaxPerFunction = 64;
// A call that finds every lease of its function busy waits this long for
// one (and at most this many wait), then goes to the call port, where the
// invoker starts an instance, queues it or refuses it, as for any call.
constexpr auto kWaitForLease = std::chrono::milliseconds(5);
constexpr size_t kMaxWaiting = 256;
// After the invoker had none to lend, the next ask waits this long (the
// calls meanwhile go to the call port).
constexpr auto kAskAgainAfter = std::chrono::milliseconds(1);
// How often idle leases are looked at (InstanceLeases::kIdleHold).
constexpr auto kSweepEvery = std::chrono::milliseconds(100);
// A lease frame from the invoker is small.
constexpr uint32_t kMaxLeaseFrame = 1u << 20;

const cw::Returned kInvokerGone{.failure = cw::Failure::kCrash,
                                .text = "ended: its node's invoker went away"};

std::string KeyOf(const cw::Request& r) {
  return absl::StrCat(r.ns, "/", r.name, "/", r.generation);
}

}  // namespace

std::string Core::AskLocked(const std::string& key, const std::string& ns,
                            const std::string& name, uint64_t generation) {
  if (down || asking.contains(key) || held_count[key] >= kMaxPerFunction)
    return "";
  if (auto it = ask_after.find(key);
      it != ask_after.end() && Clock::now() < it->second)
    return "";
  cw::LeaseAsk ask{
      .ask = next_ask++, .ns = ns, .name = name, .generation = generation};
  asks[ask.ask] = key;
  asking.insert(key);
  std::string frame;
  cw::AppendLeaseAsk(&frame, ask);
  return frame;
}

void Core::Free(std::shared_ptr<Leased> l) {
  std::unique_lock<std::mutex> g(mu);
  l->last_used = Clock::now();
  if (l->recalled || down) {
    g.unlock();
    l->ended = true;
    return GiveBack(*l, cw::ReturnHow::kIdle);
  }
  auto w = waiting.find(l->key);
  if (w == waiting.end() || w->second.empty()) {
    idle[l->key].push_back(std::move(l));
    ArmSweepLocked();
    return;
  }
  std::shared_ptr<Waiter> next = std::move(w->second.front());
  w->second.pop_front();
  if (w->second.empty()) waiting.erase(w);
  next->taken = true;
  g.unlock();
  auto run = [l, next] {
    next->timer->cancel();
    l->Start(*next->ioc, *next->req, std::move(next->done),
             Clock::now() - next->since);
  };
  if (next->ioc->get_executor().running_in_this_thread()) return run();
  // Its channel leaves this thread's io_context here, where nothing is
  // pending on it, and joins the waiter's there.
  l->Unbind();
  asio::post(*next->ioc, std::move(run));
}

std::deque<std::shared_ptr<Waiter>> Core::TakeWaitersLocked(
    const std::string& key) {
  std::deque<std::shared_ptr<Waiter>> calls;
  if (auto w = waiting.find(key); w != waiting.end()) {
    calls = std::move(w->second);
    waiting.erase(w);
    for (auto& c : calls) c->taken = true;
  }
  return calls;
}

void Core::Elsewhere(std::deque<std::shared_ptr<Waiter>> calls) {
  for (auto& w : calls)
    asio::post(*w->ioc, [w] {
      w->timer->cancel();
      w->elsewhere();
    });
}

void Core::GiveBack(Leased& l, cw::ReturnHow how,
                    std::function<void(cw::Returned)> answer,
                    asio::io_context* ioc) {
  l.Close();
  std::deque<std::shared_ptr<Waiter>> orphans;
  {
    std::lock_guard<std::mutex> g(mu);
    // The calls that wait for its function, with no lease of it left.
    if (held.erase(l.id) > 0 && --held_count[l.key] == 0) {
      orphans = TakeWaitersLocked(l.key);
    }
    awaiting.erase(l.id);  // (a kCheck's, for a call that timed out)
    if (answer && !down) awaiting[l.id] = {answer, ioc};
  }
  Elsewhere(std::move(orphans));
  std::string frame;
  cw::AppendReturn(&frame, {.lease = l.id, .how = how});
  bool sent = !down && Send(frame);
  if (answer && !sent) {
    {
      std::lock_guard<std::mutex> g(mu);
      awaiting.erase(l.id);
    }
    answer(kInvokerGone);
  }
}

void Core::ArmSweepLocked() {
  if (sweeping || !sweep) return;
  sweeping = true;
  sweep->expires_after(kSweepEvery);
  sweep->async_wait([self = shared_from_this()](ErrorCode ec) {
    {
      std::lock_guard<std::mutex> g(self->mu);
      self->sweeping = false;
    }
    if (!ec) self->Sweep();
  });
}

void Core::Sweep() {
  const auto cutoff = Clock::now() - InstanceLeases::kIdleHold;
  std::vector<std::shared_ptr<Leased>> back;
  {
    std::lock_guard<std::mutex> g(mu);
    for (auto it = idle.begin(); it != idle.end();) {
      auto& v = it->second;
      auto keep = std::partition(v.begin(), v.end(),
                                 [&](const std::shared_ptr<Leased>& l) {
                                   return l->last_used > cutoff;
                                 });
      for (auto i = keep; i != v.end(); ++i) back.push_back(std::move(*i));
      v.erase(keep, v.end());
      if (v.empty()) {
        idle.erase(it++);
      } else {
        ++it;
      }
    }
    if (!idle.empty()) ArmSweepLocked();
  }
  // (Nobody's call's: closed here, whatever thread had them.)
  for (auto& l : back) {
    l->ended = true;
    GiveBack(*l, cw::ReturnHow::kIdle);
  }
}

void Core::LinkDown() {
  std::vector<std::shared_ptr<Leased>> idle_ones;
  absl::flat_hash_map<uint64_t, Answer> answers;
  std::deque<std::shared_ptr<Waiter>> calls;
  {
    std::lock_guard<std::mutex> g(mu);
    down = true;
    for (auto& [key, v] : waiting)
      for (auto& w : v) {
        w->taken = true;
        calls.push_back(std::move(w));
      }
    waiting.clear();
    for (auto& [key, v] : idle)
      for (auto& l : v) idle_ones.push_back(std::move(l));
    idle.clear();
    answers.swap(awaiting);
  }
  for (auto& l : idle_ones) {
    l->ended = true;
    GiveBack(*l, cw::ReturnHow::kIdle);
  }
  for (auto& [lease, a] : answers)
    asio::post(*a.ioc, [fn = std::move(a.fn)] { fn(kInvokerGone); });
  Elsewhere(std::move(calls));
}

void Core::Handle(std::string_view frame, std::deque<int>& fds) {
  switch (static_cast<cw::Op>(cw::OpOf(frame))) {
    case cw::Op::kLeased: {
      cw::Leased got;
      if (!cw::ParseLeased(frame, &got) || fds.empty()) break;
      const int channel = fds.front();
      fds.pop_front();
      std::shared_ptr<Leased> l;
      {
        std::lock_guard<std::mutex> g(mu);
        auto it = asks.find(got.ask);
        if (it == asks.end()) {
          close(channel);
          return;
        }
        std::string key = std::move(it->second);
        asks.erase(it);
        asking.erase(key);
        l = std::make_shared<Leased>(shared_from_this(), got, key, channel);
        held[l->id] = l;
        ++held_count[key];
      }
      Free(std::move(l));
      return;
    }
    case cw::Op::kNoLease: {
      uint64_t ask;
      if (!cw::ParseNoLease(frame, &ask)) break;
      std::deque<std::shared_ptr<Waiter>> orphans;
      {
        std::lock_guard<std::mutex> g(mu);
        auto it = asks.find(ask);
        if (it == asks.end()) return;
        const std::string key = std::move(it->second);
        asks.erase(it);
        asking.erase(key);
        ask_after[key] = Clock::now() + kAskAgainAfter;
        // Calls that waited for this one, with no lease of theirs held.
        if (held_count[key] == 0) orphans = TakeWaitersLocked(key);
      }
      Elsewhere(std::move(orphans));
      return;
    }
    case cw::Op::kReturned: {
      cw::Returned r;
      if (!cw::ParseReturned(frame, &r)) break;
      Answer a;
      {
        std::lock_guard<std::mutex> g(mu);
        auto it = awaiting.find(r.lease);
        if (it == awaiting.end()) return;
        a = std::move(it->second);
        awaiting.erase(it);
      }
      asio::post(*a.ioc, [fn = std::move(a.fn), r = std::move(r)]() mutable {
        fn(std::move(r));
      });
      return;
    }
    case cw::Op::kRecall: {
      uint64_t lease;
      if (!cw::ParseRecall(frame, &lease)) break;
      std::shared_ptr<Leased> l;
      {
        std::lock_guard<std::mutex> g(mu);
        auto it = held.find(lease);
        if (it == held.end()) return;
        it->second->recalled = true;  // a busy one goes when its call ends
        auto v = idle.find(it->second->key);
        if (v == idle.end()) return;
        auto at = std::find(v->second.begin(), v->second.end(), it->second);
        if (at == v->second.end()) return;
        l = std::move(*at);
        v->second.erase(at);
      }
      l->ended = true;
      GiveBack(*l, cw::ReturnHow::kIdle);
      return;
    }
    default:
      break;
  }
  fprintf(stderr, "silt-gateway: malformed lease frame from an invoker\n");
  shutdown(fd, SHUT_RDWR);
}

void Core::ReadLoop() {
  std::string buf;
  size_t have = 0;
  std::deque<int> fds;
  while (true) {
    if (buf.size() < have + 4096) buf.resize(have + 4096);
    iovec iov{buf.data() + have, buf.size() - have};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int got;
        memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.push_back(got);
      }
    }
    if (n <= 0) break;
    have += static_cast<size_t>(n);
    size_t at = 0;
    bool bad = false;
    while (have - at >= 4) {
      uint32_t len;
      memcpy(&len, buf.data() + at, 4);
      if (len > kMaxLeaseFrame) {
        bad = true;
        break;
      }
      if (have - at < 4 + static_cast<size_t>(len)) break;
      Handle(std::string_view(buf.data() + at + 4, len), fds);
      at += 4 + len;
    }
    if (bad) break;
    memmove(buf.data(), buf.data() + at, have - at);
    have -= at;
  }
  for (int f : fds) close(f);
  LinkDown();
}

}  // namespace leases

namespace asio = boost::asio;
namespace cw = invoker::call_wire;
using leases::Clock;
using leases::Core;
using leases::ErrorCode;
using leases::Leased;
using leases::Waiter;

absl::StatusOr<std::unique_ptr<InstanceLeases>> InstanceLeases::Connect(
    const std::vector<asio::io_context*>& contexts, const std::string& socket,
    const std::string& key) {
  if (contexts.empty() || socket.size() < 2 || socket[0] != '@' ||
      socket.size() > sizeof(sockaddr_un::sun_path))
    return absl::InvalidArgumentError(
        absl::StrCat("bad lease socket ", socket));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path + 1, socket.data() + 1, socket.size() - 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  socklen_t len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", socket, ": ", strerror(err)));
  }
  auto core = std::make_shared<Core>();
  core->fd = fd;
  core->contexts = contexts;
  core->sweep.emplace(*contexts[0]);
  std::string hello;
  cw::AppendHello(&hello, key);
  if (!core->Send(hello))
    return absl::UnavailableError(absl::StrCat("cannot reach ", socket));
  core->reader = std::thread([c = core.get()] { c->ReadLoop(); });
  return std::unique_ptr<InstanceLeases>(new InstanceLeases(std::move(core)));
}

InstanceLeases::InstanceLeases(std::shared_ptr<Core> core)
    : core_(std::move(core)) {}

InstanceLeases::~InstanceLeases() {
  Close();
  if (core_->reader.joinable()) core_->reader.join();
}

void InstanceLeases::Close() {
  // The reader sees the end and takes the leases down.
  shutdown(core_->fd, SHUT_RDWR);
}

InstanceLeases::Took InstanceLeases::TryCall(cw::Request& req,
                                             CallClient::Done& done,
                                             std::function<void()>& elsewhere) {
  if (core_->down.load(std::memory_order_relaxed)) return Took::kNo;
  asio::io_context* here = core_->ContextHere();
  if (here == nullptr) return Took::kNo;
  std::string key = leases::KeyOf(req);
  std::shared_ptr<Leased> l;
  std::shared_ptr<Waiter> w;
  {
    std::lock_guard<std::mutex> g(core_->mu);
    if (core_->down) return Took::kNo;
    if (auto it = core_->idle.find(key);
        it != core_->idle.end() && !it->second.empty()) {
      // One this thread had last, if any (its channel stays put).
      auto& v = it->second;
      auto mine = std::find_if(v.rbegin(), v.rend(), [here](const auto& c) {
        return c->ioc == here;
      });
      auto at = mine != v.rend() ? std::next(mine).base() : v.end() - 1;
      l = std::move(*at);
      v.erase(at);
    } else if (auto held = core_->held_count.find(key);
               ((held != core_->held_count.end() && held->second > 0) ||
                core_->asking.contains(key)) &&
               core_->waiting[key].size() < leases::kMaxWaiting) {
      // Every lease of it is busy, or one is on its way (asked for after a
      // call whose instance is idle now: on the call port, this call would
      // find it lent): the call waits for one, a while.
      w = std::make_shared<Waiter>();
      w->req = &req;
      w->done = std::move(done);
      w->elsewhere = std::move(elsewhere);
      w->since = Clock::now();
      w->ioc = here;
      w->timer.emplace(*here);
      core_->waiting[key].push_back(w);
    } else {
      return Took::kNo;
    }
  }
  if (l) {
    l->Start(*here, req, std::move(done));
    return Took::kStarted;
  }
  w->timer->expires_after(leases::kWaitForLease);
  w->timer->async_wait([core = core_, w, key](ErrorCode ec) {
    if (ec) return;
    {
      std::lock_guard<std::mutex> g(core->mu);
      if (w->taken) return;
      w->taken = true;
      auto it = core->waiting.find(key);
      if (it != core->waiting.end()) {
        auto& v = it->second;
        v.erase(std::remove(v.begin(), v.end(), w), v.end());
        if (v.empty()) core->waiting.erase(it);
      }
    }
    w->elsewhere();
  });
  return Took::kWaits;
}

void InstanceLeases::AskAfterCall(const std::string& ns,
                                  const std::string& name,
                                  uint64_t generation) {
  if (core_->down.load(std::memory_order_relaxed)) return;
  std::string key = absl::StrCat(ns, "/", name, "/", generation);
  std::string frame;
  {
    std::lock_guard<std::mutex> g(core_->mu);
    if (auto it = core_->idle.find(key);
        it != core_->idle.end() && !it->second.empty())
      return;  // one is idle already
    frame = core_->AskLocked(key, ns, name, generation);
  }
  if (!frame.empty()) core_->Send(frame);
}

}  // namespace silt::gateway
