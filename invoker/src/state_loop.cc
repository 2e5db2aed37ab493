#include "state_loop.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "frames.h"
#include "silt/state_wire.h"
#include "state_ring.h"

namespace silt::invoker {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxPoolThreads = 256;
constexpr auto kSpin = std::chrono::microseconds(50);
// epoll data: the kind of source in the top bits, its id below.
constexpr uint64_t kWake = uint64_t{1} << 62;
constexpr uint64_t kPeerBit = uint64_t{1} << 61;
constexpr uint64_t kRingBit = uint64_t{1} << 60;

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 1, nullptr,
          nullptr, 0);
}

// Frames in from a non-blocking socket, without zero-filling the buffer.
class InBuf {
 public:
  enum class Got { kFrame, kNone, kBad };
  enum class Fill { kDrained, kMore, kClosed };

  Got Take(size_t max, std::string* out) {
    size_t have = end_ - start_;
    if (have < 4) return Got::kNone;
    uint32_t len;
    memcpy(&len, data_.get() + start_, 4);
    if (len > max) return Got::kBad;
    if (have < 4 + size_t{len}) return Got::kNone;
    out->assign(data_.get() + start_ + 4, len);
    start_ += 4 + len;
    if (start_ == end_) start_ = end_ = 0;
    return Got::kFrame;
  }

  // Reads what the socket has (edge-triggered: until EAGAIN), stopping early
  // once `limit` bytes wait unread (kMore: read again after taking frames).
  // With hangup set (the event said the peer closed) a short read is not
  // taken as drained: only recv's 0 or EAGAIN end it, so EOF is seen.
  Fill Read(int fd, size_t limit, bool hangup = false) {
    while (true) {
      if (end_ - start_ >= limit) return Fill::kMore;
      if (cap_ - end_ < kReadChunk / 4) {
        size_t have = end_ - start_;
        if (cap_ - have >= kReadChunk) {
          memmove(data_.get(), data_.get() + start_, have);
        } else {
          size_t cap = std::max(cap_ * 2, have + kReadChunk);
          auto bigger = std::unique_ptr<char[]>(new char[cap]);
          if (have) memcpy(bigger.get(), data_.get() + start_, have);
          data_ = std::move(bigger);
          cap_ = cap;
        }
        start_ = 0;
        end_ = have;
      }
      const size_t space = cap_ - end_;
      ssize_t n = recv(fd, data_.get() + end_, space, MSG_DONTWAIT);
      if (n > 0) {
        end_ += static_cast<size_t>(n);
        // A short read took everything there was; what arrives later raises
        // a new edge. (Saves a recv that would only say EAGAIN.)
        if (static_cast<size_t>(n) < space && !hangup) return Fill::kDrained;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return Fill::kDrained;
      return Fill::kClosed;
    }
  }

 private:
  std::unique_ptr<char[]> data_;
  size_t cap_ = 0, start_ = 0, end_ = 0;
};

// Bytes out to a non-blocking socket.
class OutBuf {
 public:
  void Frame(std::string_view payload) {
    uint32_t len = static_cast<uint32_t>(payload.size());
    buf_.append(reinterpret_cast<const char*>(&len), 4);
    buf_.append(payload);
    queued_ += 4 + payload.size();
  }
  // The rest of a frame whose first bytes went out another way.
  void Raw(std::string_view bytes) {
    buf_.append(bytes);
    queued_ += bytes.size();
  }
  bool empty() const { return off_ == buf_.size(); }
  // Bytes ever queued / ever sent (to tell which frames left).
  uint64_t queued() const { return queued_; }
  uint64_t sent() const { return sent_; }
  // Sends what it can; false when the socket failed.
  bool Flush(int fd) {
    while (off_ < buf_.size()) {
      ssize_t n = send(fd, buf_.data() + off_, buf_.size() - off_,
                       MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        off_ += static_cast<size_t>(n);
        sent_ += static_cast<uint64_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    buf_.clear();
    off_ = 0;
    return true;
  }

 private:
  std::string buf_;
  size_t off_ = 0;
  uint64_t queued_ = 0, sent_ = 0;
};

}  // namespace

struct StateLoop::Impl {
  StateLoopBackend backend;
  size_t max_frame = 0;
  int epfd = -1;
  int wake_fd = -1;
  std::thread loop;

