#include "gpu_directory.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "invoker/proto/proclets.grpc.pb.h"
#include "nodes.h"
#include "store/store.h"

namespace silt::gateway {
namespace {

namespace pv1 = silt::proclets::v1;

const GpuNode* FindNode(const std::vector<GpuNode>& nodes,
                        const std::string& name) {
  for (const auto& n : nodes)
    if (n.name == name) return &n;
  return nullptr;
}

// Store keys (table kMeta): a pinned proclet's "ns/function/name", a
// reclaimed GPU's node.
constexpr absl::string_view kPinnedPrefix = "gpu-pinned/";
constexpr absl::string_view kReclaimedPrefix = "gpu-reclaimed/";

std::string Mib(uint64_t bytes) {
  return absl::StrFormat("%.0f MiB", static_cast<double>(bytes) / (1 << 20));
}

uint64_t Held(const GpuProcletView& v) {
  return std::max(v.memory_limit, v.memory_used);
}

}  // namespace

GpuDirectory::GpuDirectory(NodeSource nodes, store::Store* store,
                           NodeCalls calls, GpuRebalanceOptions rebalance)
    : nodes_(std::move(nodes)),
      store_(store),
      calls_(std::move(calls)),
      rebalance_(rebalance) {
  if (store_ == nullptr) return;
  absl::MutexLock lock(&mu_);
  for (auto [prefix, into] : {std::pair{kPinnedPrefix, &pinned_},
                              std::pair{kReclaimedPrefix, &reclaimed_}}) {
    auto kept = store_->Scan(store::Table::kMeta, prefix);
    if (!kept.ok()) {
      fprintf(stderr, "silt-gateway: reading GPU pins and reclaims: %s\n",
              std::string(kept.status().message()).c_str());
      continue;
    }
    for (const auto& [k, v] : *kept) into->insert(k.substr(prefix.size()));
  }
}

absl::Status GpuDirectory::Keep(absl::string_view prefix,
                                const std::string& name, bool kept) {
  if (store_ == nullptr) return absl::OkStatus();
  store::WriteBatch b;
  if (kept)
    b.Put(store::Table::kMeta, absl::StrCat(prefix, name), "");
  else
    b.Delete(store::Table::kMeta, absl::StrCat(prefix, name));
  return store_->Write(b);
}

void GpuDirectory::PersistPin(const std::string& key, bool pinned) {
  if (auto st = Keep(kPinnedPrefix, key, pinned); !st.ok())
    fprintf(stderr, "silt-gateway: keeping GPU proclet %s's pin: %s\n",
            key.c_str(), std::string(st.message()).c_str());
}

bool GpuDirectory::GpuUsableLocked(const GpuNode& n,
                                   const GpuNeeds& needs) const {
  return !n.leaving && needs.Fits(n) && !reclaimed_.contains(n.name);
}

std::string GpuDirectory::KeyOf(const std::string& ns,
                                const std::string& function,
                                const std::string& name) {
  return absl::StrCat(ns, "/", function, "/", name);
}

bool GpuDirectory::IsGpuId(const std::string& id) {
  uint64_t n;
  return id.size() > 1 && id[0] == 'g' &&
         absl::SimpleAtoi(absl::string_view(id).substr(1), &n);
}

absl::StatusOr<GpuDirectory::Entry*> GpuDirectory::StillByIdLocked(
    const std::string& id) {
  for (auto& [k, entry] : entries_) {
    if (entry.view.id != id) continue;
    if (entry.moving)
      return absl::FailedPreconditionError(
          absl::StrCat("GPU proclet ", id, " is moving already; try again"));
    return &entry;
  }
  return absl::NotFoundError(
      absl::StrCat("no GPU proclet ", id, " (see silt proclets list)"));
}

std::string GpuDirectory::NewIdLocked() {
  return absl::StrCat("g", next_id_++);
}

absl::StatusOr<GpuNeeds> ParseGpuLabels(
    const std::map<std::string, std::string>& labels) {
  GpuNeeds n;
  for (auto [label, out] :
       {std::pair<const char*, uint64_t*>{"com.silt.gpu.min-memory", &n.min},
        {"com.silt.gpu.preferred-memory", &n.preferred},
        {"com.silt.gpu.max-memory", &n.max}}) {
    auto it = labels.find(label);
    if (it == labels.end()) continue;
    auto m = ParseMemoryQuantity(it->second);
    if (!m.ok() || *m == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", label, "=", it->second,
          " is not a memory quantity (e.g. 512Mi, 2Gi): device memory for "
          "each of the function's GPU proclets"));
    *out = *m;
  }
  if (auto it = labels.find("com.silt.gpu.compute-capability");
      it != labels.end()) {
    // "8.0", "7.5", "12.0": major.minor, as the driver reports it.
    const std::string& v = it->second;
    const size_t dot = v.find('.');
    uint32_t major = 0, minor = 0;
    if (dot == std::string::npos || dot == 0 || dot + 2 != v.size() ||
        !absl::SimpleAtoi(v.substr(0, dot), &major) || major == 0 ||
        major > 99 || !absl::SimpleAtoi(v.substr(dot + 1), &minor))
      return absl::InvalidArgumentError(absl::StrCat(
          "label com.silt.gpu.compute-capability=", v,
          " is not a compute capability such as 7.5 or 8.0 (the least a GPU "
          "the function's proclets run on has)"));
    n.compute = major * 10 + minor;
  }
  if (n.max > 0 && n.preferred > n.max)
    return absl::InvalidArgumentError(
        "label com.silt.gpu.preferred-memory is more than "
        "com.silt.gpu.max-memory");
  if (n.min > 0 && n.min > n.wanted() && n.wanted() > 0)
    return absl::InvalidArgumentError(
        absl::StrCat("label com.silt.gpu.min-memory is more than com.silt.gpu.",
                     n.preferred > 0 ? "preferred" : "max", "-memory"));
  return n;
}

