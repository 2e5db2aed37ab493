#include "rebalancer.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "metrics.h"

namespace silt::gateway {

const char* MoveKindName(MoveKind k) {
  switch (k) {
    case MoveKind::kMemory:
      return "memory";
    case MoveKind::kCompute:
      return "compute";
    case MoveKind::kInstance:
      return "instance";
    case MoveKind::kGpu:
      return "gpu";
  }
  return "?";
}

const char* MoveReasonName(MoveReason r) {
  switch (r) {
    case MoveReason::kCpuHigh:
      return "cpu-high";
    case MoveReason::kMemoryHigh:
      return "memory-high";
    case MoveReason::kGpuRoom:
      return "gpu-room";
    case MoveReason::kGpuWanted:
      return "gpu-wanted";
  }
  return "?";
}

const char* EventTypeName(RebalanceEvent::Type t) {
  switch (t) {
    case RebalanceEvent::Type::kPressure:
      return "pressure";
    case RebalanceEvent::Type::kMove:
      return "move";
    case RebalanceEvent::Type::kEquilibrium:
      return "equilibrium";
    case RebalanceEvent::Type::kStuck:
      return "stuck";
    case RebalanceEvent::Type::kCool:
      return "cool";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

// How long after a node last ran a compute proclet a CPU-hot mark still
// counts as moving compute off it (its jobs' next shares go elsewhere).
constexpr auto kRecentCompute = std::chrono::seconds(5);

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// What moving a memory proclet costs here, for ranking (bytes freed per
// millisecond): a fixed part and a part per MiB, as bench_migrate measured
// on this machine class.
double MigrationMs(uint64_t bytes) {
  return 0.5 + 0.5 * static_cast<double>(bytes) / (1 << 20);
}

std::string Mib(double bytes) {
  return absl::StrFormat("%.1f MiB", bytes / (1 << 20));
}

}  // namespace

struct Rebalancer::Impl {
  RebalancerOptions options;
  Hooks hooks;
  Directory* directory;
  Metrics* metrics;

  absl::Mutex mu;
  bool woken ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::deque<RebalanceEvent> events ABSL_GUARDED_BY(mu);
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  std::thread thread;

  // Only the rebalancer's thread touches these.
  struct Episode {
    Clock::time_point since;  // the first pulse over the mark
    MoveReason reason;
    bool stuck = false;
  };
  std::map<std::string, Episode> open;  // by node: pressure not yet relieved
  std::map<std::string, Clock::time_point> cpu_over, memory_over;  // since
  // The most compute proclets each node ran lately, and when it last ran
  // any (kRecentCompute).
  struct RecentCompute {
    uint32_t tasks = 0;
    Clock::time_point last;
  };
  std::map<std::string, RecentCompute> recent_compute;
  std::set<std::string> hot;
  std::map<std::string, Clock::time_point> cool_since;
  // The memory figure a node's moves were planned on: the next plan waits
  // for a newer pulse (or a second), so one reading is never acted on twice.
  std::map<std::string, std::pair<uint64_t, Clock::time_point>> acted;

  void Emit(RebalanceEvent e) {
    e.unix_nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
    if (e.type == RebalanceEvent::Type::kMove && metrics)
      metrics->RebalanceMoves(MoveKindName(e.kind), MoveReasonName(e.reason),
                              static_cast<uint64_t>(std::max(1.0, e.amount)));
    fprintf(stderr, "silt-gateway: rebalance %s %s %s%s%s%s%s\n",
            EventTypeName(e.type), MoveReasonName(e.reason), e.node.c_str(),
            e.subject.empty() ? "" : (" " + e.subject).c_str(),
            e.to.empty() ? "" : (" -> " + e.to).c_str(),
            e.detail.empty() ? "" : ": ", e.detail.c_str());
    absl::MutexLock l(&mu);
    e.seq = next_seq++;
    events.push_back(std::move(e));
    while (events.size() > options.events_kept) events.pop_front();
  }

  void Loop() {
    while (true) {
      {
        absl::MutexLock l(&mu);
        auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
          return woken || stopping;
        };
        mu.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
        if (stopping) return;
        woken = false;
      }
      if (!options.enabled) continue;
      auto nodes = hooks.nodes();
      auto now = Clock::now();
      Cpu(nodes, now);
      Memory(nodes, now);
      Settle(nodes, now);
      if (hooks.gpu) Gpu();
    }
  }

  // GPU proclets follow the work; each move (or failed try) is an event.
  void Gpu() {
    for (auto& step : hooks.gpu()) {
      const MoveReason reason = step.why == GpuMoveWhy::kRoom
                                    ? MoveReason::kGpuRoom
                                    : MoveReason::kGpuWanted;
      if (!step.move.ok()) {
        Emit({.type = RebalanceEvent::Type::kStuck,
              .reason = reason,
              .subject = step.subject,
              .detail = absl::StrCat(step.detail, "; the move failed: ",
                                     step.move.status().message())});
        continue;
      }
      const GpuMove& m = *step.move;
      Emit({.type = RebalanceEvent::Type::kMove,
            .reason = reason,
            .kind = MoveKind::kGpu,
            .node = m.from,
            .to = absl::StrCat(m.to, " (", m.to_backend, ")"),
            .subject = step.subject,
            .amount = 1,
            .ms = m.total_ms,
            .detail = absl::StrFormat("%s; %s moved, launches paused %.2f ms",
                                      step.detail, Mib(m.bytes), m.pause_ms)});
    }
  }

  static bool Taken(const RebalancerOptions& o, const NodeLoadView& n) {
    // Less than cpu_low of its cores left for Silt's pieces.
    return n.cores - n.cpu_foreign < o.cpu_low * n.cores;
  }

  void Open(const std::string& node, Clock::time_point since, MoveReason r) {
    if (!open.contains(node)) open[node] = Episode{since, r};
  }

  void Cpu(const std::vector<NodeLoadView>& nodes, Clock::time_point now) {
    for (const auto& n : nodes) {
      if (n.cores == 0) continue;
      if (n.tasks > 0) {
        RecentCompute& rc = recent_compute[n.name];
        rc.tasks = now - rc.last > kRecentCompute ? n.tasks
                                                  : std::max(rc.tasks, n.tasks);
        rc.last = now;
      }
      if (hot.contains(n.name)) {
        // Cool again once other work leaves Silt more than cpu_high.
        if (n.cores - n.cpu_foreign <= options.cpu_high * n.cores) {
          cool_since.erase(n.name);
          continue;
        }
        auto since = cool_since.emplace(n.name, now).first->second;
        if (now - since >= options.cool_after) {
          cool_since.erase(n.name);
          hooks.set_hot(n.name, false);
          hot.erase(n.name);
          Emit({.type = RebalanceEvent::Type::kCool,
                .reason = MoveReason::kCpuHigh,
                .node = n.name,
                .detail = absl::StrFormat(
                    "%.2f of %u cores used, %.2f not Silt's: new work may "
                    "land here again",
                    n.cpu_used, n.cores, n.cpu_foreign)});
        }
        continue;
      }
      bool over = !n.leaving && n.cpu_used > options.cpu_high * n.cores &&
                  Taken(options, n);
      if (!over) {
        cpu_over.erase(n.name);
        continue;
      }
      auto since = cpu_over.emplace(n.name, now).first->second;
      if (now - since < options.confirm) continue;
      // The compute proclets the node ran lately, not only at this pulse: a
      // node whose CPU was taken is slow to start its next share, and the
      // jobs they belong to would send it more (CI: a node that ran shares
      // until the hog came showed none at the pulses that confirmed it).
      uint32_t tasks = 0;
      if (auto it = recent_compute.find(n.name);
          it != recent_compute.end() && now - it->second.last <= kRecentCompute)
        tasks = it->second.tasks;
      std::vector<std::string> to;
      for (const auto& m : nodes)
        if (m.name != n.name && !m.leaving && !hot.contains(m.name) &&
            m.cores > 0 && !Taken(options, m))
          to.push_back(m.name);
      Open(n.name, since, MoveReason::kCpuHigh);
      Episode& ep = open[n.name];
      if (to.empty()) {
        if (!ep.stuck)
          Emit({.type = RebalanceEvent::Type::kStuck,
                .reason = MoveReason::kCpuHigh,
                .node = n.name,
                .detail = "no other node has CPU to spare"});
        ep.stuck = true;
        continue;
      }
      Emit({.type = RebalanceEvent::Type::kPressure,
            .reason = MoveReason::kCpuHigh,
            .node = n.name,
            .detail = absl::StrFormat(
                "%.2f of %u cores used, %.2f of them not Silt's (mark %.0f%%)",
                n.cpu_used, n.cores, n.cpu_foreign, options.cpu_high * 100)});
      auto t0 = Clock::now();
      auto moved = hooks.set_hot(n.name, true);
      double ms = Ms(Clock::now() - t0);
      hot.insert(n.name);
      if (tasks > 0)
        Emit({.type = RebalanceEvent::Type::kMove,
              .reason = MoveReason::kCpuHigh,
              .kind = MoveKind::kCompute,
              .node = n.name,
              .to = absl::StrJoin(to, ","),
              .subject = absl::StrCat(tasks, " compute proclet(s)"),
              .amount = static_cast<double>(tasks),
              .ms = ms,
              .detail = "they finish their current share and take no more "
                        "there"});
      for (const auto& m : moved)
        Emit({.type = RebalanceEvent::Type::kMove,
              .reason = MoveReason::kCpuHigh,
              .kind = MoveKind::kInstance,
              .node = n.name,
              .to = m.to,
              .subject = absl::StrCat(m.function, " x", m.instances),
              .amount = static_cast<double>(m.instances),
              .ms = ms,
              .detail = "new calls and replicas start there from the "
                        "snapshot; calls running here finish here"});
      recent_compute.erase(n.name);
    }
  }

  void Memory(const std::vector<NodeLoadView>& nodes, Clock::time_point now) {
    std::map<std::string, uint64_t> projected;
    for (const auto& n : nodes) projected[n.name] = n.memory_used;
    for (const auto& n : nodes) {
      if (n.memory == 0) continue;
      double high = options.memory_high * static_cast<double>(n.memory);
      if (n.leaving || static_cast<double>(n.memory_used) <= high) {
        memory_over.erase(n.name);
        acted.erase(n.name);
        continue;
      }
      auto since = memory_over.emplace(n.name, now).first->second;
      if (now - since < options.confirm) continue;
      if (auto it = acted.find(n.name);
          it != acted.end() && it->second.first == n.memory_used &&
          now - it->second.second < std::chrono::seconds(1))
        continue;
      acted[n.name] = {n.memory_used, now};
      bool fresh = !open.contains(n.name);
      Open(n.name, since, MoveReason::kMemoryHigh);
      if (fresh)
        Emit({.type = RebalanceEvent::Type::kPressure,
              .reason = MoveReason::kMemoryHigh,
              .node = n.name,
              .detail = absl::StrCat(Mib(n.memory_used), " of ", Mib(n.memory),
                                     " used (mark ", options.memory_high * 100,
                                     "%)")});
      MoveShards(n, nodes, projected);
    }
  }

  // Moves shards off `n`, the most bytes per millisecond of migration first,
  // each to the node with the most room under its low mark, until `n` is
  // projected under its own low mark.
  void MoveShards(const NodeLoadView& n, const std::vector<NodeLoadView>& nodes,
                  std::map<std::string, uint64_t>& projected) {
    std::vector<ShardView> cands;
    bool pinned = false;
    for (const auto& s : directory->List("")) {
      bool may = hooks.may_move(s);
      for (const auto& sh : s.shards) {
        if (sh.node != n.name || sh.state != ShardState::kActive) continue;
        if (!may) {
          pinned = true;
          continue;
        }
        cands.push_back(sh);
      }
    }
    std::sort(cands.begin(), cands.end(), [](const auto& a, const auto& b) {
      return a.bytes / MigrationMs(a.bytes) > b.bytes / MigrationMs(b.bytes);
    });
    double low = options.memory_low * static_cast<double>(n.memory);
    Episode& ep = open[n.name];
    std::string why;
    for (const ShardView& sh : cands) {
      if (static_cast<double>(projected[n.name]) <= low) break;
      std::string dest;
      double room = 0;
      for (const auto& m : nodes) {
        if (m.name == n.name || m.leaving || m.memory == 0) continue;
        double free = options.memory_low * static_cast<double>(m.memory) -
                      static_cast<double>(projected[m.name]);
        if (free >= static_cast<double>(sh.bytes) && free > room)
          dest = m.name, room = free;
      }
      if (dest.empty()) {
        why = absl::StrCat("no node has room for shard ", sh.id, " (",
                           Mib(sh.bytes), ") under its mark");
        continue;
      }
      auto r = directory->Migrate(sh.id, dest);
      if (!r.ok()) {
        why = absl::StrCat("shard ", sh.id, ": ", r.status().message());
        continue;
      }
      projected[n.name] -= std::min(projected[n.name], r->bytes);
      projected[dest] += r->bytes;
      Emit({.type = RebalanceEvent::Type::kMove,
            .reason = MoveReason::kMemoryHigh,
            .kind = MoveKind::kMemory,
            .node = n.name,
            .to = dest,
            .subject =
                absl::StrCat("shard ", sh.id, " of ", sh.ns, "/", sh.structure),
            .amount = static_cast<double>(r->bytes),
            .ms = r->total_ms,
            .detail = absl::StrFormat("%s live, writes paused %.2f ms",
                                      Mib(r->bytes), r->pause_ms)});
    }
    if (static_cast<double>(projected[n.name]) > low && !ep.stuck) {
      if (why.empty())
        why = pinned ? "what is left belongs to pinned or opted-out functions"
                     : "what is left is not memory proclets";
      Emit({.type = RebalanceEvent::Type::kStuck,
            .reason = MoveReason::kMemoryHigh,
            .node = n.name,
            .detail = why});
      ep.stuck = true;
    }
  }

  // Closes the episodes whose pressure is relieved: memory back under the
  // high mark; a hot node with no compute proclet of Silt's left running.
  // When the last one closes, the cluster is at equilibrium.
  void Settle(const std::vector<NodeLoadView>& nodes, Clock::time_point now) {
    if (open.empty()) return;
    Clock::time_point first = now;
    MoveReason reason = MoveReason::kCpuHigh;
    for (const auto& [name, ep] : open)
      if (ep.since <= first) first = ep.since, reason = ep.reason;
    std::vector<std::string> done;
    for (const auto& [name, ep] : open) {
      // (clang before 16 cannot capture a structured binding)
      auto n = std::find_if(
          nodes.begin(), nodes.end(),
          [&want = name](const auto& v) { return v.name == want; });
      bool relieved =
          n == nodes.end() ||  // the node is gone
          (ep.reason == MoveReason::kMemoryHigh
               ? static_cast<double>(n->memory_used) <=
                     options.memory_high * static_cast<double>(n->memory)
           : hot.contains(name) ? n->tasks == 0
                                : !cpu_over.contains(name));
      if (relieved) done.push_back(name);
    }
    for (const auto& d : done) open.erase(d);
    if (!done.empty() && open.empty())
      Emit({.type = RebalanceEvent::Type::kEquilibrium,
            .reason = reason,
            .node = absl::StrJoin(done, ","),
            .ms = Ms(now - first),
            .detail = "every node is under its marks, or has nothing of "
                      "Silt's left that could move"});
  }
};

std::unique_ptr<Rebalancer> Rebalancer::Start(const RebalancerOptions& options,
                                              Hooks hooks, Directory* directory,
                                              Metrics* metrics) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->hooks = std::move(hooks);
  impl->directory = directory;
  impl->metrics = metrics;
  Impl* p = impl.get();
  impl->thread = std::thread([p] { p->Loop(); });
  return std::unique_ptr<Rebalancer>(new Rebalancer(std::move(impl)));
}

Rebalancer::Rebalancer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Rebalancer::~Rebalancer() {
  {
    absl::MutexLock l(&impl_->mu);
    impl_->stopping = true;
  }
  impl_->thread.join();
}

void Rebalancer::Wake() {
  absl::MutexLock l(&impl_->mu);
  impl_->woken = true;
}

std::vector<RebalanceEvent> Rebalancer::Events(uint64_t after,
                                               std::chrono::milliseconds wait) {
  absl::MutexLock l(&impl_->mu);
  auto has = [&]() ABSL_SHARED_LOCKS_REQUIRED(impl_->mu) {
    return impl_->stopping || impl_->next_seq > after + 1;
  };
  if (wait.count() > 0)
    impl_->mu.AwaitWithTimeout(absl::Condition(&has),
                               absl::Milliseconds(wait.count()));
  std::vector<RebalanceEvent> out;
  for (const auto& e : impl_->events)
    if (e.seq > after) out.push_back(e);
  return out;
}

}  // namespace silt::gateway
