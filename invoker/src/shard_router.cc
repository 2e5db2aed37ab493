#include "shard_router.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "frames.h"
#include "hosted_shard.h"
#include "proclets/shard.h"

namespace silt::invoker {
namespace {

using wire::StateCode;
using wire::StateKind;
using wire::StateOp;

constexpr int kMaxAttempts = 6;

// The function whose instance the current thread serves (directory
// listings show which functions use a structure).
thread_local std::string t_function;

// The hint that routes an operation on one shard by its arguments: a map
// key's hash, a vector index, the vector's end for a push or its size, the
// queue's one shard. InvalidArgument when an argument is missing,
// ResourceExhausted for a key over the limit, NotFound for an operation that
// is not routed this way. The fast path and the router must agree on it.
absl::StatusOr<uint64_t> RoutingHint(StateOp op, std::string_view args) {
  wire::Reader a(args);
  switch (op) {
    case StateOp::kMapGet:
    case StateOp::kMapPut:
    case StateOp::kMapErase:
    case StateOp::kMapContains: {
      std::string_view key;
      if (!a.Str(&key)) return absl::InvalidArgumentError("missing key");
      if (key.size() > proclets::kMaxKeyBytes)
        return absl::ResourceExhaustedError(
            absl::StrCat("key of ", key.size(), " bytes; the limit is ",
                         proclets::kMaxKeyBytes));
      return proclets::KeyHash(key);
    }
    case StateOp::kVecGet:
    case StateOp::kVecSet: {
      uint64_t index;
      if (!a.U64(&index)) return absl::InvalidArgumentError("missing index");
      return index;
    }
    case StateOp::kVecPush:
    case StateOp::kVecSize:
    case StateOp::kVecExtend:
      return kOpenEnd - 1;
    case StateOp::kQueuePush:
    case StateOp::kQueuePop:
      return 0;
    default:
      return absl::NotFoundError("not routed by its arguments");
  }
}

}  // namespace

ShardRouter::ShardRouter(Resolver resolve, std::string self, ShardTable& shards,
                         const DataKey& key)
    : resolve_(std::move(resolve)),
      self_(std::move(self)),
      shards_(shards),
      peers_([&key] { return key.Hello(); }, 64) {}

void ShardRouter::ForgetLayout(const std::string& ns, const std::string& name) {
  absl::MutexLock l(&layouts_mu_);
  layouts_.erase(LayoutKey(ns, name));
}

std::string ShardRouter::LayoutKey(std::string_view ns, std::string_view name) {
  std::string key;
  key.reserve(ns.size() + 1 + name.size());
  key.append(ns).append("/").append(name);
  return key;
}

absl::StatusOr<std::shared_ptr<const pv1::Layout>> ShardRouter::GetLayout(
    const std::string& ns, const std::string& name, StateKind kind,
    bool refresh) {
  std::string key = LayoutKey(ns, name);
  if (!refresh) {
    absl::MutexLock l(&layouts_mu_);
    auto it = layouts_.find(key);
    if (it != layouts_.end()) return it->second;
  }
  if (!resolve_)
    return absl::UnavailableError("no directory to resolve state with");
  auto layout = resolve_(ns, name, ProtoKind(kind), 0, 0,
                         /*create=*/true, t_function);
  if (!layout.ok()) return layout.status();
  auto shared = std::make_shared<const pv1::Layout>(*std::move(layout));
  absl::MutexLock l(&layouts_mu_);
  layouts_[key] = shared;
  return shared;
}

void ShardRouter::Relocate(const std::string& ns, const std::string& name,
                           uint64_t id, const std::string& to, uint64_t epoch) {
  absl::MutexLock l(&layouts_mu_);
  auto it = layouts_.find(LayoutKey(ns, name));
  if (it == layouts_.end()) return;
  auto copy = std::make_shared<pv1::Layout>(*it->second);
  for (auto& s : *copy->mutable_shards()) {
    if (s.id() == id) {
      s.set_data_address(to);
      s.set_epoch(epoch);
    }
  }
  it->second = std::move(copy);
}

std::string ShardRouter::Send(const pv1::ShardLocation& loc,
                              const std::string& req, bool* ambiguous) {
  if (loc.data_address() == self_) {
    wire::Reader r(std::string_view(req).substr(1));
    return shards_.HandleShardOp(r);
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<PeerConn> c = peers_.Take(loc.data_address());
    if (!c) break;
    // Not sent: retry on a fresh connection.
    if (!WriteBytesFrame(c->fd, req).ok()) continue;
    std::string reply;
    if (c->reader->Next(&reply).ok()) {
      peers_.Give(loc.data_address(), std::move(c));
      return reply;
    }
    *ambiguous = true;
    return Error(StateCode::kUnavailable,
                 absl::StrCat("lost the connection to node ", loc.node(),
                              " during the operation (it may or may not "
                              "have been applied)"));
  }
  return Error(StateCode::kUnavailable,
               absl::StrCat("cannot reach node ", loc.node(), " (",
                            loc.data_address(), ") holding shard ", loc.id()));
}

std::string ShardRouter::ShardRequest(uint64_t id, uint64_t hint, StateOp op,
                                      std::string_view args) {
  std::string req;
  req.reserve(18 + args.size());
  wire::Writer w(&req);
  w.U8(static_cast<uint8_t>(PeerOp::kShardOp));
  w.U64(id);
  w.U64(hint);
  w.U8(static_cast<uint8_t>(op));
  w.Bytes(args);
  return req;
}

const pv1::ShardLocation* ShardRouter::Covering(const pv1::Layout& l,
                                                uint64_t hint) {
  for (const auto& s : l.shards())
    if (hint >= s.lo() && (hint < s.hi() || s.hi() == kOpenEnd)) return &s;
  return nullptr;
}

std::string ShardRouter::Route(const std::string& ns, const std::string& name,
                               StateKind kind, uint64_t hint, StateOp op,
                               std::string_view args) {
  bool refresh = false;
  std::string last;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    auto layout = GetLayout(ns, name, kind, refresh);
    if (!layout.ok())
      return Error(CodeOf(layout.status()), layout.status().message());
    if ((*layout)->kind() != ProtoKind(kind))
      return Error(StateCode::kWrongKind,
                   absl::StrCat("state \"", name, "\" is a ",
                                KindName((*layout)->kind()), ", not a ",
                                KindName(ProtoKind(kind))));
    const pv1::ShardLocation* loc = Covering(**layout, hint);
    if (loc == nullptr)
      return Error(StateCode::kInternal,
                   absl::StrCat("no shard of \"", name, "\" covers ", hint));
    if (loc->state() == pv1::SHARD_LOST)
      return Error(StateCode::kLost,
                   absl::StrCat("shard ", loc->id(), " of \"", name,
                                "\" was lost: node ", loc->node(),
                                " stopped without handing it over"));
    bool ambiguous = false;
    std::string reply =
        Send(*loc, ShardRequest(loc->id(), hint, op, args), &ambiguous);
    if (ambiguous) return reply;
    auto code = static_cast<StateCode>(reply[0]);
    if (code == StateCode::kMoved) {
      wire::Reader r(std::string_view(reply).substr(1));
      std::string_view to;
      uint64_t epoch = 0;
      if (r.Str(&to) && r.U64(&epoch) && !to.empty()) {
        Relocate(ns, name, loc->id(), std::string(to), epoch);
        refresh = false;
      } else {
        refresh = true;
      }
      last = "the shard kept moving";
      continue;
    }
    if (code == StateCode::kUnavailable) {
      // Its node may have died or handed it over: ask the directory.
      refresh = true;
      last = reply.substr(1);
      continue;
    }
    return reply;
  }
  return Error(StateCode::kUnavailable,
               absl::StrCat("state \"", name, "\": ", last));
}

