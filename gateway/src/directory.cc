#include "directory.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "invoker/proto/proclets.grpc.pb.h"
#include "metrics.h"
#include "proclets/shard.h"
#include "silt/state_wire.h"

namespace silt::gateway {
namespace {

namespace pv1 = ::silt::proclets::v1;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kOpenEnd = std::numeric_limits<uint64_t>::max();
constexpr char kNextIdKey[] = "proclet-next-id";
// Shards created or moved this recently may be missing from a node's report
// (it was taken before they arrived).
constexpr auto kReportGrace = std::chrono::seconds(3);
// Shards changed (split, merged, moved) this recently do not merge.
constexpr auto kMergeQuiet = std::chrono::seconds(2);

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

std::string Key(const std::string& ns, const std::string& name) {
  return store::NamespacedKey(ns, name);
}

ShardView ToView(const pv1::Layout& l, const pv1::ShardLocation& s) {
  ShardView v;
  v.id = s.id();
  v.ns = l.namespace_();
  v.structure = l.name();
  v.kind = static_cast<StructureKind>(l.kind());
  v.lo = s.lo();
  v.hi = s.hi();
  v.node = s.node();
  v.data_address = s.data_address();
  v.epoch = s.epoch();
  v.bytes = s.bytes();
  v.count = s.count();
  v.state = static_cast<ShardState>(s.state());
  return v;
}

StructureView ToView(const pv1::Layout& l) {
  StructureView v;
  v.ns = l.namespace_();
  v.name = l.name();
  v.kind = static_cast<StructureKind>(l.kind());
  v.max_shard_bytes = l.max_shard_bytes();
  v.version = l.version();
  v.functions.assign(l.functions().begin(), l.functions().end());
  for (const auto& s : l.shards()) v.shards.push_back(ToView(l, s));
  return v;
}

}  // namespace

std::string KindName(StructureKind k) {
  return std::string(
      proclets::ShardKindName(static_cast<proclets::ShardKind>(k)));
}

const char* ShardStateName(ShardState s) {
  switch (s) {
    case ShardState::kActive:
      return "active";
    case ShardState::kMigrating:
      return "migrating";
    case ShardState::kLost:
      return "lost";
  }
  return "unknown";
}

uint64_t StructureView::bytes() const {
  uint64_t b = 0;
  for (const auto& s : shards) b += s.bytes;
  return b;
}
uint64_t StructureView::count() const {
  uint64_t c = 0;
  for (const auto& s : shards) c += s.count;
  return c;
}

struct Directory::Impl {
  store::Store* store;
  DirectoryOptions options;
  NodeSource nodes;
  Metrics* metrics = nullptr;

  absl::Mutex mu;
  std::map<std::string, pv1::Layout> layouts ABSL_GUARDED_BY(mu);  // by Key
  std::map<uint64_t, std::string> owner ABSL_GUARDED_BY(mu);       // id -> Key
  std::map<uint64_t, Clock::time_point> changed ABSL_GUARDED_BY(mu);
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;
  // Nodes being drained (Drain; once per drain in progress): nothing new is
  // placed on them meanwhile.
  std::multiset<std::string> draining ABSL_GUARDED_BY(mu);
  // One structural change (create, split, migrate, delete) at a time.
  absl::Mutex change_mu ABSL_ACQUIRED_BEFORE(mu);

  // Splits run here, off the report path.
  absl::Mutex work_mu;
  std::set<uint64_t> to_split ABSL_GUARDED_BY(work_mu);
  // Lower shards of adjacent pairs small enough to merge.
  std::set<uint64_t> to_merge ABSL_GUARDED_BY(work_mu);
  bool stopping ABSL_GUARDED_BY(work_mu) = false;
  std::thread worker;

  ~Impl() {
    {
      absl::MutexLock l(&work_mu);
      stopping = true;
    }
    if (worker.joinable()) worker.join();
  }

  absl::Status Persist(const pv1::Layout& l, store::Durability durability =
                                                 store::Durability::kSynced)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    store::WriteBatch b;
    b.Put(store::Table::kProclets, Key(l.namespace_(), l.name()),
          l.SerializeAsString());
    b.Put(store::Table::kMeta, kNextIdKey, std::to_string(next_id));
    return store->Write(b, durability);
  }

  void Index(const pv1::Layout& l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::string key = Key(l.namespace_(), l.name());
    for (const auto& s : l.shards()) owner[s.id()] = key;
  }

  std::unique_ptr<pv1::ProcletHost::Stub> StubFor(const DirectoryNode& n) {
    return pv1::ProcletHost::NewStub(n.channel);
  }

  std::vector<DirectoryNode> Live() {
    return nodes ? nodes() : std::vector<DirectoryNode>{};
  }

