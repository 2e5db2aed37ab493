#include "hosted_shard.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace silt::invoker {

using proclets::MapShard;
using proclets::QueueShard;
using proclets::VectorShard;
using wire::StateCode;
using wire::StateKind;
using wire::StateOp;

std::string Reply(StateCode code, std::string_view payload) {
  std::string r;
  r.reserve(1 + payload.size());
  r.push_back(static_cast<char>(code));
  r.append(payload);
  return r;
}

std::string Error(StateCode code, absl::string_view message) {
  return Reply(code, std::string_view(message.data(), message.size()));
}

StateCode CodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
      return StateCode::kNotFound;
    case absl::StatusCode::kResourceExhausted:
      return StateCode::kTooLarge;
    case absl::StatusCode::kInvalidArgument:
      return StateCode::kInvalid;
    case absl::StatusCode::kFailedPrecondition:
      return StateCode::kWrongKind;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return StateCode::kUnavailable;
    default:
      return StateCode::kInternal;
  }
}

pv1::Kind ProtoKind(StateKind k) { return static_cast<pv1::Kind>(k); }

std::string KindName(pv1::Kind k) {
  return std::string(
      proclets::ShardKindName(static_cast<proclets::ShardKind>(k)));
}

bool IsWrite(StateOp op) {
  switch (op) {
    case StateOp::kMapPut:
    case StateOp::kMapErase:
    case StateOp::kMapMultiPut:
    case StateOp::kVecPush:
    case StateOp::kVecSet:
    case StateOp::kVecSetRange:
    case StateOp::kVecExtend:
    case StateOp::kQueuePush:
    case StateOp::kQueuePop:
      return true;
    default:
      return false;
  }
}

bool Covers(const pv1::ShardInfo& info, uint64_t hint) {
  return hint >= info.lo() && (hint < info.hi() || info.hi() == kOpenEnd);
}

std::string MovedReply(const std::string& to, uint64_t epoch) {
  std::string p;
  wire::Writer w(&p);
  w.Str(to);
  w.U64(epoch);
  return Reply(StateCode::kMoved, p);
}

