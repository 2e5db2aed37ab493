#include "shard_mover.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "frames.h"
#include "hosted_shard.h"
#include "proclets/shard.h"
#include "silt/state_wire.h"

namespace silt::invoker {
namespace {

using Clock = std::chrono::steady_clock;
using proclets::Arena;
using proclets::MapShard;
using proclets::QueueShard;
using proclets::VectorShard;
using Runs = std::vector<std::pair<uint64_t, uint64_t>>;  // offset, length

// A migration stops pre-copying when one round leaves less than this dirty.
constexpr uint64_t kFinalRoundBytes = 128 * 1024;
// Past this many dirty bytes pre-copy goes on even when rounds stop
// shrinking: the final round's bytes are the write pause.
constexpr uint64_t kMaxFinalRoundBytes = 256 * 1024;
constexpr int kMaxPrecopyRounds = 30;

// A read-only mapping of a shard's memory file, private to one move: a round
// reads the bytes it sends from here without the shard's lock (the owner's
// own mapping moves when the arena grows, and a rebuild swaps the file).
// Reading while writers change the arena is fine: what they change is
// marked dirty and goes again in a later round, and the last round runs
// with writes held.
class ArenaView {
 public:
  ArenaView() = default;
  ArenaView(const ArenaView&) = delete;
  ArenaView& operator=(const ArenaView&) = delete;
  ~ArenaView() { Unmap(); }

  // Follows `a`: maps its file (again, if the arena was rebuilt into another
  // one) and as much of it as it has grown to. Caller holds the shard's lock.
  absl::Status Follow(const Arena& a) {
    struct stat st;
    if (fstat(a.memory_fd(), &st) != 0)
      return absl::InternalError(absl::StrCat("fstat: ", strerror(errno)));
    const size_t want = Arena::kPageSize + a.mapped();
    if (fd_ >= 0 && st.st_ino == ino_ && want <= len_) return absl::OkStatus();
    if (fd_ < 0 || st.st_ino != ino_) {
      Unmap();
      fd_ = fcntl(a.memory_fd(), F_DUPFD_CLOEXEC, 0);
      if (fd_ < 0)
        return absl::InternalError(absl::StrCat("dup: ", strerror(errno)));
      ino_ = st.st_ino;
    }
    void* p = map_ == nullptr
                  ? mmap(nullptr, want, PROT_READ, MAP_SHARED, fd_, 0)
                  : mremap(map_, len_, want, MREMAP_MAYMOVE);
    if (p == MAP_FAILED) {
      map_ = nullptr;
      len_ = 0;
      return absl::ResourceExhaustedError(
          absl::StrCat("mapping the shard to send it: ", strerror(errno)));
    }
    map_ = static_cast<char*>(p);
    len_ = want;
    return absl::OkStatus();
  }
  const char* data() const { return map_ + Arena::kPageSize; }

 private:
  void Unmap() {
    if (map_ != nullptr) munmap(map_, len_);
    if (fd_ >= 0) close(fd_);
    map_ = nullptr;
    len_ = 0;
    fd_ = -1;
  }
  int fd_ = -1;
  ino_t ino_ = 0;
  char* map_ = nullptr;
  size_t len_ = 0;
};

// What one round sends: runs of the arena (each within `used`), read under
// the shard's lock along with `used`.
struct Round {
  Runs runs;
  uint64_t used = 0;
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const auto& [o, len] : runs) n += len;
    return n;
  }
};

// Sends a round's runs as kMigrateBytes frames, each followed by its bytes
// straight from the view (one copy, into the socket), then `tail` (a frame
// or nothing).
absl::Status SendRound(int fd, const ArenaView& view, const Round& round,
                       std::string_view tail = {}) {
  constexpr size_t kHeader = 4 + 1 + 3 * 8;
  std::string headers(round.runs.size() * kHeader, '\0');
  std::vector<iovec> iov;
  iov.reserve(2 * round.runs.size() + 1);
  for (size_t i = 0; i < round.runs.size(); ++i) {
    const auto& [off, len] = round.runs[i];
    std::string h;
    wire::Writer w(&h);
    w.U32(kHeader - 4);
    w.U8(static_cast<uint8_t>(PeerOp::kMigrateBytes));
    w.U64(off);
    w.U64(round.used);
    w.U64(len);
    char* at = headers.data() + i * kHeader;
    memcpy(at, h.data(), kHeader);
    iov.push_back({at, kHeader});
    iov.push_back({const_cast<char*>(view.data() + off), len});
  }
  if (!tail.empty())
    iov.push_back({const_cast<char*>(tail.data()), tail.size()});
  return WriteAllV(fd, iov.data(), iov.size());
}

}  // namespace

Reaper::Reaper() : thread_([this] { Run(); }) {}