std::map<std::string, uint64_t> GpuDirectory::PromisedLocked() const {
  std::map<std::string, uint64_t> promised;
  for (const auto& [k, e] : entries_)
    if (e.view.backend != "host") promised[e.view.node] += Held(e.view);
  return promised;
}

GpuDirectory::Placement GpuDirectory::PlaceLocked(
    const std::vector<GpuNode>& nodes, const GpuNeeds& needs,
    const std::string& asking_node) const {
  std::map<std::string, uint64_t> promised = PromisedLocked();
  // The GPU with the most free: the preferred allocation there, or
  // (downgraded) what is free if that is at least the minimum.
  Placement p;
  uint64_t best_free = 0;
  for (const auto& n : nodes) {
    if (!GpuUsableLocked(n, needs) || n.gpu_memory < promised[n.name]) continue;
    uint64_t free = n.gpu_memory - promised[n.name];
    if (p.node == nullptr || free > best_free) {
      p.node = &n;
      best_free = free;
    }
  }
  p.allocation = needs.wanted();
  if (p.node != nullptr && best_free < p.allocation) {
    if (needs.min > 0 && best_free >= needs.min)
      p.allocation = best_free;
    else
      p.node = nullptr;
  }
  p.on_gpu = p.node != nullptr;
  if (p.node == nullptr) {  // no GPU has room: the asking node's CPU cores
    p.node = FindNode(nodes, asking_node);
    if (p.node != nullptr && p.node->leaving) p.node = nullptr;
    for (const auto& n : nodes)
      if (p.node == nullptr && !n.leaving) p.node = &n;
  }
  return p;
}

