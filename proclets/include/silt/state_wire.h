// The wire format of state operations (sharded maps, vectors, queues), shared
// by the function SDK (silt/function.h), silt-worker and the invoker's proclet
// host. Header-only and dependency-free: bundles compile it.
//
// A request, as a function's SDK builds it (the worker adds a u32 length
// prefix on the way to its invoker):
//   u8 op, u8 kind, u16 name length, name bytes, then the op's arguments.
// A reply: u8 code (StateCode), then the op's results, or on an error the
// message (the rest of the reply). Integers are little-endian; a "str" is a
// u32 length and its bytes.
#ifndef SILT_STATE_WIRE_H_
#define SILT_STATE_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace silt::wire {

enum class StateOp : uint8_t {
  kOpen = 1,  // u32 initial_shards, u64 max_shard_bytes (0 = defaults)
  // silt-worker -> its invoker: the arenas of the map's shards held on this
  // node, to read them in place (their memory files ride along with the
  // kOk reply as SCM_RIGHTS; proclets/shared_map.h reads them).
  kShareMap = 2,
  // silt-worker -> its invoker: a shared-memory mailbox for requests and
  // replies (invoker/src/state_ring.h); its memory file and doorbell eventfd
  // ride along with the kOk reply.
  kShareRing = 3,
  kMapGet = 10,       // str key -> str value | kNotFound
  kMapPut = 11,       // str key, str value
  kMapErase = 12,     // str key -> u8 existed
  kMapContains = 13,  // str key -> u8
  kMapSize = 14,      // -> u64
  kMapMultiGet = 15,  // u32 n, n x str -> u32 n, n x (u8 found, str)
  kMapMultiPut = 16,  // u32 n, n x (str, str)
  // The entries whose key hash lies in [lo, hi) (hi = kOpenEnd: no upper
  // end) and whose scan position (the key hash's low 32 bits reversed) lies
  // in [from, to), to = at most kScanEnd, in position order, about max_bytes
  // of them: u64 lo, u64 hi, u64 from, u64 to, u32 max_bytes -> u64 next
  // (where to go on from; `to` when the range is done), u32 n, n x (u32
  // position, str key, str value). A shard answers for its part of [lo, hi)
  // and adds u64 lo, u64 hi of its own range after `next`.
  kMapScan = 17,
  kVecPush = 20,   // str -> u64 index
  kVecGet = 21,    // u64 index -> str
  kVecSet = 22,    // u64 index, str
  kVecSize = 23,   // -> u64
  kVecRange = 24,  // u64 first, u64 n -> u32 n, n x str
  // u64 first, u32 n, n x str -> u32 set (a shard: how many of them fall in
  // its range; the instance's invoker: all n, or an error)
  kVecSetRange = 25,
  kVecExtend = 26,  // u64 n: grows to at least n elements (empty) -> u64 size
  kQueuePush = 30,  // str
  kQueuePop = 31,   // u32 timeout_ms -> str | kTimeout
  kQueueSize = 32,  // -> u64
  // Compute jobs (silt/function.h: ParallelFor, Map, Spawn), served by the
  // instance's invoker, which splits them into compute proclets run by
  // instances of the same function on nodes with free CPU. The header names
  // the input structure and its kind (a vector or a map; empty for a
  // spawn).
  // u8 JobKind, str task, str output, u64 first, u64 count (kAll: to the
  // end), str argument, u8 flags (JobFlags) -> u64 job id
  kJobStart = 40,
  // u64 job id, u32 timeout_ms (0: no wait) -> str result, u32 n, n x (str
  // node, u64 elements, u32 shares), u32 m, m x (u64 unix_us, u64 done) |
  // kRetry while it runs | the job's error (its id is then forgotten)
  kJobWait = 41,
  // A GPU proclet's operation (silt/gpu.h builds them, silt/gpu_wire.h is
  // their format): the header names the proclet (kind kGpu), then u8 GpuOp
  // and its arguments. Served by the instance's invoker.
  kGpu = 50,
};

enum class JobKind : uint8_t {
  kParallelFor = 1,  // fn(ctx, index, element) for each element
  kMap = 2,          // output[i] = fn(input[i])
  kSpawn = 3,        // result = fn(ctx, argument), once
};

enum JobFlags : uint8_t {
  // Elements may run again if a node is lost mid-chunk (a Map always may:
  // its output is written by the runtime).
  kJobIdempotent = 1,
};

// A job's count meaning "to the end of the input".
inline constexpr uint64_t kAll = ~uint64_t{0};
// The end of a map's key hash space (an open upper end) and of its scan
// positions.
inline constexpr uint64_t kOpenEnd = ~uint64_t{0};
inline constexpr uint64_t kScanEnd = uint64_t{1} << 32;

enum class StateKind : uint8_t { kMap = 1, kVector = 2, kQueue = 3, kGpu = 4 };

enum class StateCode : uint8_t {
  kOk = 0,
  kNotFound = 1,     // no such key / index out of range
  kInvalid = 2,      // bad name, bad request
  kWrongKind = 3,    // the structure exists with another kind
  kTooLarge = 4,     // key or value over the limit
  kUnavailable = 5,  // the state service or a node cannot be reached
  kTimeout = 6,      // queue pop timed out
  kLost = 7,         // the node holding the shard died without draining it
  kInternal = 8,
  kMoved = 9,  // peers only: the shard moved (str address, u64 epoch)
  // peers: the shard is frozen for a moment, or a task did not run there;
  // kJobWait: the job still runs
  kRetry = 10,
  // GPU proclets: it moved or was resized since the caller last looked (or
  // is asked to shrink); the op did not run. The body is its kInfo reply.
  kReconfigured = 11,
};

