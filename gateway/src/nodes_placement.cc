// Where work goes: the node a call is sent to, hot nodes the rebalancer
// marks, and which functions may move off them.
#include "nodes_impl.h"

namespace silt::gateway {

bool NodeRegistry::Impl::AvoidHotLocked(const Fn& fn) const {
  if (!fn.Movable()) return false;
  for (const auto& [n, node] : nodes)
    if (!node->hot && fn.Allows(n)) return true;
  return false;
}

std::vector<NodeLoadView> NodeRegistry::Impl::LoadViews() {
  std::lock_guard<std::mutex> l(mu);
  std::vector<NodeLoadView> out;
  for (const auto& [n, node] : nodes)
    out.push_back({node->name, node->cores, node->cpu_used, node->cpu_foreign,
                   node->memory, node->memory_used, node->tasks, node->busy,
                   node->leaving, node->hot});
  return out;
}

std::vector<InstanceMove> NodeRegistry::Impl::SetHot(const std::string& name,
                                                     bool hot) {
  std::vector<InstanceMove> moved;
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = nodes.find(name);
    if (it == nodes.end()) return moved;
    it->second->hot = hot;
    LoadFnsLocked().IgnoreError();
    if (hot) {
      for (const auto& [key, c] : it->second->counts) {
        auto f = fns.find(key);
        if (f == fns.end() || c.ready() == 0 ||
            c.generation() != f->second->spec.generation() ||
            !AvoidHotLocked(*f->second))
          continue;
        std::string to;
        double spare = -1e9;
        for (const auto& [n, node] : nodes) {
          if (node->hot || !f->second->Allows(n)) continue;
          double free = node->cores - node->cpu_used;
          if (free > spare) to = n, spare = free;
        }
        moved.push_back({key, c.ready(), to});
      }
    }
  }
  SendAssignments();
  SendClusterView();
  return moved;
}

bool NodeRegistry::Impl::MayMove(const StructureView& v) {
  std::lock_guard<std::mutex> l(mu);
  LoadFnsLocked().IgnoreError();
  for (const auto& f : v.functions)
    if (auto it = fns.find(Key(v.ns, f));
        it != fns.end() && !it->second->Movable())
      return false;
  return true;
}

auto NodeRegistry::Impl::PickLocked(const std::string& key, const Fn& fn,
                                    const std::vector<std::string>& exclude)
    -> std::shared_ptr<Node> {
  uint64_t generation = fn.spec.generation();
  uint64_t limit = fn.spec.memory_limit_bytes();
  struct Score {
    bool cool = true;  // not a hot node the function should stay off
    long idle = 0;
    bool fits = false;
    int spare = 0;  // quarter cores
    int inflight = 0;
    bool Better(const Score& o) const {
      if (cool != o.cool) return cool;
      if ((idle > 0 || o.idle > 0) && idle != o.idle) return idle > o.idle;
      if (idle <= 0 && fits != o.fits) return fits;
      if (idle <= 0 && spare != o.spare) return spare > o.spare;
      return inflight < o.inflight;
    }
  };
  std::shared_ptr<Node> best;
  Score best_score;
  size_t i = 0, n = nodes.size();
  std::vector<std::shared_ptr<Node>> order;
  for (auto& [name, node] : nodes) order.push_back(node);
  ++rr;
  bool avoid_hot = AvoidHotLocked(fn);
  for (i = 0; i < n; ++i) {
    auto& node = order[(i + rr) % n];
    if (std::find(exclude.begin(), exclude.end(), node->name) != exclude.end())
      continue;
    if (!fn.Allows(node->name)) continue;
    long ready = 0;
    if (auto it = node->counts.find(key);
        it != node->counts.end() && it->second.generation() == generation)
      ready = it->second.ready();
    Score sc;
    sc.cool = !(avoid_hot && node->hot);
    sc.inflight = node->inflight[key];
    sc.idle = ready - sc.inflight;
    sc.fits = node->memory == 0 || node->memory_used + limit <= node->memory;
    sc.spare = static_cast<int>((node->cores - node->cpu_used) * 4);
    if (!best || sc.Better(best_score)) {
      best = node;
      best_score = sc;
    }
  }
  return best;
}

}  // namespace silt::gateway