std::vector<std::pair<std::string, uint64_t>> GpuDirectory::RoomPlanLocked(
    const std::vector<GpuNode>& nodes, const GpuNeeds& needs) const {
  const uint64_t needed = needs.min > 0 ? needs.min : needs.wanted();
  if (needed == 0) return {};  // it wants the whole device
  std::map<std::string, uint64_t> promised = PromisedLocked();
  struct Spare {
    std::string id;
    uint64_t limit, floor;  // its allocation, and the least it can have
  };
  std::vector<Spare> best_spares;
  uint64_t best_free = 0, best_total = 0;
  for (const auto& n : nodes) {
    if (!GpuUsableLocked(n, needs)) continue;
    const uint64_t free =
        n.gpu_memory > promised[n.name] ? n.gpu_memory - promised[n.name] : 0;
    std::vector<Spare> spares;
    uint64_t total = free;
    for (const auto& [k, e] : entries_) {
      if (e.view.node != n.name || e.view.backend == "host" || e.moving ||
          e.needs.min == 0)
        continue;
      const uint64_t floor = std::max(e.needs.min, e.view.memory_used);
      if (e.view.memory_limit <= floor) continue;
      spares.push_back({e.view.id, e.view.memory_limit, floor});
      total += e.view.memory_limit - floor;
    }
    if (total >= needed && total > best_total) {
      best_total = total;
      best_free = free;
      best_spares = std::move(spares);
    }
  }
  // The most spare first, each only as far as still needed.
  std::sort(best_spares.begin(), best_spares.end(),
            [](const Spare& a, const Spare& b) {
              return a.limit - a.floor > b.limit - b.floor;
            });
  std::vector<std::pair<std::string, uint64_t>> plan;
  uint64_t free = best_free;
  for (const Spare& s : best_spares) {
    if (free >= needed) break;
    const uint64_t take = std::min(s.limit - s.floor, needed - free);
    plan.push_back({s.id, s.limit - take});
    free += take;
  }
  return plan;
}

absl::StatusOr<GpuProcletView> GpuDirectory::Open(
    const std::string& ns, const std::string& function, const std::string& name,
    const GpuNeeds& needs, const std::string& asking_node) {
  const std::vector<GpuNode> nodes = nodes_();  // before mu_: it locks too
  const std::string key = KeyOf(ns, function, name);
  for (bool made_room = false;; made_room = true) {
    std::vector<std::pair<std::string, uint64_t>> shrink;
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(key);
      if (it != entries_.end() &&
          FindNode(nodes, it->second.view.node) != nullptr) {
        it->second.needs = needs;  // the labels may have changed since
        it->second.needs_known = true;
        return it->second.view;
      }
      Placement p = PlaceLocked(nodes, needs, asking_node);
      // No GPU has room: proclets that declared a minimum are downgraded
      // toward it (never below what they hold) rather than this one going
      // to CPU cores, once.
      if (!p.on_gpu && !made_room) shrink = RoomPlanLocked(nodes, needs);
      if (shrink.empty()) {
        if (p.node == nullptr)
          return absl::UnavailableError("no node can hold a GPU proclet now");
        Entry& e = entries_[key];
        if (e.view.id.empty()) e.view.id = NewIdLocked();
        e.needs = needs;
        e.needs_known = true;
        e.placed_at = Clock::now();
        e.reports_here = 0;
        e.view.ns = ns;
        e.view.function = function;
        e.view.name = name;
        e.view.node = p.node->name;
        e.view.memory_limit = p.allocation;
        e.view.backend = p.on_gpu ? "cuda" : "host";
        e.view.device = p.on_gpu ? p.node->gpu_model : "";
        return e.view;
      }
    }
    for (const auto& [id, bytes] : shrink)
      if (auto r = Resize(id, bytes, absl::Seconds(1)); !r.ok())
        fprintf(stderr,
                "silt-gateway: downgrading GPU proclet %s to make room: %s\n",
                id.c_str(), std::string(r.status().message()).c_str());
  }
}

void GpuDirectory::Report(const std::string& node,
                          std::vector<GpuProcletView> held) {
  absl::MutexLock lock(&mu_);
  std::set<std::string> keys;
  for (auto& h : held) {
    std::string key = KeyOf(h.ns, h.function, h.name);
    keys.insert(key);
    Entry& e = entries_[key];
    if (e.moving) continue;  // the move's answer says where it went
    // The directory put it elsewhere: this is a report from before a move
    // (reports and a move's answer come on different streams). Once that
    // node drops it, the other's claim is taken.
    if (!e.view.id.empty() && !e.view.node.empty() && e.view.node != node)
      continue;
    if (e.view.id.empty()) e.view.id = NewIdLocked();
    h.id = e.view.id;
    h.node = node;
    h.moves = e.view.moves;
    h.last_pause_ms = e.view.last_pause_ms;
    // Utilisation: device time over wall time since the last report (a
    // smaller count is a new process: a move, or a restart).
    const auto now = std::chrono::steady_clock::now();
    const double wall_ns =
        std::chrono::duration<double, std::nano>(now - e.reported_at).count();
    h.utilization = e.view.utilization;
    if (e.reported && e.view.node == node && h.busy_ns >= e.view.busy_ns &&
        wall_ns > 0)
      h.utilization =
          std::min(1.0, double(h.busy_ns - e.view.busy_ns) / wall_ns);
    e.reports_here = e.reported && e.view.node == node ? e.reports_here + 1 : 1;
    e.view = std::move(h);
    e.reported = true;
    e.reported_at = now;
  }
  for (auto it = entries_.begin(); it != entries_.end();) {
    const Entry& e = it->second;
    if (e.view.node == node && e.reported && !e.moving &&
        !keys.contains(it->first))
      it = entries_.erase(it);
    else
      ++it;
  }
}

