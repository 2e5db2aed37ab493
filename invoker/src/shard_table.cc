#include "shard_table.h"

#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace silt::invoker {

using proclets::MapShard;
using proclets::QueueShard;
using proclets::VectorShard;
using wire::StateCode;
using wire::StateOp;

std::shared_ptr<HostedShard> ShardTable::Find(uint64_t id) const {
  absl::MutexLock l(&mu_);
  auto it = shards_.find(id);
  return it == shards_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<HostedShard>> ShardTable::All() const {
  std::vector<std::shared_ptr<HostedShard>> all;
  absl::MutexLock l(&mu_);
  for (auto& [id, hs] : shards_) all.push_back(hs);
  return all;
}

void ShardTable::Put(uint64_t id, std::shared_ptr<HostedShard> hs) {
  absl::MutexLock l(&mu_);
  shards_[id] = std::move(hs);
}

void ShardTable::Close() {
  absl::MutexLock l(&mu_);
  for (auto& [id, hs] : shards_) {
    absl::MutexLock sl(&hs->mu);
    hs->closing = true;
  }
}

void ShardTable::Clear() {
  absl::MutexLock l(&mu_);
  shards_.clear();
}

absl::Status ShardTable::Create(const pv1::ShardInfo& info) {
  if (Find(info.id()))
    return absl::AlreadyExistsError(
        absl::StrCat("shard ", info.id(), " is already here"));
  auto hs = std::make_shared<HostedShard>();
  {
    absl::MutexLock l(&hs->mu);
    hs->info = info;
    switch (info.kind()) {
      case pv1::KIND_MAP: {
        auto m = MapShard::Create();
        if (!m.ok()) return m.status();
        hs->map = *std::move(m);
        hs->Publish(true);
        break;
      }
      case pv1::KIND_VECTOR: {
        auto v = VectorShard::Create(info.lo());
        if (!v.ok()) return v.status();
        hs->vec = *std::move(v);
        break;
      }
      case pv1::KIND_QUEUE: {
        auto q = QueueShard::Create();
        if (!q.ok()) return q.status();
        hs->queue = *std::move(q);
        break;
      }
      default:
        return absl::InvalidArgumentError("unknown shard kind");
    }
  }
  absl::MutexLock l(&mu_);
  shards_[info.id()] = std::move(hs);
  return absl::OkStatus();
}

void ShardTable::Drop(const std::vector<uint64_t>& ids) {
  std::vector<std::shared_ptr<HostedShard>> dropped;
  {
    absl::MutexLock l(&mu_);
    for (uint64_t id : ids) {
      auto it = shards_.find(id);
      if (it == shards_.end()) continue;
      dropped.push_back(it->second);
      shards_.erase(it);
    }
  }
  for (auto& hs : dropped) {
    absl::MutexLock l(&hs->mu);
    hs->gone = true;
    hs->moved_to.clear();
    hs->map.reset();
    hs->vec.reset();
    hs->queue.reset();
  }
}

absl::StatusOr<pv1::SplitShardResponse> ShardTable::Split(uint64_t id,
                                                          uint64_t new_id) {
  std::shared_ptr<HostedShard> hs = Find(id);
  if (!hs) return absl::NotFoundError(absl::StrCat("no shard ", id, " here"));
  if (Find(new_id))
    return absl::AlreadyExistsError(absl::StrCat("shard ", new_id, " exists"));
  auto child = std::make_shared<HostedShard>();
  pv1::SplitShardResponse res;
  {
    absl::MutexLock l(&hs->mu);
    if (hs->gone || hs->frozen || hs->merged_into || !hs->arena() ||
        hs->arena()->tracking())
      return absl::FailedPreconditionError("the shard is moving");
    uint64_t at = 0;
    absl::MutexLock cl(&child->mu);
    child->info = hs->info;
    child->info.set_id(new_id);
    if (hs->map) {
      auto mid = hs->map->MedianHash();
      if (!mid || *mid <= hs->info.lo())
        return absl::FailedPreconditionError("too few keys to split");
      at = *mid;
      hs->Publish(false);  // its range is about to shrink
      auto upper = hs->map->SplitOff(at);
      if (!upper.ok()) {
        hs->Publish(true);
        return upper.status();
      }
      child->map = *std::move(upper);
    } else if (hs->vec) {
      if (hs->vec->count() < 2)
        return absl::FailedPreconditionError("too few elements to split");
      at = hs->vec->first() + hs->vec->count() / 2;
      auto upper = hs->vec->SplitOff(at);
      if (!upper.ok()) return upper.status();
      child->vec = *std::move(upper);
    } else {
      return absl::FailedPreconditionError("queues do not split");
    }
    child->info.set_lo(at);
    child->info.set_hi(hs->info.hi());
    hs->info.set_hi(at);
    hs->Publish(true);
    child->Publish(true);
    hs->splits.emplace_back(at, child);
    *res.mutable_lower() = hs->info;
    *res.mutable_upper() = child->info;
    res.mutable_lower()->set_bytes(hs->arena()->used());
    res.mutable_upper()->set_bytes(child->arena()->used());
  }
  absl::MutexLock l(&mu_);
  shards_[new_id] = std::move(child);
  return res;
}

absl::StatusOr<pv1::ShardInfo> ShardTable::Merge(uint64_t keep_id,
                                                 uint64_t absorb_id) {
  std::shared_ptr<HostedShard> keep = Find(keep_id);
  std::shared_ptr<HostedShard> absorb = Find(absorb_id);
  if (!keep || !absorb || keep == absorb)
    return absl::NotFoundError(absl::StrCat("shards ", keep_id, " and ",
                                            absorb_id, " are not both here"));
  // Lock order: by id.
  HostedShard* first = keep_id < absorb_id ? keep.get() : absorb.get();
  HostedShard* second = keep_id < absorb_id ? absorb.get() : keep.get();
  absl::MutexLock l1(&first->mu);
  absl::MutexLock l2(&second->mu);
  auto busy = [](HostedShard& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu) {
    return h.gone || h.frozen || h.merged_into || h.arena() == nullptr ||
           h.arena()->tracking();
  };
  if (busy(*keep) || busy(*absorb))
    return absl::FailedPreconditionError("one of the shards is moving");
  if (keep->info.hi() != absorb->info.lo() ||
      keep->info.kind() != absorb->info.kind())
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", absorb_id, " does not follow shard ", keep_id));
  absl::Status s = absl::FailedPreconditionError("queues do not merge");
  keep->Publish(false);
  absorb->Publish(false);
  if (keep->map && absorb->map) s = keep->map->Absorb(*absorb->map);
  if (keep->vec && absorb->vec) s = keep->vec->Absorb(*absorb->vec);
  if (!s.ok()) {
    keep->Publish(true);
    absorb->Publish(true);
    return s;
  }
  // Children split off into what is keep's range again no longer apply.
  std::erase_if(keep->splits, [&](const auto& split) {
    return split.first >= keep->info.hi() && split.first < absorb->info.hi();
  });
  keep->info.set_hi(absorb->info.hi());
  keep->Publish(true);
  absorb->map.reset();
  absorb->vec.reset();
  absorb->merged_into = keep;
  pv1::ShardInfo out = keep->info;
  out.set_bytes(keep->arena()->used());
  out.set_count(keep->count());
  return out;
}

std::vector<pv1::ShardInfo> ShardTable::Infos() const {
  std::vector<pv1::ShardInfo> out;
  for (auto& hs : All()) {
    absl::MutexLock l(&hs->mu);
    if (hs->gone || hs->merged_into) continue;
    pv1::ShardInfo info = hs->info;
    proclets::Arena* a = hs->arena();
    info.set_bytes(a ? a->used() : 0);
    info.set_count(hs->count());
    out.push_back(std::move(info));
  }
  return out;
}

std::string ShardTable::HandleShardOp(wire::Reader r, bool* would_block) {
  uint64_t id, hint;
  uint8_t op;
  if (!r.U64(&id) || !r.U64(&hint) || !r.U8(&op))
    return Error(StateCode::kInvalid, "malformed shard request");
  std::shared_ptr<HostedShard> hs = Find(id);
  if (!hs) return MovedReply("", 0);
  if (uint32_t wait = hs->throttle_us.load(std::memory_order_relaxed);
      wait > 0 && IsWrite(static_cast<StateOp>(op))) {
    if (would_block) {
      *would_block = true;
      return "";
    }
    std::this_thread::sleep_for(std::chrono::microseconds(wait));
  }
  std::shared_ptr<HostedShard> keep;
  std::string moved;
  uint64_t moved_epoch = 0;
  HostedShard* s = Resolve(hs, hint, &keep, &moved, &moved_epoch, would_block);
  if (would_block && *would_block) return "";
  if (s == nullptr) return MovedReply(moved, moved_epoch);
  std::string reply = Execute(*s, static_cast<StateOp>(op), r);
  ops_.fetch_add(1, std::memory_order_relaxed);
  s->mu.Unlock();
  return reply;
}

HostedShard* ShardTable::Resolve(
    std::shared_ptr<HostedShard> hs, uint64_t hint,
    std::shared_ptr<HostedShard>* keep, std::string* moved,
    uint64_t* moved_epoch, bool* would_block) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  bool followed = false;  // hs is a split or merge successor of the one asked
  while (hs) {
    if (would_block) {
      if (!hs->mu.TryLock()) {  // held by a split, merge or migration
        *would_block = true;
        return nullptr;
      }
    } else {
      hs->mu.Lock();
    }
    if (would_block && hs->frozen && !hs->gone) {
      hs->mu.Unlock();
      *would_block = true;
      return nullptr;
    }
    // Wait out the final round of a migration (it is short).
    auto deadline = absl::Now() + absl::Seconds(2);
    while (hs->frozen && !hs->gone) {
      if (hs->mu.AwaitWithDeadline(
              absl::Condition(
                  +[](HostedShard* s)
                       ABSL_NO_THREAD_SAFETY_ANALYSIS { return !s->frozen; },
                  hs.get()),
              deadline))
        break;
      if (absl::Now() >= deadline) break;
    }
    if (hs->frozen && !hs->gone) {  // a stuck migration: retry later
      hs->mu.Unlock();
      moved->clear();
      return nullptr;
    }
    if (hs->gone) {
      // A successor that moved on: the caller's layout is older than the
      // split, and MOVED would relocate the shard it asked for, so it asks
      // the directory instead.
      if (followed) {
        moved->clear();
      } else {
        *moved = hs->moved_to;
        *moved_epoch = hs->moved_epoch;
      }
      hs->mu.Unlock();
      return nullptr;
    }
    std::shared_ptr<HostedShard> next = hs->merged_into;
    for (auto& [at, child] : hs->splits)
      if (hint >= at) next = child;
    if (!next && hint >= hs->info.lo() &&
        (hint < hs->info.hi() || hs->info.hi() == kOpenEnd)) {
      *keep = hs;
      return hs.get();
    }
    hs->mu.Unlock();
    if (!next) {
      moved->clear();  // not ours: ask the directory
      return nullptr;
    }
    hs = std::move(next);
    followed = true;
  }
  return nullptr;
}

}  // namespace silt::invoker
