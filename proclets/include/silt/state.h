// Function state: sharded maps, vectors and queues whose shards are memory
// proclets held by the invokers (placed where memory is free, moved live).
// Reached from a handler through its Context:
//
//   auto hits = ctx.Map<std::string, int64_t>("hits");
//   auto n = hits.Get("home");                  // silt::Result<int64_t>
//   if (n.ok()) hits.Put("home", *n + 1);
//   else if (n.code() == silt::StateCode::kNotFound) hits.Put("home", 1);
//
// A structure is named within the function's namespace, created on first use
// and shared by every instance of every function of that namespace that names
// it. It outlives instances (scale to zero, restores, updates);
// `silt state delete NAME` or deleting the namespace removes it.
//
// Values cross by value through Codec<T>: trivially copyable types and
// std::string are built in; specialise silt::Codec for your own types. Errors
// are values (Result::code()); nothing here throws or aborts.
#ifndef SILT_STATE_H_
#define SILT_STATE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "silt/abi.h"
#include "silt/state_wire.h"

namespace silt {

using StateCode = wire::StateCode;

// How a value of type T becomes bytes and back.
template <typename T, typename Enable = void>
struct Codec;

template <typename T>
struct Codec<T, std::enable_if_t<std::is_trivially_copyable_v<T>>> {
  static void Encode(const T& v, std::string* out) {
    out->append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static bool Decode(std::string_view in, T* v) {
    if (in.size() != sizeof(T)) return false;
    memcpy(static_cast<void*>(v), in.data(), sizeof(T));
    return true;
  }
};

template <>
struct Codec<std::string> {
  static void Encode(const std::string& v, std::string* out) { *out += v; }
  static bool Decode(std::string_view in, std::string* v) {
    v->assign(in.data(), in.size());
    return true;
  }
};

// The outcome of a state operation: a code, a message on errors, and the value
// when ok().
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: ok results
  Result(StateCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StateCode::kOk; }
  StateCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Only when ok().
  const T& operator*() const { return *value_; }
  const T* operator->() const { return &*value_; }
  T value_or(T other) const { return ok() ? *value_ : std::move(other); }

 private:
  StateCode code_ = StateCode::kOk;
  std::string message_;
  std::optional<T> value_;
};

// For operations without a value.
struct Done {};
using Status = Result<Done>;

struct StateOptions {
  uint32_t initial_shards = 0;   // 0: the gateway's default (1)
  uint64_t max_shard_bytes = 0;  // 0: the gateway's default (split size)
};

namespace internal {

inline void AppendTo(void* out, const char* data, size_t len) {
  static_cast<std::string*>(out)->append(data, len);
}

// One structure of one kind: builds requests, runs them, decodes replies.
class StructureHandle {
 public:
  StructureHandle(const silt_state_api* api, std::string name,
                  wire::StateKind kind, StateOptions options)
      : api_(api), name_(std::move(name)), kind_(kind), options_(options) {}

  const std::string& name() const { return name_; }

  std::string Begin(wire::StateOp op) const {
    std::string req;
    wire::WriteRequestHeader(&req, op, kind_, name_);
    return req;
  }

  // Runs `req`; on success *body holds the reply's results.
  StateCode Run(const std::string& req, std::string* body,
                std::string* message) {
    if (!opened_ && (options_.initial_shards || options_.max_shard_bytes)) {
      std::string open = Begin(wire::StateOp::kOpen);
      wire::Writer w(&open);
      w.U32(options_.initial_shards);
      w.U64(options_.max_shard_bytes);
      StateCode c = RunOnce(open, body, message);
      if (c != StateCode::kOk) return c;
    }
    opened_ = true;
    return RunOnce(req, body, message);
  }

 private:
  StateCode RunOnce(const std::string& req, std::string* body,
                    std::string* message) {
    std::string reply;
    if (api_ == nullptr ||
        api_->call(api_->host, req.data(), req.size(), &reply, AppendTo) != 0) {
      *message = "the state service is unreachable";
      return StateCode::kUnavailable;
    }
    if (reply.empty()) {
      *message = "empty reply from the state service";
      return StateCode::kInternal;
    }
    auto code = static_cast<StateCode>(static_cast<uint8_t>(reply[0]));
    if (code != StateCode::kOk) {
      message->assign(reply, 1);
      return code;
    }
    body->assign(reply, 1);
    return code;
  }