void GpuDirectory::NodeGone(const std::string& node) {
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.view.node == node && !it->second.moving)
      it = entries_.erase(it);  // its device state went with the node
    else
      ++it;
  }
}

std::vector<GpuProcletView> GpuDirectory::List(const std::string& ns) {
  absl::MutexLock lock(&mu_);
  std::vector<GpuProcletView> out;
  for (const auto& [k, e] : entries_)
    if (ns.empty() || e.view.ns == ns) out.push_back(e.view);
  return out;
}

absl::StatusOr<GpuMove> GpuDirectory::Migrate(const std::string& id,
                                              const std::string& node,
                                              const std::string& backend) {
  return Move(id, node, backend, MoveCause::kOperator);
}

absl::StatusOr<GpuMove> GpuDirectory::Move(const std::string& id,
                                           const std::string& node,
                                           const std::string& backend,
                                           MoveCause cause) {
  if (!backend.empty() && backend != "cuda" && backend != "host")
    return absl::InvalidArgumentError(
        absl::StrCat("backend \"", backend, "\" is none of cuda, host"));
  const std::vector<GpuNode> nodes = nodes_();
  const GpuNode* target = FindNode(nodes, node);
  if (target == nullptr)
    return absl::NotFoundError(
        absl::StrCat("no node ", node, " is connected (see silt nodes)"));
  if (target->leaving)
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node, " is leaving"));
  const std::string to_backend =
      !backend.empty() ? backend : (target->gpus > 0 ? "cuda" : "host");
  if (to_backend == "cuda" && target->gpus == 0)
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node,
                     " has no GPU: move the proclet there with backend "
                     "host (its CPU cores)"));
  GpuProcletView from;
  {
    absl::MutexLock lock(&mu_);
    auto found = StillByIdLocked(id);
    if (!found.ok()) return found.status();
    Entry* e = *found;
    if (e->view.node == node && e->view.backend == to_backend)
      return absl::InvalidArgumentError(absl::StrCat(
          "GPU proclet ", id, " is on ", node, " (", to_backend, ") already"));
    if (to_backend == "cuda" && reclaimed_.contains(node))
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", node, "'s GPU is reclaimed: silt gpu release ", node,
          " gives it back, or move the proclet with backend "
          "host"));
    if (to_backend == "cuda" && !e->needs.Fits(*target))
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", node, "'s GPU has compute capability ",
          target->gpu_compute / 10, ".", target->gpu_compute % 10,
          "; function ", e->view.function, " needs ", e->needs.compute / 10,
          ".", e->needs.compute % 10,
          " (com.silt.gpu.compute-capability): move it to another GPU, or "
          "with backend host"));
    e->moving = true;
    from = e->view;
  }
  const std::string key = KeyOf(from.ns, from.function, from.name);
  const GpuNode* source = FindNode(nodes, from.node);
  auto done = [&](const GpuMove* moved) {
    bool pin_changed = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(key);
      if (it == entries_.end()) return;
      it->second.moving = false;
      // A failed move of the directory's own is not tried again at once.
      if (moved == nullptr && cause == MoveCause::kRebalance)
        it->second.placed_at = Clock::now();
      if (moved == nullptr) return;
      it->second.view.node = moved->to;
      it->second.view.backend = moved->to_backend;
      it->second.view.device = moved->to_device;
      it->second.view.moves++;
      it->second.view.last_pause_ms = moved->pause_ms;
      it->second.reported = false;  // until the target's next report
      it->second.reports_here = 0;
      it->second.placed_at = Clock::now();
      // An operator's choice stays; the directory's own moves unpin
      // nothing (a pinned proclet is only moved by a reclaim).
      if (cause == MoveCause::kOperator)
        pin_changed = pinned_.insert(key).second;
    }
    if (pin_changed) PersistPin(key, true);
  };
  if (source == nullptr || (!source->channel && !calls_.move)) {
    done(nullptr);
    return absl::UnavailableError(absl::StrCat("node ", from.node,
                                               ", which holds GPU proclet ", id,
                                               ", is not connected"));
  }
  auto start = std::chrono::steady_clock::now();
  auto m = calls_.move ? calls_.move(*source, *target, from, to_backend)
                       : MoveOnNode(*source, *target, from, to_backend);
  if (!m.ok()) {
    done(nullptr);
    return absl::Status(
        m.status().code(),
        absl::StrCat("moving GPU proclet ", id, ": ", m.status().message()));
  }
  m->id = id;
  m->from = from.node;
  m->to = node;
  m->total_ms = std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - start)
                    .count();
  done(&*m);
  return m;
}