  // Live nodes that may take new shards: not leaving, not being drained.
  std::vector<DirectoryNode> Placeable() {
    std::vector<DirectoryNode> out;
    std::vector<DirectoryNode> live = Live();
    absl::MutexLock l(&mu);
    for (auto& n : live)
      if (!n.leaving && !draining.contains(n.name)) out.push_back(std::move(n));
    return out;
  }

  static uint64_t Free(const DirectoryNode& n) {
    return n.memory > n.memory_used ? n.memory - n.memory_used : 0;
  }

  // Live nodes, most free memory first; `planned` counts bytes already
  // promised to each in this decision.
  static std::vector<DirectoryNode> ByFreeMemory(
      std::vector<DirectoryNode> live) {
    std::sort(live.begin(), live.end(),
              [](const DirectoryNode& a, const DirectoryNode& b) {
                if (Free(a) != Free(b)) return Free(a) > Free(b);
                return a.name < b.name;
              });
    return live;
  }

  absl::Status CreateOn(const DirectoryNode& n, const pv1::ShardInfo& info) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    pv1::CreateShardRequest req;
    *req.mutable_shard() = info;
    pv1::CreateShardResponse res;
    return FromGrpc(StubFor(n)->CreateShard(&ctx, req, &res),
                    absl::StrCat("creating shard on node ", n.name));
  }

  void DropOn(const DirectoryNode& n, const std::vector<uint64_t>& ids) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    pv1::DropShardsRequest req;
    for (uint64_t id : ids) req.add_ids(id);
    pv1::DropShardsResponse res;
    StubFor(n)->DropShards(&ctx, req, &res);  // best effort: a dead node
                                              // holds nothing
  }

  absl::StatusOr<StructureView> OpenStructure(const std::string& ns,
                                              const std::string& name,
                                              StructureKind kind,
                                              uint32_t initial_shards,
                                              uint64_t max_bytes,
                                              const std::string& function) {
    if (!wire::ValidStructureName(name))
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid state name \"", name,
          "\": use 1-63 characters of [a-z0-9._-], starting with a letter or "
          "digit"));
    if (initial_shards > options.max_initial_shards)
      return absl::InvalidArgumentError(
          absl::StrCat("at most ", options.max_initial_shards,
                       " initial shards (asked for ", initial_shards, ")"));
    std::string key = Key(ns, name);
    {
      absl::MutexLock l(&mu);
      auto it = layouts.find(key);
      if (it != layouts.end()) {
        if (static_cast<StructureKind>(it->second.kind()) != kind)
          return absl::FailedPreconditionError(absl::StrCat(
              "state \"", name, "\" is a ",
              KindName(static_cast<StructureKind>(it->second.kind())),
              ", not a ", KindName(kind)));
        if (!function.empty() &&
            std::find(it->second.functions().begin(),
                      it->second.functions().end(),
                      function) == it->second.functions().end()) {
          it->second.add_functions(function);
          Persist(it->second).IgnoreError();  // listing only
        }
        return ToView(it->second);
      }
    }
    absl::MutexLock change(&change_mu);
    {
      absl::MutexLock l(&mu);  // created while we waited?
      if (layouts.contains(key)) {
        auto& l2 = layouts[key];
        if (static_cast<StructureKind>(l2.kind()) != kind)
          return absl::FailedPreconditionError(
              absl::StrCat("state \"", name, "\" exists with another kind"));
        return ToView(l2);
      }
    }
    auto live = ByFreeMemory(Placeable());
    if (live.empty())
      return absl::UnavailableError(
          "no invoker is connected to hold the state");
    uint32_t n = initial_shards == 0 ? 1 : initial_shards;
    if (kind != StructureKind::kMap)
      n = 1;  // vectors and queues grow by splits
    pv1::Layout layout;
    layout.set_namespace_(ns);
    layout.set_name(name);
    layout.set_kind(static_cast<pv1::Kind>(kind));
    layout.set_max_shard_bytes(max_bytes ? max_bytes
                                         : options.default_max_shard_bytes);
    layout.set_version(1);
    if (!function.empty()) layout.add_functions(function);
    uint64_t first_id;
    {
      absl::MutexLock l(&mu);
      first_id = next_id;
      next_id += n;
    }
    std::vector<std::pair<const DirectoryNode*, uint64_t>> created;
    for (uint32_t i = 0; i < n; ++i) {
      // Spread: the node with the most free memory takes the next shard.
      const DirectoryNode& node = live[i % live.size()];
      pv1::ShardInfo info;
      info.set_id(first_id + i);
      info.set_namespace_(ns);
      info.set_structure(name);
      info.set_kind(static_cast<pv1::Kind>(kind));
      info.set_epoch(1);
      info.set_max_bytes(layout.max_shard_bytes());
      // Map shards split the hash space evenly; a vector's only shard is open.
      uint64_t step = kOpenEnd / n;
      info.set_lo(kind == StructureKind::kMap ? step * i : 0);
      info.set_hi(kind == StructureKind::kMap && i + 1 < n ? step * (i + 1)
                                                           : kOpenEnd);
      if (auto s = CreateOn(node, info); !s.ok()) {
        for (auto& [nd, id] : created) DropOn(*nd, {id});
        return s;
      }
      created.emplace_back(&node, info.id());
      auto* loc = layout.add_shards();
      loc->set_id(info.id());
      loc->set_lo(info.lo());
      loc->set_hi(info.hi());
      loc->set_node(node.name);
      loc->set_data_address(node.data_address);
      loc->set_epoch(1);
      loc->set_state(pv1::SHARD_ACTIVE);
    }
    absl::MutexLock l(&mu);
    if (auto s = Persist(layout); !s.ok()) {
      for (auto& [nd, id] : created) DropOn(*nd, {id});
      return s;
    }
    layouts[key] = layout;
    Index(layout);
    for (const auto& s : layout.shards()) changed[s.id()] = Clock::now();
    return ToView(layout);
  }

  absl::Status Delete(const std::string& ns, const std::string& name) {
    absl::MutexLock change(&change_mu);
    pv1::Layout layout;
    {
      absl::MutexLock l(&mu);
      auto it = layouts.find(Key(ns, name));
      if (it == layouts.end())
        return absl::NotFoundError(
            absl::StrCat("no state \"", name, "\" in namespace ", ns));
      store::WriteBatch b;
      b.Delete(store::Table::kProclets, it->first);
      if (auto s = store->Write(b); !s.ok()) return s;
      layout = std::move(it->second);
      layouts.erase(it);
      for (const auto& s : layout.shards()) {
        owner.erase(s.id());
        changed.erase(s.id());
      }
    }
    std::map<std::string, std::vector<uint64_t>> by_node;
    for (const auto& s : layout.shards()) by_node[s.node()].push_back(s.id());
    for (const auto& n : Live()) {
      auto it = by_node.find(n.name);
      if (it != by_node.end()) DropOn(n, it->second);
    }
    return absl::OkStatus();
  }

  // Finds the layout holding shard `id`; null if none.
  pv1::Layout* LayoutOf(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto o = owner.find(id);
    if (o == owner.end()) return nullptr;
    auto it = layouts.find(o->second);
    return it == layouts.end() ? nullptr : &it->second;
  }
  static pv1::ShardLocation* LocOf(pv1::Layout* l, uint64_t id) {
    for (auto& s : *l->mutable_shards())
      if (s.id() == id) return &s;
    return nullptr;
  }

  absl::StatusOr<MigrationResult> Migrate(uint64_t id,
                                          const std::string& node) {
    absl::MutexLock change(&change_mu);
    return MigrateLocked(id, node);
  }

  // With `deadline`, the copy is abandoned (the shard stays) if it would run
  // past it.
  absl::StatusOr<MigrationResult> MigrateLocked(
      uint64_t id, const std::string& node,
      std::chrono::system_clock::time_point deadline =
          std::chrono::system_clock::time_point::max())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(change_mu) {
    auto live = Live();
    const DirectoryNode* target = nullptr;
    for (const auto& n : live)
      if (n.name == node) target = &n;
    if (target == nullptr)
      return absl::NotFoundError(
          absl::StrCat("no connected node named \"", node, "\""));
    {
      absl::MutexLock l(&mu);
      if (target->leaving || draining.contains(node))
        return absl::FailedPreconditionError(absl::StrCat(
            "node ", node, " is being drained: it takes no proclets"));
    }
    MigrationResult res;
    res.id = id;
    res.to = node;
    {
      absl::MutexLock l(&mu);
      pv1::Layout* layout = LayoutOf(id);
      pv1::ShardLocation* loc = layout ? LocOf(layout, id) : nullptr;
      if (loc == nullptr)
        return absl::NotFoundError(absl::StrCat("no proclet ", id));
      if (loc->state() == pv1::SHARD_LOST)
        return absl::FailedPreconditionError(
            absl::StrCat("proclet ", id, " was lost with node ", loc->node()));
      if (loc->node() == node)
        return absl::InvalidArgumentError(
            absl::StrCat("proclet ", id, " is already on ", node));
      res.from = loc->node();
      loc->set_state(pv1::SHARD_MIGRATING);
    }
    const DirectoryNode* source = nullptr;
    for (const auto& n : live)
      if (n.name == res.from) source = &n;
    auto restore_state = [&]() {
      absl::MutexLock l(&mu);
      if (pv1::Layout* layout = LayoutOf(id))
        if (auto* loc = LocOf(layout, id);
            loc && loc->state() == pv1::SHARD_MIGRATING)
          loc->set_state(pv1::SHARD_ACTIVE);  // not if lost meanwhile
    };
    if (source == nullptr) {
      restore_state();
      return absl::UnavailableError(absl::StrCat(
          "node ", res.from, " holding proclet ", id, " is not connected"));
    }
    // The source aborts by `deadline`; the call waits a little longer for
    // its answer, so that a move is never committed after being reported
    // failed here.
    auto host_deadline = std::min(
        deadline, std::chrono::system_clock::now() + std::chrono::seconds(120));
    grpc::ClientContext ctx;
    ctx.set_deadline(host_deadline + std::chrono::seconds(5));
    pv1::MigrateShardRequest req;
    req.set_deadline_unix_ms(
        std::chrono::duration_cast<std::chrono::milliseconds>(
            host_deadline.time_since_epoch())
            .count());
    req.set_id(id);
    req.set_target_node(node);
    req.set_target_data_address(target->data_address);
    pv1::MigrateShardResponse out;
    auto st = FromGrpc(StubFor(*source)->MigrateShard(&ctx, req, &out),
                       absl::StrCat("migrating proclet ", id));
    if (!st.ok()) {
      restore_state();
      if (metrics) metrics->MigrationAborted();
      return st;
    }
    if (metrics)
      metrics->MigrationDone(out.total_ms() / 1e3, out.pause_ms() / 1e3);
    res.epoch = out.epoch();
    res.bytes = out.bytes();
    res.total_ms = out.total_ms();
    res.pause_ms = out.pause_ms();
    res.rounds = out.rounds();
    absl::MutexLock l(&mu);
    pv1::Layout* layout = LayoutOf(id);
    if (layout == nullptr) return res;  // deleted meanwhile
    pv1::ShardLocation* loc = LocOf(layout, id);
    loc->set_node(node);
    loc->set_data_address(target->data_address);
    loc->set_epoch(out.epoch());
    loc->set_state(pv1::SHARD_ACTIVE);
    layout->set_version(layout->version() + 1);
    changed[id] = Clock::now();
    // Buffered: were it lost with the machine, the nodes' reports put the
    // shard back where it is (the target reports it at the newer epoch).
    if (auto s = Persist(*layout, store::Durability::kBuffered); !s.ok())
      fprintf(stderr, "silt-gateway: proclet %llu moved but not saved: %s\n",
              static_cast<unsigned long long>(id),
              std::string(s.message()).c_str());
    return res;
  }

  absl::StatusOr<DrainResult> Drain(const std::string& node,
                                    const DrainOptions& opts) {
    {
      bool known = false;
      for (const auto& n : Live()) known |= n.name == node;
      if (!known)
        return absl::NotFoundError(
            absl::StrCat("no connected node named \"", node, "\""));
    }
    // Marked before waiting for change_mu: a creation under way finishes
    // first (and is then moved with the rest), later ones go elsewhere.
    {
      absl::MutexLock l(&mu);
      draining.insert(node);
    }
    absl::MutexLock change(&change_mu);
    DrainResult out = DrainLocked(node, opts);
    absl::MutexLock l(&mu);
    draining.erase(draining.find(node));
    return out;
  }

  DrainResult DrainLocked(const std::string& node, const DrainOptions& opts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(change_mu) {
    std::vector<std::pair<uint64_t, uint64_t>> mine;  // id, bytes
    {
      absl::MutexLock l(&mu);
      for (auto& [key, layout] : layouts)
        for (const auto& s : layout.shards())
          if (s.node() == node && s.state() == pv1::SHARD_ACTIVE)
            mine.emplace_back(s.id(), s.bytes());
    }
    DrainResult out;
    auto stay = [&](uint64_t id, uint64_t bytes, absl::Status why) {
      out.left.push_back(id);
      out.left_bytes += bytes;
      if (out.reason.ok()) out.reason = std::move(why);
    };
    // Track promised bytes so a drain spreads over the other nodes.
    std::map<std::string, uint64_t> promised;
    for (auto& [id, bytes] : mine) {
      if (opts.cancelled && opts.cancelled()) {
        stay(id, bytes, absl::CancelledError("the drain was cancelled"));
        continue;
      }
      if (std::chrono::system_clock::now() >= opts.deadline) {
        stay(id, bytes,
             absl::DeadlineExceededError("the drain ran out of time"));
        continue;
      }
      std::vector<DirectoryNode> others;
      for (auto& n : Placeable())
        if (n.name != node) others.push_back(n);
      if (others.empty()) {
        stay(id, bytes,
             absl::UnavailableError(
                 absl::StrCat("no other node to drain ", node, " to")));
        continue;
      }
      for (auto& n : others) n.memory_used += promised[n.name];
      others = ByFreeMemory(std::move(others));
      if (Free(others.front()) < bytes) {
        stay(id, bytes,
             absl::ResourceExhaustedError(
                 absl::StrCat("no other node has room for proclet ", id, " (",
                              bytes, " bytes; most free: ", others.front().name,
                              " with ", Free(others.front()), ")")));
        continue;
      }
      auto r = MigrateLocked(id, others.front().name, opts.deadline);
      if (!r.ok()) {
        stay(id, bytes, r.status());
        continue;
      }
      promised[others.front().name] += bytes;
      out.moved.push_back(*std::move(r));
    }
    return out;
  }

  void Report(const std::string& node, const std::string& data_address,
              const std::vector<Held>& held) {
    std::vector<uint64_t> split;
    absl::MutexLock l(&mu);
    std::map<uint64_t, const Held*> by_id;
    for (const auto& h : held) by_id[h.id] = &h;
    auto now = Clock::now();
    for (auto& [key, layout] : layouts) {
      bool dirty = false;
      for (auto& s : *layout.mutable_shards()) {
        if (s.node() != node && s.state() != pv1::SHARD_MIGRATING) {
          auto it = by_id.find(s.id());
          if (it != by_id.end() && it->second->epoch > s.epoch()) {
            fprintf(stderr,
                    "silt-gateway: proclet %llu is on %s at epoch %llu (the "
                    "directory had %s, epoch %llu): recorded there\n",
                    static_cast<unsigned long long>(s.id()), node.c_str(),
                    static_cast<unsigned long long>(it->second->epoch),
                    s.node().c_str(),
                    static_cast<unsigned long long>(s.epoch()));
            s.set_node(node);
            s.set_data_address(data_address);
            s.set_epoch(it->second->epoch);
            s.set_state(pv1::SHARD_ACTIVE);
            changed[s.id()] = now;
            dirty = true;
          }
          continue;
        }
        if (s.state() != pv1::SHARD_ACTIVE) continue;
        auto it = by_id.find(s.id());
        if (it == by_id.end()) {
          // The node does not have it: it restarted and lost it.
          auto c = changed.find(s.id());
          if (c != changed.end() && now - c->second < kReportGrace) continue;
          s.set_state(pv1::SHARD_LOST);
          dirty = true;
          continue;
        }
        s.set_bytes(it->second->bytes);
        s.set_count(it->second->count);
        if (it->second->hi != s.hi() &&
            ReconcileRange(layout, s.id(), *it->second, held, node,
                           data_address, now)) {
          dirty = true;
          break;  // the shard list changed under the loop: next report
        }
        if (layout.max_shard_bytes() > 0 &&
            it->second->bytes > layout.max_shard_bytes())
          split.push_back(s.id());
      }
      if (dirty) {
        layout.set_version(layout.version() + 1);
        Persist(layout).IgnoreError();
      }
    }
    std::vector<uint64_t> merge;
    for (auto& [key, layout] : layouts)
      for (int i = 0; i + 1 < layout.shards_size(); ++i)
        if (Mergeable(layout, i, now)) merge.push_back(layout.shards(i).id());
    if (!split.empty() || !merge.empty()) {
      absl::MutexLock w(&work_mu);
      to_split.insert(split.begin(), split.end());
      to_merge.insert(merge.begin(), merge.end());
    }
  }

  // The node serves shard `id` with another upper bound than the directory
  // has: a split or merge it made whose answer the directory never got. A
  // split left the upper half on the node as a shard the directory does not
  // know (same structure, starting where `h` now ends): it is added. A merge
  // widened `id` over the shards above it, which the node no longer holds:
  // they are dropped. Returns whether the layout changed.
  bool ReconcileRange(pv1::Layout& layout, uint64_t id, const Held& h,
                      const std::vector<Held>& held, const std::string& node,
                      const std::string& data_address, Clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    pv1::ShardLocation* s = LocOf(&layout, id);
    if (s == nullptr) return false;
    const uint64_t old_hi = s->hi();
    const bool split =
        h.hi != kOpenEnd && (old_hi == kOpenEnd || h.hi < old_hi);
    if (split) {
      const Held* upper = nullptr;
      for (const auto& u : held)
        if (u.lo == h.hi && u.ns == layout.namespace_() &&
            u.structure == layout.name() && !owner.contains(u.id))
          upper = &u;
      if (upper == nullptr) return false;  // not (yet) reported: wait
      s->set_hi(h.hi);
      auto* up = layout.add_shards();
      up->set_id(upper->id);
      up->set_lo(upper->lo);
      up->set_hi(upper->hi);
      up->set_node(node);
      up->set_data_address(data_address);
      up->set_epoch(upper->epoch);
      up->set_state(pv1::SHARD_ACTIVE);
      up->set_bytes(upper->bytes);
      up->set_count(upper->count);
      owner[upper->id] = Key(layout.namespace_(), layout.name());
      next_id = std::max(next_id, upper->id + 1);
      changed[id] = changed[upper->id] = now;
      fprintf(stderr,
              "silt-gateway: proclet %llu was split on %s (answer lost): "
              "proclet %llu recorded\n",
              static_cast<unsigned long long>(id), node.c_str(),
              static_cast<unsigned long long>(upper->id));
    } else {
      // Merged: every shard inside (old_hi, h.hi] belongs to `id` now.
      std::vector<uint64_t> gone;
      for (const auto& o : layout.shards()) {
        if (o.id() == id || o.lo() < old_hi ||
            (h.hi != kOpenEnd && (o.hi() > h.hi || o.hi() == kOpenEnd)))
          continue;
        // Absorbed shards were moved here first and are no longer held.
        bool still_held = false;
        for (const auto& x : held) still_held |= x.id == o.id();
        if (o.node() != node || still_held) return false;
        gone.push_back(o.id());
      }
      s->set_hi(h.hi);
      changed[id] = now;
      auto* shards = layout.mutable_shards();
      for (int i = shards->size() - 1; i >= 0; --i) {
        if (std::find(gone.begin(), gone.end(), shards->Get(i).id()) ==
            gone.end())
          continue;
        owner.erase(shards->Get(i).id());
        shards->DeleteSubrange(i, 1);
      }
      fprintf(stderr,
              "silt-gateway: proclet %llu absorbed %zu proclet(s) on %s "
              "(answer lost): recorded\n",
              static_cast<unsigned long long>(id), gone.size(), node.c_str());
    }
    std::sort(layout.mutable_shards()->begin(), layout.mutable_shards()->end(),
              [](const auto& a, const auto& b) { return a.lo() < b.lo(); });
    return true;
  }

  // Whether shards i and i+1 of the layout (sorted by lo) should merge: both
  // serving, adjacent, not changed lately, and together under a quarter of
  // the split size (so that the merged shard is far from splitting again).
  bool Mergeable(const pv1::Layout& layout, int i, Clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (layout.kind() == pv1::KIND_QUEUE || layout.max_shard_bytes() == 0)
      return false;
    const auto& a = layout.shards(i);
    const auto& b = layout.shards(i + 1);
    if (a.state() != pv1::SHARD_ACTIVE || b.state() != pv1::SHARD_ACTIVE ||
        a.hi() != b.lo() ||
        a.bytes() + b.bytes() >= layout.max_shard_bytes() / 4)
      return false;
    for (uint64_t id : {a.id(), b.id()}) {
      auto c = changed.find(id);
      if (c != changed.end() && now - c->second < kMergeQuiet) return false;
    }
    return true;
  }

  // Merges shard `lower` with the one right above it: the upper one moves to
  // lower's node first if it lives elsewhere, then lower absorbs it there.
  void MergeOne(uint64_t lower) {
    absl::MutexLock change(&change_mu);
    uint64_t upper = 0;
    std::string node, upper_node;
    {
      absl::MutexLock l(&mu);
      pv1::Layout* layout = LayoutOf(lower);
      if (layout == nullptr) return;
      int i = 0;
      while (i < layout->shards_size() && layout->shards(i).id() != lower) ++i;
      if (i + 1 >= layout->shards_size() ||
          !Mergeable(*layout, i, Clock::now()))
        return;
      node = layout->shards(i).node();
      upper = layout->shards(i + 1).id();
      upper_node = layout->shards(i + 1).node();
      if (draining.contains(node) || draining.contains(upper_node)) return;
      // Reports must not take either for lost while they change hands.
      changed[lower] = changed[upper] = Clock::now();
    }
    const DirectoryNode* holder = nullptr;
    auto live = Live();
    for (const auto& n : live)
      if (n.name == node) holder = &n;
    if (holder == nullptr || holder->leaving) return;
    if (upper_node != node) {
      auto r = MigrateLocked(upper, node);
      if (!r.ok()) {
        fprintf(stderr, "silt-gateway: merging proclets %llu and %llu: %s\n",
                static_cast<unsigned long long>(lower),
                static_cast<unsigned long long>(upper),
                std::string(r.status().message()).c_str());
        return;
      }
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    pv1::MergeShardsRequest req;
    req.set_keep(lower);
    req.set_absorb(upper);
    pv1::MergeShardsResponse res;
    auto st =
        FromGrpc(StubFor(*holder)->MergeShards(&ctx, req, &res),
                 absl::StrCat("merging proclets ", lower, " and ", upper));
    if (!st.ok()) {
      fprintf(stderr, "silt-gateway: %s\n", std::string(st.message()).c_str());
      return;
    }
    {
      absl::MutexLock l(&mu);
      pv1::Layout* layout = LayoutOf(lower);
      if (layout == nullptr) return;
      pv1::ShardLocation* loc = LocOf(layout, lower);
      loc->set_hi(res.merged().hi());
      loc->set_bytes(res.merged().bytes());
      loc->set_count(res.merged().count());
      auto* shards = layout->mutable_shards();
      for (int i = 0; i < shards->size(); ++i) {
        if (shards->Get(i).id() == upper) {
          shards->DeleteSubrange(i, 1);
          break;
        }
      }
      layout->set_version(layout->version() + 1);
      owner.erase(upper);
      changed[lower] = Clock::now();
      changed.erase(upper);
      Persist(*layout).IgnoreError();
    }
    // The absorbed shard forwarded to `lower` meanwhile; callers that still
    // name it get MOVED and re-read the layout.
    DropOn(*holder, {upper});
  }

  void NodeGone(const std::string& node) {
    absl::MutexLock l(&mu);
    for (auto& [key, layout] : layouts) {
      bool dirty = false;
      for (auto& s : *layout.mutable_shards()) {
        // A shard moving off the node is lost with it too: the move fails
        // (and keeps it lost), or it committed and the target's reports put
        // it there.
        if (s.node() == node && (s.state() == pv1::SHARD_ACTIVE ||
                                 s.state() == pv1::SHARD_MIGRATING)) {
          s.set_state(pv1::SHARD_LOST);
          dirty = true;
        }
      }
      if (dirty) {
        layout.set_version(layout.version() + 1);
        Persist(layout).IgnoreError();
        fprintf(stderr,
                "silt-gateway: node %s is gone: shards of state %s/%s on it "
                "are lost\n",
                node.c_str(), layout.namespace_().c_str(),
                layout.name().c_str());
      }
    }
  }

  // Splits a shard in two on its node; the upper half then goes to the node
  // with the most free memory if that is another one.
  // Records a split the node made: `id` keeps the lower half, `new_id` is
  // the upper one, on the same node.
  void Record(pv1::Layout& l, uint64_t id, uint64_t new_id,
              const std::string& node, const DirectoryNode& holder,
              const pv1::SplitShardResponse& res)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    pv1::Layout* layout = &l;
    pv1::ShardLocation* loc = LocOf(layout, id);
    loc->set_hi(res.lower().hi());
    loc->set_bytes(res.lower().bytes());
    auto* up = layout->add_shards();
    up->set_id(new_id);
    up->set_lo(res.upper().lo());
    up->set_hi(res.upper().hi());
    up->set_node(node);
    up->set_data_address(holder.data_address);
    up->set_epoch(res.upper().epoch());
    up->set_state(pv1::SHARD_ACTIVE);
    up->set_bytes(res.upper().bytes());
    std::sort(layout->mutable_shards()->begin(),
              layout->mutable_shards()->end(),
              [](const auto& a, const auto& b) { return a.lo() < b.lo(); });
    layout->set_version(layout->version() + 1);
    owner[new_id] = Key(layout->namespace_(), layout->name());
    changed[id] = changed[new_id] = Clock::now();
    Persist(*layout).IgnoreError();
  }

  void SplitOne(uint64_t id) {
    absl::MutexLock change(&change_mu);
    std::string node;
    uint64_t new_id;
    {
      absl::MutexLock l(&mu);
      pv1::Layout* layout = LayoutOf(id);
      pv1::ShardLocation* loc = layout ? LocOf(layout, id) : nullptr;
      if (loc == nullptr || loc->state() != pv1::SHARD_ACTIVE ||
          loc->bytes() <= layout->max_shard_bytes() ||
          layout->kind() == pv1::KIND_QUEUE)
        return;
      node = loc->node();
      // A drain moves it whole; its node takes nothing new.
      if (draining.contains(node)) return;
      new_id = next_id++;
    }
    auto live = Live();
    const DirectoryNode* holder = nullptr;
    for (const auto& n : live)
      if (n.name == node) holder = &n;
    if (holder == nullptr || holder->leaving) return;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    pv1::SplitShardRequest req;
    req.set_id(id);
    req.set_new_id(new_id);
    pv1::SplitShardResponse res;
    auto st = FromGrpc(StubFor(*holder)->SplitShard(&ctx, req, &res),
                       absl::StrCat("splitting proclet ", id));
    if (!st.ok()) {  // if it split anyway, the node's reports will say so
      fprintf(stderr, "silt-gateway: %s\n", std::string(st.message()).c_str());
      return;
    }
    {
      absl::MutexLock l(&mu);
      pv1::Layout* layout = LayoutOf(id);
      if (layout == nullptr) return;
      // A report may have shown the split already (ReconcileRange).
      if (!owner.contains(new_id))
        Record(*layout, id, new_id, node, *holder, res);
    }
    auto ranked = ByFreeMemory(Placeable());
    if (!ranked.empty() && ranked.front().name != node &&
        Free(ranked.front()) > Free(*holder)) {
      auto r = MigrateLocked(new_id, ranked.front().name);
      if (!r.ok())
        fprintf(stderr, "silt-gateway: placing split-off proclet: %s\n",
                std::string(r.status().message()).c_str());
    }
  }

  void WorkLoop() {
    while (true) {
      uint64_t id;
      bool merge = false;
      {
        absl::MutexLock l(&work_mu);
        work_mu.AwaitWithTimeout(
            absl::Condition(
                +[](Impl* i) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                  return i->stopping || !i->to_split.empty() ||
                         !i->to_merge.empty();
                },
                this),
            absl::Milliseconds(500));
        if (stopping) return;
        if (!to_split.empty()) {
          id = *to_split.begin();
          to_split.erase(to_split.begin());
        } else if (!to_merge.empty()) {
          id = *to_merge.begin();
          to_merge.erase(to_merge.begin());
          merge = true;
        } else {
          continue;
        }
      }
      if (merge)
        MergeOne(id);
      else
        SplitOne(id);
    }
  }
};