std::string Execute(HostedShard& s, StateOp op, wire::Reader& r) {
  std::string out;
  wire::Writer w(&out);
  auto bad = [] {
    return Error(StateCode::kInvalid, "malformed request arguments");
  };
  // A map's or queue's size: the count, then who answered (id, lo, hi).
  auto size_reply = [&](uint64_t count) {
    out.push_back(0);
    w.U64(count);
    w.U64(s.info.id());
    w.U64(s.info.lo());
    w.U64(s.info.hi());
    return out;
  };
  if (s.map) {
    MapShard& m = *s.map;
    switch (op) {
      case StateOp::kMapGet: {
        std::string_view k;
        if (!r.Str(&k)) return bad();
        auto v = m.Get(k);
        if (!v.ok()) return Error(StateCode::kNotFound, "no such key");
        out.push_back(0);
        w.Str(*v);
        return out;
      }
      case StateOp::kMapPut: {
        std::string_view k, v;
        if (!r.Str(&k) || !r.Str(&v)) return bad();
        if (auto st = m.Put(k, v); !st.ok())
          return Error(CodeOf(st), st.message());
        return Reply(StateCode::kOk);
      }
      case StateOp::kMapErase:
      case StateOp::kMapContains: {
        std::string_view k;
        if (!r.Str(&k)) return bad();
        bool had = op == StateOp::kMapErase ? m.Erase(k) : m.Contains(k);
        out.push_back(0);
        w.U8(had ? 1 : 0);
        return out;
      }
      case StateOp::kMapSize:
        return size_reply(m.count());
      // Keys this shard does not cover (it split since the caller's
      // layout was cached) come back marked, for the caller to re-route.
      case StateOp::kMapMultiGet: {
        uint32_t n;
        if (!r.U32(&n)) return bad();
        out.push_back(0);
        w.U32(n);
        for (uint32_t i = 0; i < n; ++i) {
          std::string_view k;
          if (!r.Str(&k)) return bad();
          if (!Covers(s.info, proclets::KeyHash(k))) {
            w.U8(kNotHere);
            w.Str({});
            continue;
          }
          auto v = m.Get(k);
          w.U8(v.ok() ? 1 : 0);
          w.Str(v.ok() ? *v : std::string_view());
        }
        return out;
      }
      case StateOp::kMapMultiPut: {  // -> u32 n, n indexes not put here
        uint32_t n;
        if (!r.U32(&n)) return bad();
        std::vector<uint32_t> elsewhere;
        for (uint32_t i = 0; i < n; ++i) {
          std::string_view k, v;
          if (!r.Str(&k) || !r.Str(&v)) return bad();
          if (!Covers(s.info, proclets::KeyHash(k))) {
            elsewhere.push_back(i);
            continue;
          }
          if (auto st = m.Put(k, v); !st.ok())
            return Error(CodeOf(st), st.message());
        }
        out.push_back(0);
        w.U32(static_cast<uint32_t>(elsewhere.size()));
        for (uint32_t i : elsewhere) w.U32(i);
        return out;
      }
      case StateOp::kMapScan: {  // its part of [lo, hi): the router joins
        uint64_t lo, hi, from, to;
        uint32_t max_bytes;
        if (!r.U64(&lo) || !r.U64(&hi) || !r.U64(&from) || !r.U64(&to) ||
            !r.U32(&max_bytes))
          return bad();
        lo = std::max(lo, s.info.lo());
        hi = std::min(hi, s.info.hi());  // kOpenEnd is the largest
        std::string entries;
        wire::Writer e(&entries);
        uint32_t n = 0;
        const uint64_t next =
            m.Scan(lo, hi, from, to, max_bytes,
                   [&](uint32_t pos, std::string_view k, std::string_view v) {
                     e.U32(pos);
                     e.Str(k);
                     e.Str(v);
                     ++n;
                   });
        out.push_back(0);
        w.U64(next);
        w.U64(s.info.lo());
        w.U64(s.info.hi());
        w.U32(n);
        out += entries;
        return out;
      }
      default:
        break;
    }
  } else if (s.vec) {
    VectorShard& v = *s.vec;
    switch (op) {
      case StateOp::kVecPush: {
        std::string_view val;
        if (!r.Str(&val)) return bad();
        auto i = v.PushBack(val);
        if (!i.ok()) return Error(CodeOf(i.status()), i.status().message());
        out.push_back(0);
        w.U64(*i);
        return out;
      }
      case StateOp::kVecGet: {
        uint64_t i;
        if (!r.U64(&i)) return bad();
        auto val = v.Get(i);
        if (!val.ok())
          return Error(StateCode::kNotFound,
                       absl::StrCat("index ", i, " is past the end"));
        out.push_back(0);
        w.Str(*val);
        return out;
      }
      case StateOp::kVecSet: {
        uint64_t i;
        std::string_view val;
        if (!r.U64(&i) || !r.Str(&val)) return bad();
        if (auto st = v.Set(i, val); !st.ok())
          return Error(CodeOf(st),
                       st.code() == absl::StatusCode::kOutOfRange
                           ? absl::StrCat("index ", i, " is past the end")
                           : std::string(st.message()));
        return Reply(StateCode::kOk);
      }
      case StateOp::kVecSize:  // the end of this shard's range
        out.push_back(0);
        w.U64(v.first() + v.count());
        return out;
      // The values whose indexes fall in this shard, from the first one on:
      // how many were set (the caller sends the rest to the next shard).
      case StateOp::kVecSetRange: {
        uint64_t first;
        uint32_t n;
        if (!r.U64(&first) || !r.U32(&n)) return bad();
        const uint64_t end = v.first() + v.count();
        if (first < v.first() || (first >= end && !(first == end && n == 0)))
          return Error(StateCode::kNotFound,
                       absl::StrCat("index ", first, " is past the end"));
        uint32_t set = 0;
        for (; set < n && first + set < end; ++set) {
          std::string_view val;
          if (!r.Str(&val)) return bad();
          if (auto st = v.Set(first + set, val); !st.ok())
            return Error(CodeOf(st), st.message());
        }
        out.push_back(0);
        w.U32(set);
        return out;
      }
      case StateOp::kVecExtend: {  // the last shard: grow to n
        uint64_t n;
        if (!r.U64(&n)) return bad();
        if (s.info.hi() != kOpenEnd)
          return Error(StateCode::kInternal, "extend sent to an inner shard");
        while (v.first() + v.count() < n) {
          auto i = v.PushBack({});
          if (!i.ok()) return Error(CodeOf(i.status()), i.status().message());
        }
        out.push_back(0);
        w.U64(v.first() + v.count());
        return out;
      }
      case StateOp::kVecRange: {
        uint64_t first, n;
        if (!r.U64(&first) || !r.U64(&n)) return bad();
        auto vals = v.Range(first, n);
        out.push_back(0);
        if (!vals.ok()) {
          w.U32(0);
          return out;
        }
        w.U32(static_cast<uint32_t>(vals->size()));
        for (auto& x : *vals) w.Str(x);
        return out;
      }
      default:
        break;
    }
  } else if (s.queue) {
    QueueShard& q = *s.queue;
    switch (op) {
      case StateOp::kQueuePush: {
        std::string_view val;
        if (!r.Str(&val)) return bad();
        if (auto st = q.Push(val); !st.ok())
          return Error(CodeOf(st), st.message());
        return Reply(StateCode::kOk);
      }
      case StateOp::kQueuePop: {
        uint32_t timeout_ms;
        if (!r.U32(&timeout_ms)) return bad();
        auto deadline = absl::Now() + absl::Milliseconds(timeout_ms);
        HostedShard* sp = &s;
        // Waiting releases the lock: the shard may be dropped or moved
        // meanwhile (its queue freed), so check that before the queue.
        while (!s.gone && !s.frozen && !s.closing && s.queue->count() == 0) {
          if (!s.mu.AwaitWithDeadline(
                  absl::Condition(
                      +[](HostedShard* h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                        return h->gone || h->frozen || h->closing ||
                               (h->queue && h->queue->count() > 0);
                      },
                      sp),
                  deadline))
            break;
        }
        if (s.gone || s.frozen || !s.queue)  // moving: the caller retries
          return MovedReply(s.moved_to, s.moved_epoch);
        if (s.queue->count() == 0 && s.closing)
          return Error(StateCode::kUnavailable, "the node is stopping");
        auto v = s.queue->Pop();
        if (!v) return Error(StateCode::kTimeout, "the queue stayed empty");
        out.push_back(0);
        w.Str(*v);
        return out;
      }
      case StateOp::kQueueSize:
        return size_reply(q.count());
      default:
        break;
    }
  }
  return Error(StateCode::kInvalid,
               absl::StrCat("operation ", static_cast<int>(op),
                            " does not apply to a ", KindName(s.info.kind())));
}

}  // namespace silt::invoker