absl::StatusOr<GpuMove> GpuDirectory::MoveOnNode(const GpuNode& source,
                                                 const GpuNode& target,
                                                 const GpuProcletView& from,
                                                 const std::string& backend) {
  pv1::MigrateGpuProcletRequest req;
  req.set_namespace_(from.ns);
  req.set_function(from.function);
  req.set_name(from.name);
  req.set_target_data_address(target.data_address);
  req.set_target_backend(backend);
  pv1::MigrateGpuProcletResponse res;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
  grpc::Status st = pv1::ProcletHost::NewStub(source.channel)
                        ->MigrateGpuProclet(&ctx, req, &res);
  if (!st.ok())
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        st.error_message());
  GpuMove m;
  m.from_backend = res.from_backend();
  m.to_backend = res.to_backend();
  m.to_device = res.to_device();
  m.bytes = res.bytes();
  m.pause_ms = res.pause_ms();
  m.extract_ms = res.extract_ms();
  m.inject_ms = res.inject_ms();
  m.precopy_ms = res.precopy_ms();
  m.precopy_bytes = res.precopy_bytes();
  m.paused_bytes = res.paused_bytes();
  return m;
}

absl::StatusOr<GpuProcletView> GpuDirectory::Resize(const std::string& id,
                                                    uint64_t bytes,
                                                    absl::Duration wait) {
  const std::vector<GpuNode> nodes = nodes_();
  GpuProcletView view;
  {
    absl::MutexLock lock(&mu_);
    auto found = StillByIdLocked(id);
    if (!found.ok()) return found.status();
    view = (*found)->view;
    // On a GPU: within what it has besides its other proclets' allocations.
    const GpuNode* n = FindNode(nodes, view.node);
    if (view.backend == "cuda" && n != nullptr && n->gpu_memory > 0) {
      const uint64_t others = PromisedLocked()[n->name] - Held(view);
      const uint64_t room = n->gpu_memory > others ? n->gpu_memory - others : 0;
      if (bytes > room)
        return absl::FailedPreconditionError(absl::StrCat(
            "node ", n->name, "'s GPU has ", room, " bytes for GPU proclet ",
            id, " besides its other proclets' allocations, not ", bytes));
    }
  }
  const GpuNode* holder = FindNode(nodes, view.node);
  if (holder == nullptr || (!holder->channel && !calls_.resize))
    return absl::UnavailableError(absl::StrCat("node ", view.node,
                                               ", which holds GPU proclet ", id,
                                               ", is not connected"));
  auto now = calls_.resize ? calls_.resize(*holder, view, bytes, wait)
                           : ResizeOnNode(*holder, view, bytes, wait);
  if (!now.ok())
    return absl::Status(now.status().code(),
                        absl::StrCat("resizing GPU proclet ", id, ": ",
                                     now.status().message()));
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(KeyOf(view.ns, view.function, view.name));
  if (it != entries_.end()) {
    it->second.view.memory_limit = now->first;
    it->second.view.memory_used = now->second;
    view = it->second.view;
  }
  view.memory_limit = now->first;
  view.memory_used = now->second;
  return view;
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> GpuDirectory::ResizeOnNode(
    const GpuNode& holder, const GpuProcletView& view, uint64_t bytes,
    absl::Duration wait) {
  pv1::ResizeGpuProcletRequest req;
  req.set_namespace_(view.ns);
  req.set_function(view.function);
  req.set_name(view.name);
  req.set_memory_limit(bytes);
  req.set_wait_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(wait)));
  pv1::ResizeGpuProcletResponse res;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(wait) + std::chrono::seconds(10));
  grpc::Status st = pv1::ProcletHost::NewStub(holder.channel)
                        ->ResizeGpuProclet(&ctx, req, &res);
  if (!st.ok())
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        st.error_message());
  return std::pair<uint64_t, uint64_t>{res.memory_limit(), res.memory_used()};
}