bool ShardRouter::IsFinal(std::string_view reply) {
  if (reply.empty()) return false;
  auto code = static_cast<StateCode>(reply[0]);
  return code != StateCode::kMoved && code != StateCode::kUnavailable;
}

StateLoopBackend::Shared ShardRouter::Share(const std::string& ns,
                                            std::string_view req) {
  constexpr size_t kMaxShared = 64;  // well under SCM_MAX_FD
  StateLoopBackend::Shared out;
  wire::Reader r(req);
  StateOp op;
  StateKind kind;
  std::string_view name;
  if (!wire::ReadRequestHeader(&r, &op, &kind, &name) ||
      kind != StateKind::kMap || !wire::ValidStructureName(name)) {
    out.reply = Error(StateCode::kInvalid, "malformed share request");
    return out;
  }
  std::vector<std::shared_ptr<HostedShard>> candidates = shards_.All();
  for (auto& hs : candidates) {
    if (out.fds.size() == kMaxShared) break;
    absl::MutexLock l(&hs->mu);
    if (hs->gone || !hs->map || hs->info.namespace_() != ns ||
        hs->info.structure() != name)
      continue;
    int fd = fcntl(hs->map->arena().memory_fd(), F_DUPFD_CLOEXEC, 0);
    if (fd >= 0) out.fds.push_back(fd);
  }
  out.reply = Reply(StateCode::kOk);
  return out;
}

