// The Silt function SDK. A function is a C++ handler compiled into a bundle:
//
//   #include <silt/function.h>
//
//   static std::vector<int> table;
//   void Init(silt::Context& ctx) { table = BuildTable(); }       // once per
//   instance silt::Response Handle(const silt::Request& req, silt::Context&
//   ctx) {
//     ctx.Log("called with " + std::to_string(req.body.size()) + " bytes");
//     return silt::Response::Text(200, "hello " + req.body);
//   }
//   SILT_INIT(Init)
//   SILT_HANDLER(Handle)
//
// A handler may stream its response (server-sent events, progress, output
// too large to hold): ctx.BeginResponse(200, {{"Content-Type",
// "text/event-stream"}}) sends the head, and each ctx.Write(part) reaches the
// caller as it is written; the Response the handler then returns only ends
// the stream (its body is the last part; its status and headers are unused).
//
// Init runs once per instance before the first request: put expensive set-up
// there, it is what snapshots capture. SILT_AFTER_RESTORE(fn) runs in every
// instance restored or forked from a snapshot, before its first request (Lambda
// SnapStart's afterRestore): re-create anything that must be unique per
// instance.
//
// Header-only; the exported symbols are the C ABI of silt/abi.h.
#ifndef SILT_FUNCTION_H_
#define SILT_FUNCTION_H_

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "silt/abi.h"
#include "silt/compute.h"
#include "silt/gpu.h"
#include "silt/state.h"

namespace silt {

using Headers = std::vector<std::pair<std::string, std::string>>;

inline bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

struct Request {
  std::string_view method;
  std::string_view path;
  std::string_view query;
  std::vector<std::pair<std::string_view, std::string_view>> headers;
  std::string_view body;

  // First value of a header (case-insensitive), or empty.
  std::string_view Header(std::string_view name) const {
    for (const auto& [k, v] : headers) {
      if (EqualsIgnoreCase(k, name)) return v;
    }
    return {};
  }
};

struct Response {
  int status = 200;
  Headers headers;
  std::string body;

  static Response Text(int status, std::string body) {
    return {status,
            {{"Content-Type", "text/plain; charset=utf-8"}},
            std::move(body)};
  }
  static Response Json(int status, std::string body) {
    return {status, {{"Content-Type", "application/json"}}, std::move(body)};
  }
};

class Context;

namespace internal {

// Compute tasks registered with SILT_TASK, by name and by function.
using TaskFn = void (*)();
using TaskThunk = void (*)(TaskFn fn, const silt_context* c,
                           const wire::TaskCall& call, std::string* reply);
struct TaskEntry {
  const char* name;
  TaskFn fn;
  wire::JobKind kind;
  TaskThunk thunk;
};
inline std::vector<TaskEntry>& Tasks() {
  static std::vector<TaskEntry> tasks;
  return tasks;
}
inline const TaskEntry* FindTask(TaskFn fn) {
  for (const auto& t : Tasks())
    if (t.fn == fn) return &t;
  return nullptr;
}
inline const TaskEntry* FindTask(std::string_view name) {
  for (const auto& t : Tasks())
    if (name == t.name) return &t;
  return nullptr;
}
inline std::string NotRegistered() {
  return "the function is not a registered task: add SILT_TASK(fn) next to "
         "its definition";
}

}  // namespace internal

class Context {
 public:
  explicit Context(const silt_context* c,
                   const silt_response_writer* out = nullptr)
      : c_(c), out_(out) {}

  std::string_view function_name() const { return View(c_->function_name); }
  std::string_view function_namespace() const {
    return View(c_->function_namespace);
  }
  std::string_view call_id() const { return View(c_->call_id); }
  std::string_view instance_id() const { return View(c_->instance_id); }