Directory::Directory(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Directory::~Directory() = default;

absl::StatusOr<std::unique_ptr<Directory>> Directory::Open(
    store::Store* store, DirectoryOptions options, NodeSource nodes,
    Metrics* metrics) {
  auto impl = std::make_unique<Impl>();
  impl->store = store;
  impl->metrics = metrics;
  impl->options = options;
  impl->nodes = std::move(nodes);
  auto rows = store->Scan(store::Table::kProclets, "");
  if (!rows.ok()) return rows.status();
  {
    absl::MutexLock l(&impl->mu);
    for (auto& [key, value] : *rows) {
      pv1::Layout layout;
      if (!layout.ParseFromString(value))
        return absl::DataLossError(
            absl::StrCat("proclet directory record ", key, " is corrupt"));
      for (const auto& s : layout.shards()) {
        impl->next_id = std::max(impl->next_id, s.id() + 1);
        // Nodes get a grace period to come back and report after a restart.
        impl->changed[s.id()] = Clock::now();
      }
      impl->Index(layout);
      impl->layouts[key] = std::move(layout);
    }
    auto next = store->Get(store::Table::kMeta, kNextIdKey);
    uint64_t n = 0;
    if (next.ok() && absl::SimpleAtoi(*next, &n))
      impl->next_id = std::max(impl->next_id, n);
  }
  Impl* p = impl.get();
  impl->worker = std::thread([p] { p->WorkLoop(); });
  return std::unique_ptr<Directory>(new Directory(std::move(impl)));
}

absl::StatusOr<StructureView> Directory::OpenStructure(
    const std::string& ns, const std::string& name, StructureKind kind,
    uint32_t initial_shards, uint64_t max_shard_bytes,
    const std::string& function) {
  return impl_->OpenStructure(ns, name, kind, initial_shards, max_shard_bytes,
                              function);
}

absl::StatusOr<StructureView> Directory::Get(const std::string& ns,
                                             const std::string& name) {
  absl::MutexLock l(&impl_->mu);
  auto it = impl_->layouts.find(Key(ns, name));
  if (it == impl_->layouts.end())
    return absl::NotFoundError(
        absl::StrCat("no state \"", name, "\" in namespace ", ns));
  return ToView(it->second);
}

std::vector<StructureView> Directory::List(const std::string& ns) {
  absl::MutexLock l(&impl_->mu);
  std::vector<StructureView> out;
  for (auto& [key, layout] : impl_->layouts)
    if (ns.empty() || layout.namespace_() == ns) out.push_back(ToView(layout));
  return out;
}

absl::Status Directory::Delete(const std::string& ns, const std::string& name) {
  return impl_->Delete(ns, name);
}

void Directory::DeleteNamespace(const std::string& ns) {
  for (const auto& s : List(ns)) impl_->Delete(ns, s.name).IgnoreError();
}

absl::StatusOr<MigrationResult> Directory::Migrate(uint64_t id,
                                                   const std::string& node) {
  return impl_->Migrate(id, node);
}

absl::StatusOr<DrainResult> Directory::Drain(const std::string& node,
                                             const DrainOptions& options) {
  return impl_->Drain(node, options);
}

void Directory::Report(const std::string& node, const std::string& data_address,
                       const std::vector<Held>& held) {
  impl_->Report(node, data_address, held);
}

void Directory::NodeGone(const std::string& node) { impl_->NodeGone(node); }

}  // namespace silt::gateway