StateLoopBackend::Fast ShardRouter::Fast(const std::string& ns,
                                         std::string_view req) {
  using Path = StateLoopBackend::Fast::Path;
  StateLoopBackend::Fast f;
  wire::Reader r(req);
  StateOp op;
  StateKind kind;
  std::string_view name;
  if (!wire::ReadRequestHeader(&r, &op, &kind, &name)) return f;
  std::string_view args = r.rest();
  switch (op) {  // what the fast path takes (never a queue pop: it may wait)
    case StateOp::kMapGet:
    case StateOp::kMapPut:
    case StateOp::kMapErase:
    case StateOp::kMapContains:
    case StateOp::kVecGet:
    case StateOp::kVecSet:
    case StateOp::kVecPush:
    case StateOp::kQueuePush:
      break;
    default:
      return f;
  }
  auto routed = RoutingHint(op, args);
  if (!routed.ok()) return f;  // the slow path explains what is wrong
  const uint64_t hint = *routed;
  std::shared_ptr<const pv1::Layout> layout;
  {
    absl::MutexLock l(&layouts_mu_);
    auto it = layouts_.find(LayoutKey(ns, name));
    if (it == layouts_.end()) return f;
    layout = it->second;
  }
  if (layout->kind() != ProtoKind(kind)) return f;
  const pv1::ShardLocation* loc = Covering(*layout, hint);
  if (loc == nullptr || loc->state() == pv1::SHARD_LOST) return f;
  std::string frame = ShardRequest(loc->id(), hint, op, args);
  if (loc->data_address() != self_) {
    f.path = Path::kForward;
    f.peer = loc->data_address();
    f.frame = std::move(frame);
    return f;
  }
  bool would_block = false;
  std::string reply = shards_.HandleShardOp(
      wire::Reader(std::string_view(frame).substr(1)), &would_block);
  if (would_block || !IsFinal(reply)) return f;
  f.path = Path::kReply;
  f.reply = std::move(reply);
  return f;
}

// Each shard says which range it answered for; a layout gone stale (a split
// or merge since it was cached) shows as a range counted twice or not at
// all, and the sum starts over on a fresh layout.
std::string ShardRouter::SumOverShards(const std::string& ns,
                                       const std::string& name, StateKind kind,
                                       StateOp op) {
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    auto layout = GetLayout(ns, name, kind, attempt > 0);
    if (!layout.ok())
      return Error(CodeOf(layout.status()), layout.status().message());
    std::vector<uint64_t> los;
    for (const auto& s : (*layout)->shards()) los.push_back(s.lo());
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> seen;  // lo -> hi, n
    bool stale = false;
    for (uint64_t lo : los) {
      std::string reply = Route(ns, name, kind, lo, op, {});
      if (reply[0] != 0) return reply;
      wire::Reader r(std::string_view(reply).substr(1));
      uint64_t n, id, slo, shi;
      if (!r.U64(&n) || !r.U64(&id) || !r.U64(&slo) || !r.U64(&shi))
        return Error(StateCode::kInternal, "bad shard reply");
      if (slo != lo) stale = true;  // answered by a merged or split shard
      seen[slo] = {shi, n};
    }
    // The answers must tile [0, open end) exactly.
    uint64_t at = 0, total = 0;
    for (auto& [lo, hi_n] : seen) {
      if (lo != at) stale = true;
      at = hi_n.first;
      total += hi_n.second;
    }
    if (at != kOpenEnd) stale = true;
    if (stale) continue;
    std::string out(1, '\0');
    wire::Writer(&out).U64(total);
    return out;
  }
  return Error(StateCode::kUnavailable,
               absl::StrCat("state \"", name,
                            "\": its shards kept splitting or moving"));
}