  // The secret's bytes, read from the instance's secrets directory; nullopt if
  // absent.
  std::optional<std::string> Secret(std::string_view name) const {
    if (name.find('/') != std::string_view::npos) return std::nullopt;
    std::string path =
        std::string(View(c_->secrets_dir)) + "/" + std::string(name);
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // The function namespace's state structures (see silt/state.h): handles
  // are cheap; the structure is created on first use.
  template <typename K, typename V>
  silt::Map<K, V> Map(std::string name, StateOptions options = {}) const {
    return silt::Map<K, V>(c_->state, std::move(name), options);
  }
  template <typename T>
  silt::Vector<T> Vector(std::string name, StateOptions options = {}) const {
    return silt::Vector<T>(c_->state, std::move(name), options);
  }
  template <typename T>
  silt::Queue<T> Queue(std::string name, StateOptions options = {}) const {
    return silt::Queue<T>(c_->state, std::move(name), options);
  }

  // The function's GPU proclet `name` (see silt/gpu.h): device buffers and
  // kernels placed on a node with a GPU, or run on CPU cores where none is.
  silt::Gpu Gpu(std::string name = "default") const {
    return silt::Gpu(c_->state, std::move(name));
  }

  // Compute. Each runs fn as compute proclets: the function's invoker splits
  // the work into shares and runs them in instances of this same function
  // (sandboxed like any instance) on nodes with free CPU, this one or others,
  // moving the rest of the work off a node that slows down. fn must be
  // registered with SILT_TASK(fn) and reach data only through its arguments
  // and state (it runs in another process, maybe on another node). Errors
  // are values: Future::Get() says why a job failed.

  // fn(ctx, index, element) for each element of `in` (TaskOptions::first /
  // count choose a range).
  template <typename TArg>
  Future<Done> ParallelFor(silt::Vector<std::decay_t<TArg>>& in,
                           void (*fn)(Context&, uint64_t, TArg),
                           TaskOptions options = {}) const {
    return Start<Done>(wire::JobKind::kParallelFor, wire::StateKind::kVector,
                       reinterpret_cast<internal::TaskFn>(fn), in.name(), {},
                       {}, options);
  }
  // fn(ctx, key, value) for each entry of the map `in`. Entries there for
  // the whole job are each seen once; entries put or erased meanwhile may
  // or may not be.
  template <typename K, typename V, typename KArg, typename VArg>
  Future<Done> ParallelFor(silt::Map<K, V>& in,
                           void (*fn)(Context&, KArg, VArg),
                           TaskOptions options = {}) const {
    static_assert(std::is_same_v<std::decay_t<KArg>, K> &&
                      std::is_same_v<std::decay_t<VArg>, V>,
                  "fn takes the map's key and value types");
    return Start<Done>(wire::JobKind::kParallelFor, wire::StateKind::kMap,
                       reinterpret_cast<internal::TaskFn>(fn), in.name(), {},
                       {}, options);
  }
  // out[i] = fn(in[i]) for each element (out grows to in's size; its other
  // elements are left as they are).
  template <typename U, typename TArg>
  Future<Done> Map(silt::Vector<std::decay_t<TArg>>& in, U (*fn)(TArg),
                   silt::Vector<U>& out, TaskOptions options = {}) const {
    if (out.name() == in.name())
      return Future<Done>(StateCode::kInvalid,
                          "Map writes its output into another vector than "
                          "its input");
    return Start<Done>(wire::JobKind::kMap, wire::StateKind::kVector,
                       reinterpret_cast<internal::TaskFn>(fn), in.name(),
                       out.name(), {}, options);
  }
  // out[key] = fn(value) for each entry of the map `in` (out's other keys
  // are left as they are).
  template <typename K, typename U, typename TArg>
  Future<Done> Map(silt::Map<K, std::decay_t<TArg>>& in, U (*fn)(TArg),
                   silt::Map<K, U>& out, TaskOptions options = {}) const {
    if (out.name() == in.name())
      return Future<Done>(StateCode::kInvalid,
                          "Map writes its output into another map than its "
                          "input");
    return Start<Done>(wire::JobKind::kMap, wire::StateKind::kMap,
                       reinterpret_cast<internal::TaskFn>(fn), in.name(),
                       out.name(), {}, options);
  }
  // fn(ctx, arg) once, on a node with free CPU; its result.
  template <typename R, typename AArg>
  auto Spawn(R (*fn)(Context&, AArg), const std::decay_t<AArg>& arg,
             TaskOptions options = {}) const {
    using Out = std::conditional_t<std::is_void_v<R>, Done, R>;
    std::string encoded;
    Codec<std::decay_t<AArg>>::Encode(arg, &encoded);
    return Start<Out>(wire::JobKind::kSpawn, wire::StateKind::kVector,
                      reinterpret_cast<internal::TaskFn>(fn), {}, {}, encoded,
                      options);
  }

  // Streams the response (in a handler only): sends the status and headers
  // now. False when the call's connection is gone (return from the handler)
  // or outside a handler.
  bool BeginResponse(int status, const Headers& headers = {}) const {
    if (out_ == nullptr) return false;
    out_->set_status(out_->host, status);
    for (const auto& [k, v] : headers)
      out_->add_header(out_->host, {k.data(), k.size()}, {v.data(), v.size()});
    return out_->flush(out_->host) == 0;
  }
  // Sends `part` to the caller now, after the head (BeginResponse, or a 200
  // with no headers if it was not called). False when the call's connection
  // is gone.
  bool Write(std::string_view part) const {
    if (out_ == nullptr) return false;
    out_->append_body(out_->host, part.data(), part.size());
    return out_->flush(out_->host) == 0;
  }

  // One line to the instance's stdout / stderr (what `silt logs` shows).
  void Log(std::string_view line) const { WriteLine(stdout, line); }
  void Error(std::string_view line) const { WriteLine(stderr, line); }

 private:
  static std::string_view View(silt_str s) { return {s.data, s.len}; }
  template <typename T>
  Future<T> Start(wire::JobKind kind, wire::StateKind input_kind,
                  internal::TaskFn fn, std::string_view input,
                  std::string_view output, std::string_view argument,
                  const TaskOptions& o) const {
    const internal::TaskEntry* t = internal::FindTask(fn);
    if (t == nullptr)
      return Future<T>(StateCode::kInvalid, internal::NotRegistered());
    if (input_kind == wire::StateKind::kMap &&
        (o.first != 0 || o.count != wire::kAll))
      return Future<T>(StateCode::kInvalid,
                       "a job over a map runs over all of it: leave "
                       "TaskOptions::first and count as they are");
    return internal::StartJob<T>(c_->state, kind, input_kind, t->name, input,
                                 output, argument, o);
  }
  static void WriteLine(FILE* f, std::string_view line) {
    fwrite(line.data(), 1, line.size(), f);
    fputc('\n', f);
    fflush(f);
  }
  const silt_context* c_;
  const silt_response_writer* out_;  // in a handler; null elsewhere
};

namespace internal {

inline void CopyError(std::string_view msg, char* error, size_t cap) {
  if (error == nullptr || cap == 0) return;
  size_t n = msg.size() < cap - 1 ? msg.size() : cap - 1;
  memcpy(error, msg.data(), n);
  error[n] = '\0';
}

inline int RunHandler(Response (*fn)(const Request&, Context&),
                      const silt_context* c, const silt_request* r,
                      const silt_response_writer* out, char* error,
                      size_t cap) {
  Request req;
  req.method = {r->method.data, r->method.len};
  req.path = {r->path.data, r->path.len};
  req.query = {r->query.data, r->query.len};
  req.body = {r->body.data, r->body.len};
  req.headers.reserve(r->header_count);
  for (size_t i = 0; i < r->header_count; ++i) {
    req.headers.emplace_back(
        std::string_view(r->headers[i].name.data, r->headers[i].name.len),
        std::string_view(r->headers[i].value.data, r->headers[i].value.len));
  }
  Context ctx(c, out);
  try {
    Response res = fn(req, ctx);
    out->set_status(out->host, res.status);
    for (const auto& [k, v] : res.headers) {
      out->add_header(out->host, {k.data(), k.size()}, {v.data(), v.size()});
    }
    out->append_body(out->host, res.body.data(), res.body.size());
    return 0;
  } catch (const std::exception& e) {
    CopyError(e.what(), error, cap);
  } catch (...) {
    CopyError("handler threw a non-standard exception", error, cap);
  }
  return 1;
}

inline int RunInit(void (*fn)(Context&), const silt_context* c, char* error,
                   size_t cap) {
  Context ctx(c);
  try {
    fn(ctx);
    return 0;
  } catch (const std::exception& e) {
    CopyError(e.what(), error, cap);
  } catch (...) {
    CopyError("init threw a non-standard exception", error, cap);
  }
  return 1;
}

inline void TaskReply(std::string* reply, StateCode code,
                      std::string_view payload) {
  reply->assign(1, static_cast<char>(code));
  reply->append(payload.data(), payload.size());
}

inline void TaskFailed(std::string* reply, StateCode code,
                       std::string_view what, std::string_view why) {
  std::string m(what);
  m += ": ";
  m += why;
  TaskReply(reply, code, m);
}

// A share's result: how far it got (elements, or a map's positions), and
// for a map the entries it saw.
inline void TaskDone(std::string* reply, uint64_t processed,
                     std::optional<uint64_t> seen = std::nullopt) {
  std::string r;
  wire::Writer(&r).U64(processed);
  if (seen) wire::Writer(&r).U64(*seen);
  std::string out;
  wire::Writer(&out).Str(r);
  TaskReply(reply, StateCode::kOk, out);
}

// A share's time budget (TaskCall::budget_us), checked after each element.
class ShareClock {
 public:
  explicit ShareClock(const wire::TaskCall& call)
      : end_(call.budget_us == 0
                 ? std::chrono::steady_clock::time_point::max()
                 : std::chrono::steady_clock::now() +
                       std::chrono::microseconds(call.budget_us)) {}
  bool Over() const { return std::chrono::steady_clock::now() >= end_; }