  const silt_state_api* api_;
  std::string name_;
  wire::StateKind kind_;
  StateOptions options_;
  bool opened_ = false;
};

template <typename T>
Result<T> Fail(StateCode c, std::string m) {
  return Result<T>(c, std::move(m));
}

template <typename T>
Result<T> DecodeOne(std::string_view bytes) {
  T v{};
  if (!Codec<T>::Decode(bytes, &v))
    return Fail<T>(StateCode::kInvalid,
                   "stored value does not decode as this type");
  return Result<T>(std::move(v));
}

inline Result<uint64_t> DecodeU64(const std::string& body) {
  wire::Reader r(body);
  uint64_t v;
  if (!r.U64(&v)) return Fail<uint64_t>(StateCode::kInternal, "bad reply");
  return Result<uint64_t>(v);
}

inline Result<bool> DecodeBool(const std::string& body) {
  wire::Reader r(body);
  uint8_t v;
  if (!r.U8(&v)) return Fail<bool>(StateCode::kInternal, "bad reply");
  return Result<bool>(v != 0);
}

// An operation without arguments whose answer is a count (the sizes).
inline Result<uint64_t> RunCount(StructureHandle& h, wire::StateOp op) {
  std::string req = h.Begin(op), body, msg;
  StateCode c = h.Run(req, &body, &msg);
  if (c != StateCode::kOk) return Fail<uint64_t>(c, msg);
  return DecodeU64(body);
}

template <typename T>
std::string Encoded(const T& v) {
  std::string s;
  Codec<T>::Encode(v, &s);
  return s;
}

// A kVecRange reply's values.
template <typename T>
Result<std::vector<T>> DecodeRange(const std::string& body) {
  using Out = std::vector<T>;
  wire::Reader r(body);
  uint32_t count;
  if (!r.U32(&count)) return Fail<Out>(StateCode::kInternal, "bad reply");
  Out out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    std::string_view v;
    T value{};
    if (!r.Str(&v)) return Fail<Out>(StateCode::kInternal, "bad reply");
    if (!Codec<T>::Decode(v, &value))
      return Fail<Out>(StateCode::kInvalid,
                       "stored value does not decode as this type (or was "
                       "never set)");
    out.push_back(std::move(value));
  }
  return Result<Out>(std::move(out));
}

template <typename T>
Result<std::vector<T>> FetchRange(StructureHandle& h, uint64_t first,
                                  uint64_t n, size_t* bytes = nullptr) {
  std::string req = h.Begin(wire::StateOp::kVecRange), body, msg;
  wire::Writer w(&req);
  w.U64(first);
  w.U64(n);
  StateCode c = h.Run(req, &body, &msg);
  if (c != StateCode::kOk) return Fail<std::vector<T>>(c, msg);
  if (bytes != nullptr) *bytes = body.size();
  return DecodeRange<T>(body);
}

// A kMapScan batch: raw entries in scan position order, and where the next
// batch starts.
struct MapBatch {
  std::vector<uint32_t> positions;
  std::vector<std::pair<std::string, std::string>> entries;  // encoded
  uint64_t next = 0;
};

inline Result<MapBatch> FetchMapBatch(StructureHandle& h, uint64_t lo,
                                      uint64_t hi, uint64_t from, uint64_t to,
                                      uint32_t max_bytes) {
  std::string req = h.Begin(wire::StateOp::kMapScan), body, msg;
  wire::Writer w(&req);
  w.U64(lo);
  w.U64(hi);
  w.U64(from);
  w.U64(to);
  w.U32(max_bytes);
  StateCode c = h.Run(req, &body, &msg);
  if (c != StateCode::kOk) return Fail<MapBatch>(c, msg);
  wire::Reader r(body);
  MapBatch b;
  uint32_t n;
  if (!r.U64(&b.next) || !r.U32(&n) || b.next < from || b.next > to)
    return Fail<MapBatch>(StateCode::kInternal, "bad reply");
  b.positions.reserve(n);
  b.entries.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t pos;
    std::string_view k, v;
    if (!r.U32(&pos) || !r.Str(&k) || !r.Str(&v))
      return Fail<MapBatch>(StateCode::kInternal, "bad reply");
    b.positions.push_back(pos);
    b.entries.emplace_back(k, v);
  }
  return Result<MapBatch>(std::move(b));
}

