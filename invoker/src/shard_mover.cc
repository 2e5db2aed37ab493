#include "shard_mover.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "frames.h"
#include "hosted_shard.h"
#include "proclets/shard.h"
#include "silt/state_wire.h"

namespace silt::invoker {
namespace {

using Clock = std::chrono::steady_clock;
using proclets::MapShard;
using proclets::QueueShard;
using proclets::VectorShard;

// A migration stops pre-copying when one round leaves less than this dirty.
constexpr uint64_t kFinalRoundBytes = 128 * 1024;
// Past this many dirty bytes pre-copy goes on even when rounds stop
// shrinking: the final round's bytes are the write pause.
constexpr uint64_t kMaxFinalRoundBytes = 256 * 1024;
constexpr int kMaxPrecopyRounds = 30;
constexpr size_t kChunkBytes = 1 << 20;

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

absl::StatusOr<pv1::MigrateShardResponse> ShardMover::Migrate(
    uint64_t id, const std::string& target,
    std::chrono::system_clock::time_point deadline) {
  auto start = Clock::now();
  std::shared_ptr<HostedShard> hs = shards_.Find(id);
  if (!hs) return absl::NotFoundError(absl::StrCat("no shard ", id, " here"));
  if (target == self_)
    return absl::InvalidArgumentError("the shard is already on that node");
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
  if (auto s = WriteBytesFrame(conn.fd, hello); !s.ok()) return s;
  conn.reader = std::make_unique<FrameReader>(*fd, 4096);
  pv1::ShardInfo info;
  {
    absl::MutexLock l(&hs->mu);
    if (hs->gone) return absl::NotFoundError("the shard moved away");
    if (hs->arena() == nullptr) return absl::InternalError("empty shard");
    if (hs->frozen || hs->merged_into || hs->arena()->tracking())
      return absl::FailedPreconditionError("the shard is already moving");
    hs->arena()->TakeDirty();
    hs->arena()->TrackWrites(true);
    info = hs->info;
    info.set_epoch(info.epoch() + 1);
  }
  auto abort = [&](absl::Status s) {
    absl::MutexLock l(&hs->mu);
    if (hs->frozen && !hs->gone) hs->Publish(true);
    hs->frozen = false;
    if (auto* a = hs->arena()) a->TrackWrites(false);
    return s;
  };
  std::string begin;
  {
    wire::Writer w(&begin);
    w.U8(static_cast<uint8_t>(PeerOp::kMigrateBegin));
    w.Str(info.SerializeAsString());
  }
  if (auto s = WriteBytesFrame(conn.fd, begin); !s.ok()) return abort(s);

  // Appends the chunk frames for [off, off+len) of the arena to *out;
  // false when the shard was dropped meanwhile. Caller holds hs->mu.
  uint64_t sent = 0;
  auto frames = [&](uint64_t off, uint64_t len,
                    std::string* out) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    proclets::Arena* a = hs->arena();
    if (a == nullptr) return false;
    const uint64_t used = a->used(), end = off + len;
    for (; off < end; off += kChunkBytes) {
      uint64_t n = std::min<uint64_t>(kChunkBytes, end - off);
      uint64_t m = off < used ? std::min<uint64_t>(n, used - off) : 0;
      std::string chunk;
      wire::Writer w(&chunk);
      w.U8(static_cast<uint8_t>(PeerOp::kMigrateChunk));
      w.U64(off);
      w.U64(used);
      w.Str(std::string_view(a->data() + off, m));
      AppendFrame(out, chunk);
      sent += n;
    }
    return true;
  };
  // Sends [off, off+len), a chunk at a time, copying each chunk under the
  // shard's lock (writers wait at most one chunk's copy) and sending it
  // without.
  std::string batch;
  auto send_range = [&](uint64_t off, uint64_t len) -> absl::Status {
    for (uint64_t end = off + len; off < end; off += kChunkBytes) {
      batch.clear();
      {
        absl::MutexLock l(&hs->mu);
        if (!frames(off, std::min<uint64_t>(kChunkBytes, end - off), &batch))
          return absl::AbortedError("the shard was dropped");
      }
      if (auto s = WriteAll(conn.fd, batch); !s.ok()) return s;
    }
    return absl::OkStatus();
  };