 private:
  std::chrono::steady_clock::time_point end_;
};

// A share over a map: its entries at scan positions [first, first +
// count) of one shard's hash range [lo, hi), each passed to fn(key, value)
// (encoded; an error message, or empty) until the time budget is spent,
// then flush(last) after each batch. Replies how far it got (in positions)
// and how many entries it saw. It stops only between positions, so the
// executor can hand out the rest as a position range.
template <typename Fn, typename Flush>
void MapShare(const silt_context* c, const wire::TaskCall& call, Fn fn,
              Flush flush, std::string* reply) {
  StructureHandle in(c->state, std::string(call.input), wire::StateKind::kMap,
                     {});
  const uint64_t end = call.first + call.count;
  MapBatches batches(std::move(in), call.lo, call.hi, call.first, end);
  ShareClock clock(call);
  uint64_t at = call.first, seen = 0;
  while (at < end) {
    auto b = batches.Next();
    if (!b.ok())
      return TaskFailed(reply, b.code(), "reading the input", b.message());
    const size_t n = b->entries.size();
    size_t i = 0;
    for (; i < n; ++i) {
      if (i > 0 && b->positions[i] != b->positions[i - 1] && clock.Over())
        break;
      if (std::string err = fn(b->entries[i].first, b->entries[i].second);
          !err.empty())
        return TaskFailed(reply, StateCode::kInvalid, "reading the input", err);
      ++seen;
    }
    at = i < n ? b->positions[i] : b->next;  // short: out of time
    const bool last = i < n || at >= end || clock.Over();
    if (std::string err = flush(last); !err.empty())
      return TaskFailed(reply, StateCode::kUnavailable, "writing the output",
                        err);
    if (last) break;
  }
  TaskDone(reply, at - call.first, seen);
}

inline constexpr const char* kUndecodable =
    "a stored entry does not decode as the task's types";

template <typename KArg, typename TArg>
void ParallelForThunk(TaskFn f, const silt_context* c,
                      const wire::TaskCall& call, std::string* reply) {
  using K = std::decay_t<KArg>;
  using T = std::decay_t<TArg>;
  auto fn = reinterpret_cast<void (*)(Context&, KArg, TArg)>(f);
  Context ctx(c);
  if (call.input_kind == wire::StateKind::kMap) {
    return MapShare(
        c, call,
        [&](const std::string& k, const std::string& v) -> std::string {
          K key{};
          T value{};
          if (!Codec<K>::Decode(k, &key) || !Codec<T>::Decode(v, &value))
            return kUndecodable;
          fn(ctx, key, value);
          return {};
        },
        [](bool) { return std::string(); }, reply);
  }
  if constexpr (!std::is_same_v<K, uint64_t>) {
    return TaskReply(reply, StateCode::kInvalid,
                     "task " + std::string(call.task) +
                         " takes a map's entries, not a vector's elements");
  } else {
    silt::Vector<T> in(c->state, std::string(call.input));
    auto scan = in.Scan(call.first, call.count);
    uint64_t at = call.first;
    ShareClock clock(call);
    while (!clock.Over()) {
      auto block = scan.Next();
      if (!block.ok())
        return TaskFailed(reply, block.code(), "reading the input",
                          block.message());
      if (block->empty()) break;
      for (const T& v : *block) {
        fn(ctx, at++, v);
        if (clock.Over()) break;
      }
    }
    TaskDone(reply, at - call.first);
  }
}

// Map over a map: out[key] = fn(value), the key passed through as stored;
// each batch's results go out in one multi-put while the next batch is
// computed.
template <typename U, typename TArg>
void MapOverMap(TaskFn f, const silt_context* c, const wire::TaskCall& call,
                std::string* reply) {
  using T = std::decay_t<TArg>;
  auto fn = reinterpret_cast<U (*)(TArg)>(f);
  StructureHandle out(c->state, std::string(call.output), wire::StateKind::kMap,
                      {});
  std::string entries;  // the batch's (key, result) pairs
  uint32_t count = 0;
  std::future<std::string> writing;  // the last multi-put: its error
  auto flush = [&](bool last) -> std::string {
    std::string err = writing.valid() ? writing.get() : std::string();
    if (!err.empty()) return err;
    if (count > 0) {
      std::string req = out.Begin(wire::StateOp::kMapMultiPut);
      wire::Writer(&req).U32(count);
      req += entries;
      entries.clear();
      count = 0;
      writing = std::async(std::launch::async, [&out, req = std::move(req)] {
        std::string body, msg;
        return out.Run(req, &body, &msg) == StateCode::kOk ? std::string()
                                                           : msg;
      });
    }
    if (last && writing.valid()) return writing.get();
    return {};
  };
  MapShare(
      c, call,
      [&](const std::string& k, const std::string& v) -> std::string {
        T value{};
        if (!Codec<T>::Decode(v, &value)) return kUndecodable;
        std::string result;
        Codec<U>::Encode(fn(value), &result);
        wire::Writer w(&entries);
        w.Str(k);
        w.Str(result);
        ++count;
        return {};
      },
      flush, reply);
}

template <typename U, typename TArg>
void MapThunk(TaskFn f, const silt_context* c, const wire::TaskCall& call,
              std::string* reply) {
  if (call.input_kind == wire::StateKind::kMap)
    return MapOverMap<U, TArg>(f, c, call, reply);
  using T = std::decay_t<TArg>;
  auto fn = reinterpret_cast<U (*)(TArg)>(f);
  silt::Vector<T> in(c->state, std::string(call.input));
  silt::Vector<U> out(c->state, std::string(call.output));
  auto scan = in.Scan(call.first, call.count);
  uint64_t at = call.first;
  // One block is written while the next is computed.
  std::future<Status> writing;
  ShareClock clock(call);
  while (!clock.Over()) {
    auto block = scan.Next();
    if (!block.ok())
      return TaskFailed(reply, block.code(), "reading the input",
                        block.message());
    if (block->empty()) break;
    std::vector<U> results;
    results.reserve(block->size());
    for (const T& v : *block) {
      results.push_back(fn(v));
      if (clock.Over()) break;
    }
    if (writing.valid()) {
      Status st = writing.get();
      if (!st.ok())
        return TaskFailed(reply, st.code(), "writing the output", st.message());
    }
    size_t n = results.size();
    writing = std::async(
        std::launch::async,
        [&out, at, r = std::move(results)] { return out.SetRange(at, r); });
    at += n;
  }
  if (writing.valid()) {
    Status st = writing.get();
    if (!st.ok())
      return TaskFailed(reply, st.code(), "writing the output", st.message());
  }
  TaskDone(reply, at - call.first);
}

template <typename R, typename AArg>
void SpawnThunk(TaskFn f, const silt_context* c, const wire::TaskCall& call,
                std::string* reply) {
  using A = std::decay_t<AArg>;
  auto fn = reinterpret_cast<R (*)(Context&, AArg)>(f);
  Context ctx(c);
  A arg{};
  if (!Codec<A>::Decode(call.argument, &arg))
    return TaskReply(reply, StateCode::kInvalid,
                     "the argument does not decode as the task's type");
  std::string result;
  if constexpr (std::is_void_v<R>) {
    fn(ctx, std::move(arg));
  } else {
    Codec<R>::Encode(fn(ctx, std::move(arg)), &result);
  }
  std::string out;
  wire::Writer(&out).Str(result);
  TaskReply(reply, StateCode::kOk, out);
}

// SILT_TASK's registration: the overload follows fn's signature.
struct TaskRegistrar {
  template <typename KArg, typename TArg>
  TaskRegistrar(const char* name, void (*fn)(Context&, KArg, TArg)) {
    Add(name, reinterpret_cast<TaskFn>(fn), wire::JobKind::kParallelFor,
        &ParallelForThunk<KArg, TArg>);
  }
  template <typename U, typename TArg>
  TaskRegistrar(const char* name, U (*fn)(TArg)) {
    static_assert(!std::is_void_v<U>, "a Map function returns the new value");
    Add(name, reinterpret_cast<TaskFn>(fn), wire::JobKind::kMap,
        &MapThunk<U, TArg>);
  }
  template <typename R, typename AArg>
  TaskRegistrar(const char* name, R (*fn)(Context&, AArg)) {
    Add(name, reinterpret_cast<TaskFn>(fn), wire::JobKind::kSpawn,
        &SpawnThunk<R, AArg>);
  }
  static void Add(const char* name, TaskFn fn, wire::JobKind kind,
                  TaskThunk thunk) {
    Tasks().push_back({name, fn, kind, thunk});
  }
};

inline int RunTask(const silt_context* c, const char* data, size_t len,
                   void* out, void (*append)(void*, const char*, size_t)) {
  std::string reply;
  wire::TaskCall call;
  if (!wire::ReadTaskCall(std::string_view(data, len), &call)) {
    TaskReply(&reply, StateCode::kInvalid, "malformed task call");
  } else if (const TaskEntry* t = FindTask(call.task); t == nullptr) {
    TaskReply(&reply, StateCode::kInvalid,
              "no task named " + std::string(call.task) +
                  " in this function (is the bundle the caller's version?)");
  } else if (t->kind != call.kind) {
    TaskReply(&reply, StateCode::kInvalid,
              "task " + std::string(call.task) +
                  " was registered for another kind of job");
  } else {
    try {
      t->thunk(t->fn, c, call, &reply);
    } catch (const std::exception& e) {
      TaskFailed(&reply, StateCode::kInternal,
                 "task " + std::string(call.task) + " threw", e.what());
    } catch (...) {
      TaskReply(
          &reply, StateCode::kInternal,
          "task " + std::string(call.task) + " threw a non-standard exception");
    }
  }
  append(out, reply.data(), reply.size());
  return 0;
}

}  // namespace internal
}  // namespace silt

// Registers fn as a compute task (ParallelFor, Map or Spawn: see Context), by
// its name. Once per task, at namespace scope in the bundle.
#define SILT_TASK(fn) \
  static const ::silt::internal::TaskRegistrar silt_task_##fn { #fn, &fn }

#define SILT_HANDLER(fn)                                                       \
  extern "C" __attribute__((visibility("default"))) uint32_t silt_abi_version( \
      void) {                                                                  \
    return SILT_ABI_VERSION;                                                   \
  }                                                                            \
  extern "C" __attribute__((visibility("default"))) int silt_handle(           \
      const silt_context* c, const silt_request* r,                            \
      const silt_response_writer* out, char* error, size_t cap) {              \
    return ::silt::internal::RunHandler(fn, c, r, out, error, cap);            \
  }                                                                            \
  extern "C" __attribute__((visibility("default"))) int silt_task(             \
      const silt_context* c, const char* call, size_t len, void* out,          \
      void (*append)(void*, const char*, size_t)) {                            \
    return ::silt::internal::RunTask(c, call, len, out, append);               \
  }

// Declares the handler (and tasks) thread-safe: an instance then takes up to
// `n` calls at once, each on its own thread, instead of one at a time (as
// Knative's containerConcurrency; at most SILT_MAX_CONCURRENCY). `n` is
// evaluated once, after init; a deployment's com.silt.concurrency label may
// lower it, never raise it. Without it, calls to an instance never overlap.
#define SILT_CONCURRENCY(n)                                  \
  extern "C" __attribute__((visibility("default"))) uint32_t \
  silt_max_concurrency(void) {                               \
    return static_cast<uint32_t>(n);                         \
  }

#define SILT_INIT(fn)                                              \
  extern "C" __attribute__((visibility("default"))) int silt_init( \
      const silt_context* c, char* error, size_t cap) {            \
    return ::silt::internal::RunInit(fn, c, error, cap);           \
  }

#define SILT_AFTER_RESTORE(fn)                                               \
  extern "C" __attribute__((visibility("default"))) void silt_after_restore( \
      const silt_context* c) {                                               \
    ::silt::Context ctx(c);                                                  \
    fn(ctx);                                                                 \
  }

#endif  // SILT_FUNCTION_H_