// Reads the entries of a map (those whose key hash lies in [lo, hi), at
// scan positions [from, to)) batch by batch; while the caller works on one
// batch the next one is already being fetched.
class MapBatches {
 public:
  static constexpr uint32_t kBatchBytes = 256 << 10;
  MapBatches(StructureHandle h, uint64_t lo, uint64_t hi, uint64_t from,
             uint64_t to)
      : h_(std::move(h)), lo_(lo), hi_(hi), at_(from), to_(to) {}
  MapBatches(const MapBatches&) = delete;  // its fetch in flight points at it
  MapBatches& operator=(const MapBatches&) = delete;

  // The next batch: no entries and next() == to at the end.
  Result<MapBatch> Next() {
    if (!ahead_.valid()) Prefetch();
    if (!ahead_.valid()) {
      MapBatch end;
      end.next = to_;
      return Result<MapBatch>(std::move(end));
    }
    Result<MapBatch> b = ahead_.get();
    if (b.ok()) {
      at_ = b->next;
      Prefetch();
    }
    return b;
  }

 private:
  void Prefetch() {
    if (at_ >= to_) return;
    ahead_ = std::async(std::launch::async, [this, from = at_] {
      return FetchMapBatch(h_, lo_, hi_, from, to_, kBatchBytes);
    });
  }
  StructureHandle h_;  // used by one fetch at a time
  uint64_t lo_, hi_, at_, to_;
  std::future<Result<MapBatch>> ahead_;
};

}  // namespace internal

// A sharded hash map K -> V.
template <typename K, typename V>
class Map {
 public:
  Map(const silt_state_api* api, std::string name, StateOptions o = {})
      : h_(api, std::move(name), wire::StateKind::kMap, o) {}

  Result<V> Get(const K& key) {
    std::string req = h_.Begin(wire::StateOp::kMapGet), body, msg;
    wire::Writer(&req).Str(internal::Encoded(key));
    StateCode c = h_.Run(req, &body, &msg);
    if (c != StateCode::kOk) return internal::Fail<V>(c, msg);
    wire::Reader r(body);
    std::string_view v;
    if (!r.Str(&v)) return internal::Fail<V>(StateCode::kInternal, "bad reply");
    return internal::DecodeOne<V>(v);
  }
  Status Put(const K& key, const V& value) {
    std::string req = h_.Begin(wire::StateOp::kMapPut), body, msg;
    wire::Writer w(&req);
    w.Str(internal::Encoded(key));
    w.Str(internal::Encoded(value));
    StateCode c = h_.Run(req, &body, &msg);
    return c == StateCode::kOk ? Status(Done{}) : Status(c, msg);
  }
  // True when the key was there.
  Result<bool> Erase(const K& key) {
    return KeyOp(wire::StateOp::kMapErase, key);
  }
  Result<bool> Contains(const K& key) {
    return KeyOp(wire::StateOp::kMapContains, key);
  }
  Result<uint64_t> Size() {
    return internal::RunCount(h_, wire::StateOp::kMapSize);
  }
  // One value per key (nullopt where absent), in one round trip per shard.
  Result<std::vector<std::optional<V>>> MultiGet(const std::vector<K>& keys) {
    using Out = std::vector<std::optional<V>>;
    std::string req = h_.Begin(wire::StateOp::kMapMultiGet), body, msg;
    wire::Writer w(&req);
    w.U32(static_cast<uint32_t>(keys.size()));
    for (const K& k : keys) w.Str(internal::Encoded(k));
    StateCode c = h_.Run(req, &body, &msg);
    if (c != StateCode::kOk) return internal::Fail<Out>(c, msg);
    wire::Reader r(body);
    uint32_t n;
    if (!r.U32(&n) || n != keys.size())
      return internal::Fail<Out>(StateCode::kInternal, "bad reply");
    Out out(n);
    for (uint32_t i = 0; i < n; ++i) {
      uint8_t found;
      std::string_view v;
      if (!r.U8(&found) || !r.Str(&v))
        return internal::Fail<Out>(StateCode::kInternal, "bad reply");
      if (!found) continue;
      V value{};
      if (!Codec<V>::Decode(v, &value))
        return internal::Fail<Out>(StateCode::kInvalid,
                                   "stored value does not decode as this type");
      out[i] = std::move(value);
    }
    return Result<Out>(std::move(out));
  }
  Status MultiPut(const std::vector<std::pair<K, V>>& entries) {
    std::string req = h_.Begin(wire::StateOp::kMapMultiPut), body, msg;
    wire::Writer w(&req);
    w.U32(static_cast<uint32_t>(entries.size()));
    for (const auto& [k, v] : entries) {
      w.Str(internal::Encoded(k));
      w.Str(internal::Encoded(v));
    }
    StateCode c = h_.Run(req, &body, &msg);
    return c == StateCode::kOk ? Status(Done{}) : Status(c, msg);
  }