std::string ShardRouter::HandleInstance(const std::string& ns,
                                        const std::string& function,
                                        std::string_view req) {
  t_function = function;
  wire::Reader r(req);
  StateOp op;
  StateKind kind;
  std::string_view name_view;
  if (!wire::ReadRequestHeader(&r, &op, &kind, &name_view))
    return Error(StateCode::kInvalid, "malformed state request");
  const std::string name(name_view);
  if (!wire::ValidStructureName(name))
    return Error(StateCode::kInvalid,
                 absl::StrCat("invalid state name \"", name,
                              "\": use 1-63 characters of [a-z0-9._-], "
                              "starting with a letter or digit"));
  if (kind != StateKind::kMap && kind != StateKind::kVector &&
      kind != StateKind::kQueue)
    return Error(StateCode::kInvalid, "unknown structure kind");
  std::string_view args = r.rest();
  switch (op) {
    case StateOp::kOpen: {
      uint32_t shards;
      uint64_t max_bytes;
      if (!r.U32(&shards) || !r.U64(&max_bytes))
        return Error(StateCode::kInvalid, "malformed open request");
      if (!resolve_) return Error(StateCode::kUnavailable, "no directory");
      auto layout = resolve_(ns, name, ProtoKind(kind), shards, max_bytes, true,
                             t_function);
      if (!layout.ok())
        return Error(CodeOf(layout.status()), layout.status().message());
      auto shared = std::make_shared<const pv1::Layout>(*std::move(layout));
      absl::MutexLock l(&layouts_mu_);
      layouts_[LayoutKey(ns, name)] = shared;
      return Reply(StateCode::kOk);
    }
    case StateOp::kMapGet:
    case StateOp::kMapPut:
    case StateOp::kMapErase:
    case StateOp::kMapContains:
    case StateOp::kVecPush:
    case StateOp::kVecSize:
    case StateOp::kVecExtend:
    case StateOp::kVecGet:
    case StateOp::kVecSet:
    case StateOp::kQueuePush:
    case StateOp::kQueuePop: {
      auto hint = RoutingHint(op, args);
      if (!hint.ok())
        return Error(CodeOf(hint.status()), hint.status().message());
      return Route(ns, name, kind, *hint, op, args);
    }
    case StateOp::kMapSize:
    case StateOp::kQueueSize:
      return SumOverShards(ns, name, kind, op);
    case StateOp::kMapMultiGet:
    case StateOp::kMapMultiPut:
      return MultiOp(ns, name, op, args);
    case StateOp::kVecRange:
      return RangeOp(ns, name, args);
    case StateOp::kMapScan:
      return ScanOp(ns, name, args);
    case StateOp::kVecSetRange:
      return SetRangeOp(ns, name, args);
    case StateOp::kShareMap:  // the loop serves these itself
    case StateOp::kShareRing:
    case StateOp::kJobStart:  // the executor serves these
    case StateOp::kJobWait:
    case StateOp::kGpu:
      break;
  }
  return Error(StateCode::kInvalid,
               absl::StrCat("unknown operation ", static_cast<int>(op)));
}