Reaper::~Reaper() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void Reaper::Free(std::shared_ptr<void> garbage) {
  if (!garbage) return;
  absl::MutexLock l(&mu_);
  queue_.push_back(std::move(garbage));
}

void Reaper::Run() {
  while (true) {
    std::vector<std::shared_ptr<void>> batch;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](Reaper* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
            return r->stopping_ || !r->queue_.empty();
          },
          this));
      batch.swap(queue_);
      if (batch.empty() && stopping_) return;
    }
    batch.clear();
  }
}

ShardMover::ShardMover(std::string self, ShardTable& shards, const DataKey& key)
    : self_(std::move(self)), shards_(shards), key_(key) {}

class ShardMover::Registration {
 public:
  Registration(ShardMover& mover, int fd) : mover_(mover), fd_(fd) {
    absl::MutexLock l(&mover_.mu_);
    added_ = !mover_.stopping_;
    if (added_) mover_.moving_fds_.push_back(fd_);
  }
  ~Registration() {  // before the fd is closed: Stop() never sees a reused one
    absl::MutexLock l(&mover_.mu_);
    std::erase(mover_.moving_fds_, fd_);
  }
  bool added() const { return added_; }

 private:
  ShardMover& mover_;
  const int fd_;
  bool added_ = false;
};

void ShardMover::Stop() {
  absl::MutexLock l(&mu_);
  stopping_ = true;
  for (int fd : moving_fds_) shutdown(fd, SHUT_RDWR);
}