  // Reads every entry, batch by batch, in no particular order (by a hash
  // of the key) and wherever its shards are: while the caller works on one
  // batch the next is already being fetched, from every shard at once.
  // Entries that are there from the first batch to the last are each seen
  // once, even as shards split or move; entries put or erased meanwhile
  // may or may not be seen.
  class Scanner {
   public:
    // The next batch: empty at the end.
    Result<std::vector<std::pair<K, V>>> Next() {
      using Out = std::vector<std::pair<K, V>>;
      Out out;
      while (out.empty()) {
        auto b = batches_.Next();
        if (!b.ok()) return internal::Fail<Out>(b.code(), b.message());
        if (b->entries.empty() && b->next >= wire::kScanEnd) break;
        out.reserve(b->entries.size());
        for (const auto& [k, v] : b->entries) {
          std::pair<K, V> e{};
          if (!Codec<K>::Decode(k, &e.first) || !Codec<V>::Decode(v, &e.second))
            return internal::Fail<Out>(
                StateCode::kInvalid,
                "stored entry does not decode as this map's types");
          out.push_back(std::move(e));
        }
      }
      return Result<Out>(std::move(out));
    }
    Scanner(const Scanner&) = delete;
    Scanner& operator=(const Scanner&) = delete;

   private:
    friend class Map;
    explicit Scanner(internal::StructureHandle h)
        : batches_(std::move(h), 0, wire::kOpenEnd, 0, wire::kScanEnd) {}
    internal::MapBatches batches_;
  };
  Scanner Scan() const { return Scanner(h_); }

  const std::string& name() const { return h_.name(); }

 private:
  Result<bool> KeyOp(wire::StateOp op, const K& key) {
    std::string req = h_.Begin(op), body, msg;
    wire::Writer(&req).Str(internal::Encoded(key));
    StateCode c = h_.Run(req, &body, &msg);
    if (c != StateCode::kOk) return internal::Fail<bool>(c, msg);
    return internal::DecodeBool(body);
  }
  internal::StructureHandle h_;
};

// A sharded vector of T, indexed from 0.
template <typename T>
class Vector {
 public:
  Vector(const silt_state_api* api, std::string name, StateOptions o = {})
      : h_(api, std::move(name), wire::StateKind::kVector, o) {}

  // The new element's index.
  Result<uint64_t> PushBack(const T& value) {
    std::string req = h_.Begin(wire::StateOp::kVecPush), body, msg;
    wire::Writer(&req).Str(internal::Encoded(value));
    StateCode c = h_.Run(req, &body, &msg);
    if (c != StateCode::kOk) return internal::Fail<uint64_t>(c, msg);
    return internal::DecodeU64(body);
  }
  // kNotFound past the end.
  Result<T> Get(uint64_t index) {
    std::string req = h_.Begin(wire::StateOp::kVecGet), body, msg;
    wire::Writer(&req).U64(index);
    StateCode c = h_.Run(req, &body, &msg);
    if (c != StateCode::kOk) return internal::Fail<T>(c, msg);
    wire::Reader r(body);
    std::string_view v;
    if (!r.Str(&v)) return internal::Fail<T>(StateCode::kInternal, "bad reply");
    return internal::DecodeOne<T>(v);
  }
  Status Set(uint64_t index, const T& value) {
    std::string req = h_.Begin(wire::StateOp::kVecSet), body, msg;
    wire::Writer w(&req);
    w.U64(index);
    w.Str(internal::Encoded(value));
    StateCode c = h_.Run(req, &body, &msg);
    return c == StateCode::kOk ? Status(Done{}) : Status(c, msg);
  }
  Result<uint64_t> Size() {
    return internal::RunCount(h_, wire::StateOp::kVecSize);
  }
  // Up to n elements from `first` (fewer at the end).
  Result<std::vector<T>> Range(uint64_t first, uint64_t n) {
    return internal::FetchRange<T>(h_, first, n);
  }
  // Sets values[i] at first + i, in one round trip per shard they fall in.
  // kNotFound when the range passes the end (see Extend).
  Status SetRange(uint64_t first, const std::vector<T>& values) {
    std::string req = h_.Begin(wire::StateOp::kVecSetRange), body, msg;
    wire::Writer w(&req);
    w.U64(first);
    w.U32(static_cast<uint32_t>(values.size()));
    for (const T& v : values) w.Str(internal::Encoded(v));
    StateCode c = h_.Run(req, &body, &msg);
    return c == StateCode::kOk ? Status(Done{}) : Status(c, msg);
  }
  // Grows the vector to at least n elements (the new ones empty: set them
  // before reading them); returns the size.
  Result<uint64_t> Extend(uint64_t n) {
    std::string req = h_.Begin(wire::StateOp::kVecExtend), body, msg;
    wire::Writer(&req).U64(n);
    StateCode c = h_.Run(req, &body, &msg);
    if (c != StateCode::kOk) return internal::Fail<uint64_t>(c, msg);
    return internal::DecodeU64(body);
  }