std::string ShardRouter::MultiOp(const std::string& ns, const std::string& name,
                                 StateOp op, std::string_view args) {
  bool put = op == StateOp::kMapMultiPut;
  wire::Reader r(args);
  uint32_t n;
  if (!r.U32(&n)) return Error(StateCode::kInvalid, "missing count");
  if (n > args.size() / 4)  // each key takes at least its length prefix
    return Error(StateCode::kInvalid, "malformed multi request");
  struct Item {
    std::string_view key, value;
    uint64_t hash;
  };
  std::vector<Item> items(n);
  for (auto& it : items) {
    if (!r.Str(&it.key) || (put && !r.Str(&it.value)))
      return Error(StateCode::kInvalid, "malformed multi request");
    it.hash = proclets::KeyHash(it.key);
  }
  std::vector<std::string> values(n);
  std::vector<uint8_t> found(n, 0);
  std::vector<size_t> todo(n);
  for (size_t i = 0; i < n; ++i) todo[i] = i;
  for (int attempt = 0; !todo.empty(); ++attempt) {
    if (attempt == kMaxAttempts)
      return Error(StateCode::kUnavailable,
                   absl::StrCat("state \"", name,
                                "\": its shards kept splitting or moving"));
    auto layout = GetLayout(ns, name, StateKind::kMap, attempt > 0);
    if (!layout.ok())
      return Error(CodeOf(layout.status()), layout.status().message());
    // Group by the shard (its lo) that the layout says holds each key.
    std::map<uint64_t, std::vector<size_t>> groups;
    for (size_t i : todo) {
      const pv1::ShardLocation* loc = Covering(**layout, items[i].hash);
      groups[loc ? loc->lo() : items[i].hash].push_back(i);
    }
    todo.clear();
    for (auto& [lo, idx] : groups) {
      std::string sub;
      wire::Writer w(&sub);
      w.U32(static_cast<uint32_t>(idx.size()));
      for (size_t i : idx) {
        w.Str(items[i].key);
        if (put) w.Str(items[i].value);
      }
      std::string reply =
          Route(ns, name, StateKind::kMap, items[idx[0]].hash, op, sub);
      if (reply[0] != 0) return reply;
      wire::Reader rr(std::string_view(reply).substr(1));
      uint32_t m;
      if (!rr.U32(&m)) return Error(StateCode::kInternal, "bad shard reply");
      if (put) {  // the indexes (into idx) that belong elsewhere
        for (uint32_t k = 0; k < m; ++k) {
          uint32_t at;
          if (!rr.U32(&at) || at >= idx.size())
            return Error(StateCode::kInternal, "bad shard reply");
          todo.push_back(idx[at]);
        }
        continue;
      }
      if (m != idx.size())
        return Error(StateCode::kInternal, "bad shard reply");
      for (size_t i : idx) {
        uint8_t st;
        std::string_view v;
        if (!rr.U8(&st) || !rr.Str(&v))
          return Error(StateCode::kInternal, "bad shard reply");
        if (st == kNotHere) {
          todo.push_back(i);
          continue;
        }
        found[i] = st;
        values[i] = std::string(v);
      }
    }
  }
  std::string out(1, '\0');
  if (put) return out;
  wire::Writer w(&out);
  w.U32(n);
  for (uint32_t i = 0; i < n; ++i) {
    w.U8(found[i]);
    w.Str(values[i]);
  }
  return out;
}

std::string ShardRouter::RangeOp(const std::string& ns, const std::string& name,
                                 std::string_view args) {
  wire::Reader r(args);
  uint64_t first, n;
  if (!r.U64(&first) || !r.U64(&n))
    return Error(StateCode::kInvalid, "malformed range request");
  n = std::min<uint64_t>(n, 1 << 20);
  std::vector<std::string> vals;
  uint64_t at = first;
  while (vals.size() < n) {
    std::string sub;
    wire::Writer w(&sub);
    w.U64(at);
    w.U64(n - vals.size());
    std::string reply =
        Route(ns, name, StateKind::kVector, at, StateOp::kVecRange, sub);
    if (reply[0] != 0) return reply;
    wire::Reader rr(std::string_view(reply).substr(1));
    uint32_t m;
    if (!rr.U32(&m)) return Error(StateCode::kInternal, "bad shard reply");
    for (uint32_t i = 0; i < m; ++i) {
      std::string_view v;
      if (!rr.Str(&v)) return Error(StateCode::kInternal, "bad shard reply");
      vals.emplace_back(v);
    }
    if (m == 0) break;  // past the end
    at += m;
  }
  std::string out(1, '\0');
  wire::Writer w(&out);
  w.U32(static_cast<uint32_t>(vals.size()));
  for (auto& v : vals) w.Str(v);
  return out;
}