  // ---- owned by the loop thread ----
  struct Instance {
    uint64_t id = 0;
    int fd = -1;
    std::string ns, function;
    InBuf in;
    OutBuf out;
    bool busy = false;      // a request of it is being served
    bool readable = false;  // the socket may hold unread bytes
    bool hangup = false;    // the peer closed its end (read to EOF)
    bool dead = false;
    bool watch_out = false;     // EPOLLOUT is subscribed (a reply is stuck)
    StateRing* ring = nullptr;  // the shared mailbox, once asked for
    int doorbell = -1;          // its eventfd (in the epoll set)
    bool via_ring = false;      // the request being served came that way
  };
  struct Pending {
    uint64_t instance;
    std::string request;  // as the instance sent it (for the slow path)
    uint64_t end;         // OutBuf::queued() once its frame was queued
  };
  struct Peer {
    uint64_t id = 0;
    int fd = -1;
    std::string address;
    bool connected = false;
    bool failed = false;
    InBuf in;
    OutBuf out;
    std::deque<Pending> pending;
  };
  std::map<uint64_t, std::unique_ptr<Instance>> instances;
  std::map<uint64_t, std::unique_ptr<Peer>> peers;
  std::map<std::string, uint64_t> peer_by_address;
  std::vector<uint64_t> dirty_peers;
  uint64_t next_id = 1;

  // ---- handed between threads ----
  struct Attached {
    int fd;
    std::string ns, function;
  };
  struct Done {
    uint64_t instance;
    std::string reply;
    std::vector<int> fds;  // sent along with the reply, then closed
  };
  struct Task {
    uint64_t instance;
    std::string ns, function, request;
  };
  absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::vector<Attached> attached ABSL_GUARDED_BY(mu);
  std::vector<Done> done ABSL_GUARDED_BY(mu);
  std::deque<Task> tasks ABSL_GUARDED_BY(mu);
  size_t idle_threads ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::thread> pool ABSL_GUARDED_BY(mu);

  ~Impl() {
    {
      absl::MutexLock l(&mu);
      stopping = true;
    }
    Wake();
    if (loop.joinable()) loop.join();
    std::vector<std::thread> threads;
    {
      absl::MutexLock l(&mu);
      threads.swap(pool);
    }
    for (auto& t : threads) t.join();
    for (auto& [id, c] : instances) {
      close(c->fd);
      DropRing(*c);
    }
    for (auto& [id, p] : peers) close(p->fd);
    {
      absl::MutexLock l(&mu);
      for (auto& a : attached) close(a.fd);
      for (auto& d : done)
        for (int fd : d.fds) close(fd);
    }
    if (wake_fd >= 0) close(wake_fd);
    if (epfd >= 0) close(epfd);
  }

  void Wake() {
    uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  }

  // ---- the loop ----

  void Run() {
    epoll_event events[256];
    while (true) {
      // Poll a little before sleeping: a loop that sleeps is woken by an
      // inter-processor interrupt, tens of microseconds on a VM, once per
      // request when requests come one at a time (2x the rate of one client
      // on a remote shard here); after kSpin without work it sleeps.
      int n = epoll_wait(epfd, events, 256, 0);
      for (auto until = std::chrono::steady_clock::now() + kSpin;
           n == 0 && std::chrono::steady_clock::now() < until;)
        n = epoll_wait(epfd, events, 256, 0);
      if (n == 0) n = epoll_wait(epfd, events, 256, -1);
      if (n < 0 && errno != EINTR) return;
      for (int i = 0; i < n; ++i) {
        uint64_t tag = events[i].data.u64;
        if (tag == kWake) {
          uint64_t v;
          (void)!read(wake_fd, &v, sizeof(v));
          if (!TakeHandoffs()) return;
        } else if (tag & kRingBit) {
          OnRing(tag & ~kRingBit);
        } else if (tag & kPeerBit) {
          OnPeer(tag & ~kPeerBit, events[i].events);
        } else {
          OnInstance(tag, events[i].events);
        }
      }
      FlushPeers();
    }
  }