  // Reads elements [first, first + count) block by block (to the end with
  // count wire::kAll). While the caller works on one block the next one is
  // already being fetched, so a scan of a shard on another node costs about
  // what a local one does once a block's work outlasts a round trip.
  class Scanner {
   public:
    // The next block: empty at the end.
    Result<std::vector<T>> Next() {
      if (!ahead_.valid()) Prefetch();
      if (!ahead_.valid()) return Result<std::vector<T>>(std::vector<T>{});
      Fetched f = ahead_.get();
      if (f.values.ok()) {
        const size_t n = f.values->size();
        if (n == 0) {
          at_ = end_;
        } else {
          at_ += n;
          // Blocks of about kBlockBytes once the element size is known.
          per_element_ = std::max<size_t>(1, f.bytes / n);
          Prefetch();
        }
      }
      return std::move(f.values);
    }
    uint64_t position() const { return at_; }
    Scanner(const Scanner&) = delete;  // its fetch in flight points at it
    Scanner& operator=(const Scanner&) = delete;

   private:
    friend class Vector;
    static constexpr size_t kBlockBytes = 256 << 10;
    struct Fetched {
      Result<std::vector<T>> values{std::vector<T>{}};
      size_t bytes = 0;
    };
    Scanner(internal::StructureHandle h, uint64_t first, uint64_t count)
        : h_(std::move(h)),
          at_(first),
          next_(first),
          end_(count == wire::kAll || first + count < first ? wire::kAll
                                                            : first + count) {}
    void Prefetch() {
      if (next_ >= end_) return;
      uint64_t n = std::clamp<uint64_t>(kBlockBytes / per_element_, 64,
                                        uint64_t{1} << 16);
      n = std::min(n, end_ - next_);
      uint64_t first = next_;
      next_ += n;
      ahead_ = std::async(std::launch::async, [this, first, n] {
        Fetched f;
        f.values = internal::FetchRange<T>(h_, first, n, &f.bytes);
        return f;
      });
    }
    internal::StructureHandle h_;  // used by one fetch at a time
    uint64_t at_, next_, end_;
    size_t per_element_ = 64;
    std::future<Fetched> ahead_;
  };
  Scanner Scan(uint64_t first = 0, uint64_t count = wire::kAll) const {
    return Scanner(h_, first, count);
  }

  const std::string& name() const { return h_.name(); }

 private:
  internal::StructureHandle h_;
};

// A sharded FIFO queue of T: many producers, many consumers.
template <typename T>
class Queue {
 public:
  Queue(const silt_state_api* api, std::string name, StateOptions o = {})
      : h_(api, std::move(name), wire::StateKind::kQueue, o) {}

  Status Push(const T& value) {
    std::string req = h_.Begin(wire::StateOp::kQueuePush), body, msg;
    wire::Writer(&req).Str(internal::Encoded(value));
    StateCode c = h_.Run(req, &body, &msg);
    return c == StateCode::kOk ? Status(Done{}) : Status(c, msg);
  }
  // The oldest value; waits up to `timeout` for one (kTimeout after that).
  Result<T> Pop(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    std::string req = h_.Begin(wire::StateOp::kQueuePop), body, msg;
    wire::Writer(&req).U32(static_cast<uint32_t>(timeout.count()));
    StateCode c = h_.Run(req, &body, &msg);
    if (c != StateCode::kOk) return internal::Fail<T>(c, msg);
    wire::Reader r(body);
    std::string_view v;
    if (!r.Str(&v)) return internal::Fail<T>(StateCode::kInternal, "bad reply");
    return internal::DecodeOne<T>(v);
  }
  Result<uint64_t> Size() {
    return internal::RunCount(h_, wire::StateOp::kQueueSize);
  }

 private:
  internal::StructureHandle h_;
};

}  // namespace silt

#endif  // SILT_STATE_H_