void GpuDirectory::DropFunction(const std::string& ns,
                                const std::string& function) {
  std::set<std::string> holders, unpinned;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      const GpuProcletView& v = it->second.view;
      if (v.ns == ns && (function.empty() || v.function == function)) {
        holders.insert(v.node);
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    const std::string prefix =
        function.empty() ? absl::StrCat(ns, "/") : KeyOf(ns, function, "");
    for (auto it = pinned_.lower_bound(prefix);
         it != pinned_.end() && absl::StartsWith(*it, prefix);)
      unpinned.insert(*it), it = pinned_.erase(it);
  }
  for (const auto& key : unpinned) PersistPin(key, false);
  if (holders.empty()) return;
  for (const auto& n : nodes_()) {
    if (!holders.contains(n.name) || !n.channel) continue;
    pv1::DropGpuProcletsRequest req;
    req.set_namespace_(ns);
    req.set_function(function);
    pv1::DropGpuProcletsResponse res;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    // Best effort: a node that misses it drops them when it restarts.
    (void)pv1::ProcletHost::NewStub(n.channel)->DropGpuProclets(&ctx, req,
                                                                &res);
  }
}

absl::StatusOr<std::vector<GpuMove>> GpuDirectory::Reclaim(
    const std::string& node) {
  const std::vector<GpuNode> nodes = nodes_();
  if (FindNode(nodes, node) == nullptr)
    return absl::NotFoundError(
        absl::StrCat("no node ", node, " is connected (see silt nodes)"));
  bool newly = false;
  {
    absl::MutexLock lock(&mu_);
    newly = reclaimed_.insert(node).second;
  }
  if (newly)
    if (auto st = Keep(kReclaimedPrefix, node, true); !st.ok()) return st;
  std::vector<GpuMove> moves;
  for (;;) {
    std::string id, target, backend = "host";
    {
      absl::MutexLock lock(&mu_);
      std::map<std::string, uint64_t> promised = PromisedLocked();
      for (const auto& [k, e] : entries_) {
        if (e.view.node != node || e.view.backend != "cuda" || e.moving)
          continue;
        id = e.view.id;
        target = node;
        const uint64_t need = Held(e.view);
        uint64_t best_free = 0;
        for (const auto& n : nodes) {
          if (n.name == node || !GpuUsableLocked(n, e.needs) ||
              n.gpu_memory < promised[n.name] + need)
            continue;
          uint64_t free = n.gpu_memory - promised[n.name];
          if (free > best_free) {
            best_free = free;
            target = n.name;
            backend = "cuda";
          }
        }
        break;
      }
    }
    if (id.empty()) return moves;
    auto m = Move(id, target, backend, MoveCause::kReclaim);
    if (!m.ok()) return m.status();
    moves.push_back(*std::move(m));
  }
}

absl::Status GpuDirectory::Release(const std::string& node) {
  {
    absl::MutexLock lock(&mu_);
    if (reclaimed_.erase(node) == 0)
      return absl::NotFoundError(absl::StrCat(
          "node ", node, "'s GPU is not reclaimed (see silt gpu list)"));
  }
  return Keep(kReclaimedPrefix, node, false);
}

bool GpuDirectory::Reclaimed(const std::string& node) {
  absl::MutexLock lock(&mu_);
  return reclaimed_.contains(node);
}