absl::StatusOr<pv1::MigrateShardResponse> ShardMover::Migrate(
    uint64_t id, const std::string& target,
    std::chrono::system_clock::time_point deadline) {
  auto start = Clock::now();
  std::shared_ptr<HostedShard> hs = shards_.Find(id);
  if (!hs) return absl::NotFoundError(absl::StrCat("no shard ", id, " here"));
  if (target == self_)
    return absl::InvalidArgumentError("the shard is already on that node");
  MigrationPriority priority;
  // However the move ends, writers stop waiting.
  struct Unthrottle {
    HostedShard* shard;
    ~Unthrottle() { shard->throttle_us.store(0, std::memory_order_relaxed); }
  } unthrottle{hs.get()};
  std::string hello = key_.Hello();
  if (hello.empty())
    return absl::UnavailableError("no data-port key from the gateway yet");
  auto fd = Dial(target);
  if (!fd.ok()) return fd.status();
  PeerConn conn;
  conn.fd = *fd;
  Registration registration(*this, conn.fd);
  if (!registration.added())
    return absl::UnavailableError("this node is stopping: nothing moves now");
  if (auto s = WriteBytesFrame(conn.fd, hello); !s.ok()) return s;
  conn.reader = std::make_unique<FrameReader>(*fd, 4096);
  pv1::ShardInfo info;
  auto view = std::make_unique<ArenaView>();
  Round round;
  {
    absl::MutexLock l(&hs->mu);
    if (hs->gone) return absl::NotFoundError("the shard moved away");
    Arena* a = hs->arena();
    if (a == nullptr) return absl::InternalError("empty shard");
    if (hs->frozen || hs->merged_into || a->tracking())
      return absl::FailedPreconditionError("the shard is already moving");
    if (auto s = view->Follow(*a); !s.ok()) return s;
    a->TrackWrites(true);
    info = hs->info;
    info.set_epoch(info.epoch() + 1);
    round.used = a->used();
    round.runs = {{0, round.used}};
  }
  auto abort = [&](absl::Status s) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_)
        s = absl::UnavailableError(absl::StrCat("this node is stopping: shard ",
                                                id, " stays here (",
                                                s.message(), ")"));
    }
    absl::MutexLock l(&hs->mu);
    if (hs->frozen && !hs->gone) hs->Publish(true);
    hs->frozen = false;
    if (auto* a = hs->arena()) a->TrackWrites(false);
    return s;
  };
  // The next round: what writers dirtied since the last one. Aborted when
  // the shard was dropped meanwhile.
  auto take_round = [&]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(hs->mu) -> absl::Status {
    Arena* a = hs->arena();
    if (a == nullptr) return absl::AbortedError("the shard was dropped");
    if (auto s = view->Follow(*a); !s.ok()) return s;
    round.runs = a->TakeDirty();
    round.used = a->used();
    return absl::OkStatus();
  };
  {
    std::string begin;
    wire::Writer w(&begin);
    w.U8(static_cast<uint8_t>(PeerOp::kMigrateBegin));
    w.Str(info.SerializeAsString());
    w.U64(round.used);
    if (auto s = WriteBytesFrame(conn.fd, begin); !s.ok()) return abort(s);
  }

  // Pre-copy: the whole arena, then what changed meanwhile, while writes go
  // on.
  uint64_t sent = round.bytes();
  if (auto s = SendRound(conn.fd, *view, round); !s.ok()) return abort(s);
  uint32_t rounds = 1;
  uint64_t last_round_bytes = sent;
  // Sent but not yet confirmed applied by the target: while much is, the
  // final round would wait for it with writes held.
  uint64_t unconfirmed = sent;
  while (true) {
    {
      absl::MutexLock l(&hs->mu);
      if (auto s = take_round(); !s.ok()) return abort(s);
    }
    const uint64_t bytes = round.bytes();
    // Stop when little changed, or when writers dirty about as much per
    // round as a round sends (more rounds would not shrink the rest) and
    // what is left is still small.
    bool converging = rounds == 1 || bytes < last_round_bytes * 3 / 4;
    last_round_bytes = bytes;
    if (!converging) {  // slow the writers down, more each time
      uint32_t t = hs->throttle_us.load(std::memory_order_relaxed);
      hs->throttle_us.store(std::min<uint32_t>(std::max(2 * t, 100u), 3200),
                            std::memory_order_relaxed);
    }
    const bool last = rounds >= kMaxPrecopyRounds || bytes < kFinalRoundBytes ||
                      (!converging && bytes < kMaxFinalRoundBytes);
    if (last && unconfirmed <= kMaxFinalRoundBytes) {
      // Left for the final round.
      absl::MutexLock l(&hs->mu);
      if (Arena* a = hs->arena())
        for (auto& [o, n] : round.runs) a->MarkDirty(o, n);
      break;
    }
    ++rounds;
    sent += bytes;
    unconfirmed += bytes;
    if (auto s = SendRound(conn.fd, *view, round); !s.ok()) return abort(s);
    if (last) {
      // Wait until the target has applied everything sent so far; what
      // changed meanwhile is one more (small) round, and the final one
      // holds writes only for what changes after that.
      std::string sync(1, static_cast<char>(PeerOp::kMigrateSync)), reply;
      absl::Status s = WriteBytesFrame(conn.fd, sync);
      if (s.ok()) s = conn.reader->Next(&reply);
      if (s.ok() && (reply.empty() || reply[0] != 0))
        s = absl::InternalError("target lost the migration");
      if (!s.ok()) return abort(s);
      unconfirmed = 0;
    }
  }

  if (std::chrono::system_clock::now() > deadline)
    return abort(absl::DeadlineExceededError(
        absl::StrCat("moving shard ", id, " ran out of time; it stays")));

  // Final round: hold writes (`frozen` keeps them out; the state loop never
  // waits for it), send what changed and the final size, commit.
  Clock::time_point pause_start;
  absl::Status commit;
  std::optional<RealtimeSection> realtime;
  realtime.emplace();
  {
    absl::MutexLock l(&hs->mu);
    hs->frozen = true;
    hs->Publish(false);  // local readers ask the host, which waits
    pause_start = Clock::now();
    commit = take_round();
  }
  std::string reply;
  if (commit.ok()) {
    std::string req, tail;
    wire::Writer w(&req);
    w.U8(static_cast<uint8_t>(PeerOp::kMigrateCommit));
    w.U64(round.used);
    AppendFrame(&tail, req);
    sent += round.bytes();
    commit = SendRound(conn.fd, *view, round, tail);
  }
  if (commit.ok()) commit = conn.reader->Next(&reply);  // the target installs
  if (commit.ok() && (reply.empty() || reply[0] != 0))
    commit = absl::InternalError(
        absl::StrCat("target refused the shard: ",
                     reply.empty() ? "empty reply" : reply.substr(1)));
  std::unique_ptr<MapShard> old_map;
  std::unique_ptr<VectorShard> old_vec;
  std::unique_ptr<QueueShard> old_queue;
  {
    absl::MutexLock l(&hs->mu);
    if (commit.ok() && (hs->gone || hs->arena() == nullptr))
      commit = absl::AbortedError("the shard was dropped during the move");
    if (commit.ok()) {
      hs->gone = true;
      hs->frozen = false;
      hs->moved_to = target;
      hs->moved_epoch = info.epoch();
      // Freed by the reaper, after the pause and off the mover's path.
      old_map = std::move(hs->map);
      old_vec = std::move(hs->vec);
      old_queue = std::move(hs->queue);
    }
  }
  double pause_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - pause_start)
          .count();
  realtime.reset();
  if (!commit.ok()) return abort(commit);
  // The view holds the old memory too: freeing the last of it here would
  // take as long as the reaper's work.
  reaper_.Free(std::shared_ptr<ArenaView>(std::move(view)));
  reaper_.Free(std::move(old_map));
  reaper_.Free(std::move(old_vec));
  reaper_.Free(std::move(old_queue));
  pv1::MigrateShardResponse res;
  res.set_epoch(info.epoch());
  res.set_bytes(sent);
  res.set_rounds(rounds);
  res.set_pause_ms(pause_ms);
  res.set_total_ms(
      std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  return res;
}

}  // namespace silt::invoker