std::string ShardRouter::ScanOp(const std::string& ns, const std::string& name,
                                std::string_view args) {
  wire::Reader r(args);
  uint64_t lo, hi, from, to;
  uint32_t max_bytes;
  if (!r.U64(&lo) || !r.U64(&hi) || !r.U64(&from) || !r.U64(&to) ||
      !r.U32(&max_bytes) || (hi <= lo && hi != kOpenEnd) || from > to ||
      to > wire::kScanEnd)
    return Error(StateCode::kInvalid,
                 "malformed scan request (hash range [lo, hi), positions "
                 "[from, to) within [0, 2^32))");
  struct Entry {
    uint32_t position;
    std::string_view key, value;
  };
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    auto layout = GetLayout(ns, name, StateKind::kMap, attempt > 0);
    if (!layout.ok())
      return Error(CodeOf(layout.status()), layout.status().message());
    if ((*layout)->kind() != pv1::KIND_MAP)
      return Error(StateCode::kWrongKind,
                   absl::StrCat("state \"", name, "\" is a ",
                                KindName((*layout)->kind()), ", not a map"));
    std::vector<std::pair<uint64_t, uint64_t>> parts;  // [lo, hi) per shard
    for (const auto& s : (*layout)->shards()) {
      uint64_t plo = std::max(lo, s.lo()), phi = std::min(hi, s.hi());
      if (plo < phi || phi == kOpenEnd) parts.emplace_back(plo, phi);
    }
    std::sort(parts.begin(), parts.end());
    // Positions are spread evenly over the shards: each brings its share of
    // the batch, and they all stop near the same position.
    const uint32_t per = std::max<uint32_t>(
        16 << 10, max_bytes / std::max<size_t>(1, parts.size()));
    std::vector<std::string> replies;
    replies.reserve(parts.size());  // the entries point into them
    std::vector<Entry> entries;
    uint64_t cut = to;
    bool stale = false;
    for (const auto& [plo, phi] : parts) {
      std::string sub;
      wire::Writer w(&sub);
      w.U64(plo);
      w.U64(phi);
      w.U64(from);
      w.U64(cut);
      w.U32(per);
      replies.push_back(
          Route(ns, name, StateKind::kMap, plo, StateOp::kMapScan, sub));
      const std::string& reply = replies.back();
      if (reply[0] != 0) return reply;
      wire::Reader rr(std::string_view(reply).substr(1));
      uint64_t next, slo, shi;
      uint32_t n;
      if (!rr.U64(&next) || !rr.U64(&slo) || !rr.U64(&shi) || !rr.U32(&n))
        return Error(StateCode::kInternal, "bad shard reply");
      if (slo > plo || (shi != kOpenEnd && (phi == kOpenEnd || shi < phi))) {
        stale = true;  // the shard split since the layout was cached
        break;
      }
      for (uint32_t i = 0; i < n; ++i) {
        Entry e;
        if (!rr.U32(&e.position) || !rr.Str(&e.key) || !rr.Str(&e.value))
          return Error(StateCode::kInternal, "bad shard reply");
        entries.push_back(e);
      }
      cut = std::min(cut, next);
    }
    if (stale) continue;
    std::stable_sort(
        entries.begin(), entries.end(),
        [](const Entry& a, const Entry& b) { return a.position < b.position; });
    std::string out(1, '\0');
    wire::Writer w(&out);
    w.U64(cut);
    size_t n = 0;
    while (n < entries.size() && entries[n].position < cut) ++n;
    w.U32(static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; ++i) {
      w.U32(entries[i].position);
      w.Str(entries[i].key);
      w.Str(entries[i].value);
    }
    return out;
  }
  return Error(StateCode::kUnavailable,
               absl::StrCat("state \"", name,
                            "\": its shards kept splitting or moving"));
}

std::string ShardRouter::SetRangeOp(const std::string& ns,
                                    const std::string& name,
                                    std::string_view args) {
  wire::Reader r(args);
  uint64_t first;
  uint32_t n;
  if (!r.U64(&first) || !r.U32(&n) || n > args.size() / 4)
    return Error(StateCode::kInvalid, "malformed set-range request");
  std::vector<std::string_view> vals(n);
  for (auto& v : vals)
    if (!r.Str(&v))
      return Error(StateCode::kInvalid, "malformed set-range request");
  // Each shard sets the values that fall in its range and says how many.
  for (uint32_t done = 0; done < n;) {
    std::string sub;
    wire::Writer w(&sub);
    w.U64(first + done);
    w.U32(n - done);
    for (uint32_t i = done; i < n; ++i) w.Str(vals[i]);
    std::string reply = Route(ns, name, StateKind::kVector, first + done,
                              StateOp::kVecSetRange, sub);
    if (reply[0] != 0) return reply;
    wire::Reader rr(std::string_view(reply).substr(1));
    uint32_t m;
    if (!rr.U32(&m)) return Error(StateCode::kInternal, "bad shard reply");
    if (m == 0)
      return Error(StateCode::kNotFound,
                   absl::StrCat("index ", first + done, " is past the end"));
    done += m;
  }
  return Reply(StateCode::kOk);
}

}  // namespace silt::invoker