inline const char* StateCodeName(StateCode c) {
  switch (c) {
    case StateCode::kOk:
      return "ok";
    case StateCode::kNotFound:
      return "not found";
    case StateCode::kInvalid:
      return "invalid";
    case StateCode::kWrongKind:
      return "wrong kind";
    case StateCode::kTooLarge:
      return "too large";
    case StateCode::kUnavailable:
      return "unavailable";
    case StateCode::kTimeout:
      return "timeout";
    case StateCode::kLost:
      return "lost";
    case StateCode::kInternal:
      return "internal";
    case StateCode::kMoved:
      return "moved";
    case StateCode::kRetry:
      return "retry";
    case StateCode::kReconfigured:
      return "reconfigured";
  }
  return "unknown";
}

// Largest request or reply frame.
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;

// Appends little-endian values and strings to a buffer.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_->append(s.data(), s.size());
  }
  void Bytes(std::string_view s) { out_->append(s.data(), s.size()); }

 private:
  void Raw(const void* p, size_t n) {  // x86-64 and aarch64 are little-endian
    out_->append(static_cast<const char*>(p), n);
  }
  std::string* out_;
};

// Reads what Writer wrote; every read fails (returns false) past the end.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U16(uint16_t* v) { return Raw(v, 2); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool Str(std::string_view* s) {
    uint32_t n;
    if (!U32(&n) || n > in_.size()) return false;
    *s = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  std::string_view rest() const { return in_; }
  bool done() const { return in_.empty(); }

 private:
  bool Raw(void* p, size_t n) {
    if (in_.size() < n) return false;
    memcpy(p, in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  std::string_view in_;
};

// The request header.
inline void WriteRequestHeader(std::string* out, StateOp op, StateKind kind,
                               std::string_view name) {
  Writer w(out);
  w.U8(static_cast<uint8_t>(op));
  w.U8(static_cast<uint8_t>(kind));
  w.U16(static_cast<uint16_t>(name.size()));
  w.Bytes(name);
}

inline bool ReadRequestHeader(Reader* r, StateOp* op, StateKind* kind,
                              std::string_view* name) {
  uint8_t o, k;
  uint16_t n;
  if (!r->U8(&o) || !r->U8(&k) || !r->U16(&n)) return false;
  std::string_view rest = r->rest();
  if (rest.size() < n) return false;
  *name = rest.substr(0, n);
  *r = Reader(rest.substr(n));
  *op = static_cast<StateOp>(o);
  *kind = static_cast<StateKind>(k);
  return true;
}

// One compute proclet's share of a job, as the invoker hands it to an
// instance (silt_task): elements [first, first + count) of `input` for a
// ParallelFor or Map over a vector; for one over a map, the entries of its
// shard [lo, hi) (kMapScan's hash range) at scan positions [first, first +
// count); or the argument of a Spawn. Views into the buffer read.
struct TaskCall {
  JobKind kind = JobKind::kSpawn;
  std::string_view task, input, output, argument;
  uint64_t first = 0, count = 0;
  // ParallelFor and Map: stop after this many microseconds of wall time (at
  // least one element) and report how far the share got; the executor hands
  // out the rest. A share on a node that slowed down (its CPU taken) so
  // gives the rest back within one budget. 0: no limit.
  uint64_t budget_us = 0;
  StateKind input_kind = StateKind::kVector;
  uint64_t lo = 0, hi = 0;
};

inline void WriteTaskCall(std::string* out, const TaskCall& t) {
  Writer w(out);
  w.U8(static_cast<uint8_t>(t.kind));
  w.Str(t.task);
  w.Str(t.input);
  w.Str(t.output);
  w.U64(t.first);
  w.U64(t.count);
  w.Str(t.argument);
  w.U64(t.budget_us);  // from here on: readers of older bundles stop before
  w.U8(static_cast<uint8_t>(t.input_kind));
  w.U64(t.lo);
  w.U64(t.hi);
}

inline bool ReadTaskCall(std::string_view in, TaskCall* t) {
  Reader r(in);
  uint8_t kind;
  if (!r.U8(&kind) || !r.Str(&t->task) || !r.Str(&t->input) ||
      !r.Str(&t->output) || !r.U64(&t->first) || !r.U64(&t->count) ||
      !r.Str(&t->argument))
    return false;
  if (!r.U64(&t->budget_us)) t->budget_us = 0;  // from an older invoker
  uint8_t input_kind = static_cast<uint8_t>(StateKind::kVector);
  if (r.U8(&input_kind) && (!r.U64(&t->lo) || !r.U64(&t->hi))) return false;
  t->input_kind = static_cast<StateKind>(input_kind);
  if (t->input_kind != StateKind::kMap && t->input_kind != StateKind::kVector)
    return false;
  t->kind = static_cast<JobKind>(kind);
  return t->kind == JobKind::kParallelFor || t->kind == JobKind::kMap ||
         t->kind == JobKind::kSpawn;
}

// Structure names: 1-63 characters of [a-z0-9._-], starting with a letter or
// digit (they appear in URLs and metrics).
inline bool ValidStructureName(std::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              (i > 0 && (c == '-' || c == '_' || c == '.'));
    if (!ok) return false;
  }
  return true;
}

}  // namespace silt::wire

#endif  // SILT_STATE_WIRE_H_