  uint64_t used = 0;
  {
    absl::MutexLock l(&hs->mu);
    if (hs->arena()) used = hs->arena()->used();
  }
  if (auto s = send_range(0, used); !s.ok()) return abort(s);
  uint32_t rounds = 1;
  uint64_t last_round_bytes = used;
  while (rounds < kMaxPrecopyRounds) {
    std::vector<std::pair<uint64_t, uint64_t>> dirty;
    {
      absl::MutexLock l(&hs->mu);
      if (hs->arena() == nullptr) return abort(absl::AbortedError("dropped"));
      dirty = hs->arena()->TakeDirty();
    }
    uint64_t bytes = 0;
    for (auto& [o, n] : dirty) bytes += n;
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
    if (bytes < kFinalRoundBytes ||
        (!converging && bytes < kMaxFinalRoundBytes)) {
      // Put them back for the final round: simplest is to resend them
      // there.
      absl::MutexLock l(&hs->mu);
      if (hs->arena() == nullptr) return abort(absl::AbortedError("dropped"));
      for (auto& [o, n] : dirty) hs->arena()->MarkDirty(o, n);
      break;
    }
    ++rounds;
    for (auto& [o, n] : dirty)
      if (auto s = send_range(o, n); !s.ok()) return abort(s);
  }

  // Wait until the target has applied everything sent so far, so that the
  // pause below holds writes only for the last changes, not for the tail
  // of the copy still in flight.
  {
    std::string sync(1, static_cast<char>(PeerOp::kMigrateSync)), reply;
    absl::Status s = WriteBytesFrame(conn.fd, sync);
    if (s.ok()) s = conn.reader->Next(&reply);
    if (s.ok() && (reply.empty() || reply[0] != 0))
      s = absl::InternalError("target lost the migration");
    if (!s.ok()) return abort(s);
  }

  if (std::chrono::system_clock::now() > deadline)
    return abort(absl::DeadlineExceededError(
        absl::StrCat("moving shard ", id, " ran out of time; it stays")));

  // Final round: hold writes, send what changed and the final size, commit.
  Clock::time_point pause_start;
  absl::Status commit;
  std::unique_ptr<MapShard> old_map;
  std::unique_ptr<VectorShard> old_vec;
  std::unique_ptr<QueueShard> old_queue;
  // The last changes are copied under the lock and sent without it:
  // `frozen` keeps writers out (the state loop never waits for it).
  {
    absl::MutexLock l(&hs->mu);
    hs->frozen = true;
    hs->Publish(false);  // local readers ask the host, which waits
    pause_start = Clock::now();
    batch.clear();
    proclets::Arena* a = hs->arena();
    if (a == nullptr) {
      commit = absl::AbortedError("the shard was dropped");
    } else {
      for (auto& [o, n] : a->TakeDirty()) frames(o, n, &batch);
      std::string req;
      wire::Writer w(&req);
      w.U8(static_cast<uint8_t>(PeerOp::kMigrateCommit));
      w.U64(a->used());
      AppendFrame(&batch, req);
    }
  }
  std::string reply;
  if (commit.ok()) commit = WriteAll(conn.fd, batch);
  if (commit.ok()) commit = conn.reader->Next(&reply);  // the target installs
  if (commit.ok() && (reply.empty() || reply[0] != 0))
    commit = absl::InternalError(
        absl::StrCat("target refused the shard: ",
                     reply.empty() ? "empty reply" : reply.substr(1)));
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
  if (!commit.ok()) return abort(commit);
  double pause_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - pause_start)
          .count();
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