  // New connections and finished slow requests; false when stopping.
  bool TakeHandoffs() {
    std::vector<Attached> a;
    std::vector<Done> d;
    {
      absl::MutexLock l(&mu);
      if (stopping) return false;
      a.swap(attached);
      d.swap(done);
    }
    for (auto& x : a) AddInstance(x.fd, std::move(x.ns), std::move(x.function));
    for (auto& x : d) {
      auto it = instances.find(x.instance);
      if (it != instances.end()) Answer(*it->second, x.reply, x.fds);
      for (int fd : x.fds) close(fd);
    }
    return true;
  }

  void AddInstance(int fd, std::string ns, std::string function) {
    auto c = std::make_unique<Instance>();
    c->id = next_id++;
    c->fd = fd;
    c->ns = std::move(ns);
    c->function = std::move(function);
    c->readable = true;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    epoll_event ev{};
    // No EPOLLOUT unless a reply is stuck: a unix socket signals write space
    // each time the instance reads a reply, a wake-up per operation for
    // nothing.
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = c->id;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      return;
    }
    Instance& ref = *c;
    instances[c->id] = std::move(c);
    Serve(ref);
  }

  void OnInstance(uint64_t id, uint32_t events) {
    auto it = instances.find(id);
    if (it == instances.end()) return;
    Instance& c = *it->second;
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
      c.readable = true;
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) c.hangup = true;
    if ((events & EPOLLOUT) && !c.out.empty() && !c.out.Flush(c.fd))
      c.dead = true;
    Serve(c);
  }

  // Subscribes to EPOLLOUT exactly while c has unsent bytes.
  void WatchOut(Instance& c) {
    if (c.dead || c.watch_out == !c.out.empty()) return;
    c.watch_out = !c.out.empty();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET |
                (c.watch_out ? uint32_t{EPOLLOUT} : 0u);
    ev.data.u64 = c.id;
    epoll_ctl(epfd, EPOLL_CTL_MOD, c.fd, &ev);
  }

  // Reads and serves requests until the instance waits for an answer or has
  // nothing more to say.
  void Serve(Instance& c) {
    std::string req;
    while (!c.busy && !c.dead) {
      switch (c.in.Take(max_frame, &req)) {
        case InBuf::Got::kFrame:
          Dispatch(c, std::move(req));
          continue;
        case InBuf::Got::kBad:
          c.dead = true;
          continue;
        case InBuf::Got::kNone:
          break;
      }
      if (!c.readable) break;
      InBuf::Fill f = c.in.Read(c.fd, max_frame + 4 + kReadChunk, c.hangup);
      if (f == InBuf::Fill::kClosed) c.dead = true;
      c.readable = f == InBuf::Fill::kMore;
    }
    WatchOut(c);
    if (c.dead && !c.busy) Close(c.id);
  }

  void Close(uint64_t id) {
    auto it = instances.find(id);
    if (it == instances.end()) return;
    epoll_ctl(epfd, EPOLL_CTL_DEL, it->second->fd, nullptr);
    close(it->second->fd);
    DropRing(*it->second);
    instances.erase(it);
  }

  // ---- the shared mailbox (state_ring.h) ----

  void DropRing(Instance& c) {
    if (c.doorbell >= 0) {
      // The instance holds a dup: the registration would outlive our close.
      epoll_ctl(epfd, EPOLL_CTL_DEL, c.doorbell, nullptr);
      close(c.doorbell);
    }
    if (c.ring != nullptr) munmap(c.ring, sizeof(StateRing));
    c.doorbell = -1;
    c.ring = nullptr;
  }