std::vector<GpuDirectory::PlannedMove> GpuDirectory::RebalancePlanLocked(
    const std::vector<GpuNode>& nodes, Clock::time_point now) const {
  const auto settle = absl::ToChronoNanoseconds(rebalance_.settle);
  // Whether the directory may move `e` now: placed (or moved) by the
  // directory, settled, its needs and (from its second report where it is)
  // its utilisation known.
  auto movable = [&](const std::string& key, const Entry& e) {
    return !e.moving && e.needs_known && e.reports_here >= 2 &&
           !pinned_.contains(key) && now - e.placed_at >= settle &&
           FindNode(nodes, e.view.node) != nullptr;
  };
  std::map<std::string, uint64_t> promised = PromisedLocked();
  auto free_on = [&](const GpuNode& n) {
    return n.gpu_memory > promised[n.name] ? n.gpu_memory - promised[n.name]
                                           : uint64_t{0};
  };
  // The proclets on CPU cores that want a GPU, the busiest first.
  std::vector<std::pair<std::string, const Entry*>> up;
  for (const auto& [key, e] : entries_)
    if (e.view.backend == "host" && movable(key, e)) up.push_back({key, &e});
  std::stable_sort(up.begin(), up.end(), [](const auto& a, const auto& b) {
    return a.second->view.utilization > b.second->view.utilization;
  });
  auto subject = [](const Entry& e) {
    return absl::StrCat(e.view.id, " (", e.view.ns, "/", e.view.function, "/",
                        e.view.name, ")");
  };
  for (const auto& [key, p] : up) {
    const uint64_t need = Held(p->view);
    // A GPU with room: the one with the most free.
    const GpuNode* best = nullptr;
    for (const auto& n : nodes)
      if (GpuUsableLocked(n, p->needs) && free_on(n) >= need &&
          (best == nullptr || free_on(n) > free_on(*best)))
        best = &n;
    if (best != nullptr)
      return {
          {p->view.id, best->name, "cuda", GpuMoveWhy::kRoom, subject(*p),
           absl::StrCat("node ", best->name, "'s GPU has ", Mib(free_on(*best)),
                        " free; it holds ", Mib(need))}};
    // None: a busy one takes the GPU of an idle one that frees enough (the
    // idlest, then the smallest), which goes to its node's CPU cores.
    if (p->view.utilization < rebalance_.busy) continue;
    const Entry* idle = nullptr;
    const GpuNode* on = nullptr;
    for (const auto& [qkey, q] : entries_) {
      if (q.view.backend != "cuda" || !movable(qkey, q) ||
          q.view.utilization > rebalance_.idle)
        continue;
      const GpuNode* n = FindNode(nodes, q.view.node);
      if (!GpuUsableLocked(*n, p->needs) || free_on(*n) + Held(q.view) < need)
        continue;
      if (idle == nullptr || q.view.utilization < idle->view.utilization ||
          (q.view.utilization == idle->view.utilization &&
           Held(q.view) < Held(idle->view)))
        idle = &q, on = n;
    }
    if (idle == nullptr) continue;
    const std::string why = absl::StrFormat(
        "%s is busy (%.0f%%) on CPU cores; %s was idle (%.0f%%) on node %s's "
        "GPU",
        p->view.id, 100 * p->view.utilization, idle->view.id,
        100 * idle->view.utilization, on->name);
    return {
        {idle->view.id, on->name, "host", GpuMoveWhy::kWanted, subject(*idle),
         why},
        {p->view.id, on->name, "cuda", GpuMoveWhy::kWanted, subject(*p), why}};
  }
  return {};
}

std::vector<GpuRebalanceStep> GpuDirectory::Rebalance() {
  {
    absl::MutexLock lock(&mu_);
    if (entries_.empty()) return {};  // every pulse wakes this
  }
  const std::vector<GpuNode> nodes = nodes_();
  std::vector<GpuRebalanceStep> steps;
  // A few steps per call: each is planned on what the nodes reported, and
  // the moves made change what they report next.
  for (int round = 0; round < 4; ++round) {
    std::vector<PlannedMove> plan;
    {
      absl::MutexLock lock(&mu_);
      plan = RebalancePlanLocked(nodes, Clock::now());
    }
    if (plan.empty()) break;
    for (const PlannedMove& m : plan) {
      GpuRebalanceStep step{
          .why = m.why,
          .move = Move(m.id, m.node, m.backend, MoveCause::kRebalance),
          .subject = m.subject,
          .detail = m.detail};
      const bool ok = step.move.ok();
      steps.push_back(std::move(step));
      if (!ok) return steps;  // the next pulse plans again
    }
  }
  return steps;
}

}  // namespace silt::gateway