  // kShareRing: makes the mailbox and sends its memory file and doorbell.
  void ShareRing(Instance& c) {
    DropRing(c);
    int mem = memfd_create("silt-state-ring", MFD_CLOEXEC);
    int bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    void* p = MAP_FAILED;
    if (mem >= 0 && ftruncate(mem, sizeof(StateRing)) == 0)
      p = mmap(nullptr, sizeof(StateRing), PROT_READ | PROT_WRITE, MAP_SHARED,
               mem, 0);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;  // every doorbell write is an edge
    ev.data.u64 = c.id | kRingBit;
    if (p == MAP_FAILED || bell < 0 ||
        epoll_ctl(epfd, EPOLL_CTL_ADD, bell, &ev) != 0) {
      if (p != MAP_FAILED) munmap(p, sizeof(StateRing));
      if (mem >= 0) close(mem);
      if (bell >= 0) close(bell);
      Deliver(c, backend.internal_error());
      return;
    }
    c.ring = static_cast<StateRing*>(p);
    c.doorbell = bell;
    Deliver(c, std::string(1, '\0'), {mem, bell});
    close(mem);
  }

  // The instance rang: take its request out of the mailbox.
  void OnRing(uint64_t id) {
    auto it = instances.find(id);
    if (it == instances.end()) return;
    Instance& c = *it->second;
    if (c.busy || c.dead || c.ring == nullptr ||
        c.ring->state.load(std::memory_order_acquire) != kRingRequest)
      return;
    const uint32_t len = c.ring->len.load(std::memory_order_relaxed);
    if (len > StateRing::kDataBytes) {
      c.dead = true;
      return Serve(c);
    }
    std::string req(c.ring->data, len);
    c.ring->state.store(kRingIdle, std::memory_order_relaxed);
    c.via_ring = true;
    Dispatch(c, std::move(req));
    Serve(c);
  }

  void PostRing(Instance& c, RingState state) {
    c.ring->state.store(state, std::memory_order_seq_cst);
    if (c.ring->waiting.load(std::memory_order_seq_cst) != 0)
      FutexWake(&c.ring->state);
  }

  // Sends a reply the way its request came.
  void Deliver(Instance& c, std::string_view reply,
               const std::vector<int>& fds = {}) {
    const bool ring = std::exchange(c.via_ring, false) && c.ring != nullptr;
    if (ring && fds.empty() && reply.size() <= StateRing::kDataBytes) {
      memcpy(c.ring->data, reply.data(), reply.size());
      c.ring->len.store(static_cast<uint32_t>(reply.size()),
                        std::memory_order_relaxed);
      PostRing(c, kRingReply);
      return;
    }
    if (fds.empty() || !c.out.empty() || !SendWithFds(c, reply, fds))
      c.out.Frame(reply);
    if (!c.out.Flush(c.fd)) c.dead = true;
    if (ring) PostRing(c, kRingReplyOnSocket);
  }

  void Answer(Instance& c, std::string_view reply,
              const std::vector<int>& fds = {}) {
    Deliver(c, reply, fds);
    c.busy = false;
    const uint64_t id = c.id;
    Serve(c);    // (may close c)
    OnRing(id);  // (a request can only be posted after this reply)
  }

  // Sends the reply's first bytes with the fds attached (SCM_RIGHTS) and
  // queues the rest; false when nothing could be sent (the reply then goes
  // without them: the instance simply maps nothing).
  bool SendWithFds(Instance& c, std::string_view reply,
                   const std::vector<int>& fds) {
    std::string frame;
    AppendFrame(&frame, reply);
    ssize_t n = SendWithRights(c.fd, frame, fds.data(), fds.size(),
                               MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) return false;
    c.out.Raw(std::string_view(frame).substr(static_cast<size_t>(n)));
    return true;
  }

  void Dispatch(Instance& c, std::string req) {
    if (!req.empty() &&
        req[0] == static_cast<char>(wire::StateOp::kShareRing)) {
      c.busy = true;
      ShareRing(c);
      c.busy = false;
      return;
    }
    StateLoopBackend::Fast f;
    try {
      f = backend.fast(c.ns, req);
    } catch (const std::exception& e) {  // last line of defence
      fprintf(stderr, "silt-invoker: state request: %s\n", e.what());
      f.path = StateLoopBackend::Fast::Path::kSlow;
    }
    c.busy = true;
    switch (f.path) {
      case StateLoopBackend::Fast::Path::kReply:
        Deliver(c, f.reply);
        c.busy = false;
        return;
      case StateLoopBackend::Fast::Path::kForward: {
        Peer* p = PeerFor(f.peer);
        if (p == nullptr) break;
        p->out.Frame(f.frame);
        p->pending.push_back({c.id, std::move(req), p->out.queued()});
        dirty_peers.push_back(p->id);
        return;
      }
      case StateLoopBackend::Fast::Path::kSlow:
        break;
    }
    Slow(c, std::move(req));
  }

  // ---- peers: one multiplexed connection each, answers in order ----

  Peer* PeerFor(const std::string& address) {
    if (auto it = peer_by_address.find(address); it != peer_by_address.end())
      return peers.at(it->second).get();
    std::string hello = backend.hello();
    if (hello.empty()) return nullptr;
    size_t colon = address.rfind(':');
    uint32_t port = 0;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(address.substr(colon + 1), &port) || port > 65535 ||
        inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1)
      return nullptr;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return nullptr;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 &&
        errno != EINPROGRESS) {
      close(fd);
      return nullptr;
    }
    auto p = std::make_unique<Peer>();
    p->id = next_id++;
    p->fd = fd;
    p->address = address;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = p->id | kPeerBit;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      return nullptr;
    }
    p->out.Frame(hello);
    Peer* raw = p.get();
    peer_by_address[address] = p->id;
    peers[p->id] = std::move(p);
    return raw;
  }

  void FlushPeers() {
    // Failing a peer re-dispatches its requests, which may queue more.
    while (!dirty_peers.empty()) {
      std::vector<uint64_t> ids;
      ids.swap(dirty_peers);
      for (uint64_t id : ids) {
        auto it = peers.find(id);
        if (it == peers.end()) continue;
        Peer& p = *it->second;
        if (p.connected && !p.out.Flush(p.fd)) FailPeer(p);
      }
    }
    ReapPeers();
  }

  void OnPeer(uint64_t id, uint32_t events) {
    auto it = peers.find(id);
    if (it == peers.end()) return;
    Peer& p = *it->second;
    if (p.failed) return;
    if (!p.connected && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return FailPeer(p);
      p.connected = true;
    }
    if ((events & EPOLLOUT) && p.connected && !p.out.Flush(p.fd))
      return FailPeer(p);
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      bool more = true;
      while (more && !p.failed) {
        InBuf::Fill f = p.in.Read(p.fd, max_frame + 4 + kReadChunk,
                                  events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR));
        more = f == InBuf::Fill::kMore;
        std::string reply;
        InBuf::Got g;
        while (!p.failed &&
               (g = p.in.Take(max_frame, &reply)) == InBuf::Got::kFrame) {
          if (p.pending.empty()) return FailPeer(p);
          Pending done = std::move(p.pending.front());
          p.pending.pop_front();
          Finish(done, reply);
        }
        if (!p.failed && (g == InBuf::Got::kBad || f == InBuf::Fill::kClosed))
          return FailPeer(p);
      }
    }
  }

  void Finish(Pending& done, std::string_view reply) {
    auto it = instances.find(done.instance);
    if (it == instances.end()) return;
    Instance& c = *it->second;
    if (backend.final_reply(reply))
      Answer(c, reply);
    else
      Slow(c, std::move(done.request));
  }

  // The connection broke: requests that never left go the slow way (which
  // re-resolves the shard); those that left may have been applied and are
  // answered as unavailable, never retried.
  void FailPeer(Peer& p) {
    if (p.failed) return;
    p.failed = true;
    epoll_ctl(epfd, EPOLL_CTL_DEL, p.fd, nullptr);
    peer_by_address.erase(p.address);
    uint64_t sent = p.out.sent();
    std::deque<Pending> pending;
    pending.swap(p.pending);
    for (auto& x : pending) {
      auto it = instances.find(x.instance);
      if (it == instances.end()) continue;
      if (x.end <= sent && p.connected)
        Answer(*it->second, backend.broken_reply(p.address));
      else
        Slow(*it->second, std::move(x.request));
    }
  }

  void ReapPeers() {
    for (auto it = peers.begin(); it != peers.end();) {
      if (it->second->failed) {
        close(it->second->fd);
        it = peers.erase(it);
      } else {
        ++it;
      }
    }
  }

  // ---- the slow path: a pool of threads that may block ----

  void Slow(Instance& c, std::string req) {
    c.busy = true;
    absl::MutexLock l(&mu);
    tasks.push_back({c.id, c.ns, c.function, std::move(req)});
    // A thread per waiting task: some wait long (a queue pop).
    if (tasks.size() <= idle_threads || pool.size() >= kMaxPoolThreads) return;
    pool.emplace_back([this] { Work(); });
  }

  void Work() {
    while (true) {
      Task t;
      {
        absl::MutexLock l(&mu);
        ++idle_threads;
        mu.Await(absl::Condition(
            +[](Impl* i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(i->mu) {
              return i->stopping || !i->tasks.empty();
            },
            this));
        --idle_threads;
        if (stopping) return;
        t = std::move(tasks.front());
        tasks.pop_front();
      }
      StateLoopBackend::Shared reply;
      try {
        if (!t.request.empty() &&
            t.request[0] == static_cast<char>(wire::StateOp::kShareMap))
          reply = backend.share(t.ns, t.request);
        else
          reply.reply = backend.slow(t.ns, t.function, t.request);
      } catch (const std::exception& e) {  // last line of defence
        fprintf(stderr, "silt-invoker: state request of namespace %s: %s\n",
                t.ns.c_str(), e.what());
        reply.reply = backend.internal_error();
      }
      {
        absl::MutexLock l(&mu);
        done.push_back(
            {t.instance, std::move(reply.reply), std::move(reply.fds)});
      }
      Wake();
    }
  }
};

absl::StatusOr<std::unique_ptr<StateLoop>> StateLoop::Start(
    StateLoopBackend backend, size_t max_frame_bytes) {
  auto impl = std::make_unique<Impl>();
  impl->backend = std::move(backend);
  impl->max_frame = max_frame_bytes;
  impl->epfd = epoll_create1(EPOLL_CLOEXEC);
  impl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->epfd < 0 || impl->wake_fd < 0)
    return absl::InternalError(
        absl::StrCat("state loop: epoll/eventfd: ", strerror(errno)));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWake;
  if (epoll_ctl(impl->epfd, EPOLL_CTL_ADD, impl->wake_fd, &ev) != 0)
    return absl::InternalError("state loop: epoll_ctl failed");
  Impl* raw = impl.get();
  impl->loop = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<StateLoop>(new StateLoop(std::move(impl)));
}

StateLoop::StateLoop(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StateLoop::~StateLoop() = default;

void StateLoop::Attach(int fd, const std::string& ns,
                       const std::string& function) {
  {
    absl::MutexLock l(&impl_->mu);
    if (impl_->stopping) {
      close(fd);
      return;
    }
    impl_->attached.push_back({fd, ns, function});
  }
  impl_->Wake();
}

}  // namespace silt::invoker
