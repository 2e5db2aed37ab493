#include "async_queue.h"

#include <time.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "async_record.h"
#include "deploy/http_client.h"
#include "nlohmann/json.hpp"
#include "nodes.h"
#include "openfaas_types.h"

namespace silt::gateway {
namespace {

using nlohmann::json;
using Clock = std::chrono::system_clock;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             Clock::now().time_since_epoch())
      .count();
}

constexpr absl::string_view kInflightLabel = "com.silt.async.max-inflight";

// Statuses a run is retried on (OpenFaaS Pro's defaults, and 503).
bool Retryable(int status) {
  return status == 408 || status == 429 || status == 500 || status == 502 ||
         status == 503 || status == 504;
}

// Retry-After in seconds or as an HTTP-date; -1 when absent or unreadable.
int64_t RetryAfterMs(const HeaderList& headers) {
  for (const auto& [k, v] : headers) {
    if (!absl::EqualsIgnoreCase(k, "Retry-After")) continue;
    int64_t secs = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &secs) && secs >= 0)
      return secs * 1000;
    struct tm tm = {};
    const char* end = strptime(v.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (end == nullptr) return -1;
    int64_t at = static_cast<int64_t>(timegm(&tm)) * 1000;
    return std::max<int64_t>(0, at - NowMs());
  }
  return -1;
}

std::string FnKey(const std::string& ns, const std::string& name) {
  return ns + "/" + name;
}

// Prometheus label value: name.namespace, as the gateway's other metrics.
std::string FnLabel(const std::string& ns, const std::string& name) {
  return absl::StrCat(name, ".", ns);
}

}  // namespace

const char* AsyncStateName(AsyncState s) {
  switch (s) {
    case AsyncState::kQueued:
      return "queued";
    case AsyncState::kCallback:
      return "callback";
    case AsyncState::kDead:
      return "dead";
  }
  return "unknown";
}

absl::StatusOr<AsyncState> ParseAsyncState(absl::string_view s) {
  for (AsyncState st :
       {AsyncState::kQueued, AsyncState::kCallback, AsyncState::kDead}) {
    if (s == AsyncStateName(st)) return st;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown async state \"", s, "\": use queued, callback or dead"));
}

struct AsyncQueue::Impl {
  // One finished run, handed from a gRPC thread to the dispatcher. Shared with
  // the runs' completions, which may outlive the queue (then it is closed and
  // they drop their result: the call is still queued in the store).
  struct Done {
    std::string id;
    absl::StatusOr<InvokeResult> result;
    int64_t started_ms = 0;
  };
  struct Inbox {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Done> done ABSL_GUARDED_BY(mu);
    bool kick ABSL_GUARDED_BY(mu) = false;
    bool closed ABSL_GUARDED_BY(mu) = false;
  };
  struct Entry {
    std::string ns, name;
    AsyncState state = AsyncState::kQueued;
    bool running = false;
    uint64_t seq = 0;
    int64_t enqueued_ms = 0, next_ms = 0;
    uint32_t attempts = 0, callback_attempts = 0;
    uint32_t waits = 0;  // no node could run it (not attempts); memory only
    int last_status = 0;
    std::string last_error, callback_url;
  };
  using DueKey = std::tuple<int64_t, uint64_t, std::string>;  // next, seq, id
  struct Fn {
    std::set<DueKey> due;  // queued, not running
    uint32_t inflight = 0;
    uint32_t limit = 0;
    int64_t limit_checked_ms = -1;
    // Outcomes, for metrics.
    uint64_t completed = 0, retried = 0, dead = 0, callbacks = 0;
  };

  AsyncQueueOptions options;
  store::Store* store;
  NodeRegistry* nodes;
  std::shared_ptr<Inbox> inbox = std::make_shared<Inbox>();

  mutable std::mutex mu;
  std::condition_variable callback_cv;  // with mu
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::map<std::string, Entry> entries ABSL_GUARDED_BY(mu);  // by call id
  std::map<std::string, Fn> fns ABSL_GUARDED_BY(mu);         // by ns/name
  std::set<DueKey> callbacks_due ABSL_GUARDED_BY(mu);
  std::set<std::string> enqueuing ABSL_GUARDED_BY(mu);  // being written
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  size_t waiting ABSL_GUARDED_BY(mu) = 0;  // entries not dead
  std::minstd_rand rng ABSL_GUARDED_BY(mu){std::random_device{}()};

  std::thread dispatcher;
  std::vector<std::thread> deliverers;

  ~Impl() {
    {
      std::lock_guard<std::mutex> l(mu);
      stopping = true;
    }
    callback_cv.notify_all();
    {
      std::lock_guard<std::mutex> l(inbox->mu);
      inbox->closed = true;
    }
    inbox->cv.notify_all();
    if (dispatcher.joinable()) dispatcher.join();
    for (auto& t : deliverers) t.join();
  }

  void Kick() {
    {
      std::lock_guard<std::mutex> l(inbox->mu);
      inbox->kick = true;
    }
    inbox->cv.notify_all();
  }

  // ---- the index ----

  // Caller holds mu. Files the entry where its state says.
  void IndexLocked(const std::string& id, Entry& e) {
    DueKey key{e.next_ms, e.seq, id};
    if (e.state == AsyncState::kQueued)
      fns[FnKey(e.ns, e.name)].due.insert(key);
    if (e.state == AsyncState::kCallback) callbacks_due.insert(key);
  }

  void UnindexLocked(const std::string& id, const Entry& e) {
    DueKey key{e.next_ms, e.seq, id};
    if (auto f = fns.find(FnKey(e.ns, e.name)); f != fns.end())
      f->second.due.erase(key);
    callbacks_due.erase(key);
  }

  Entry EntryOf(const AsyncRecord& r) {
    Entry e;
    e.ns = r.call.ns;
    e.name = r.call.name;
    e.state = r.state;
    e.seq = r.seq;
    e.enqueued_ms = r.enqueued_ms;
    e.next_ms = r.next_ms;
    e.attempts = r.attempts;
    e.callback_attempts = r.callback_attempts;
    e.last_status = r.last_status;
    e.last_error = r.last_error;
    e.callback_url = r.call.callback_url;
    return e;
  }

  // Caller holds mu. Replaces the entry of a record just written.
  void PutLocked(const AsyncRecord& r) {
    auto it = entries.find(r.call.call_id);
    if (it != entries.end()) {
      if (it->second.state != AsyncState::kDead) --waiting;
      UnindexLocked(r.call.call_id, it->second);
      it->second = EntryOf(r);
    } else {
      it = entries.emplace(r.call.call_id, EntryOf(r)).first;
    }
    if (r.state != AsyncState::kDead) ++waiting;
    IndexLocked(r.call.call_id, it->second);
  }

  void EraseLocked(const std::string& id) {
    auto it = entries.find(id);
    if (it == entries.end()) return;
    if (it->second.state != AsyncState::kDead) --waiting;
    UnindexLocked(id, it->second);
    entries.erase(it);
  }

  absl::Status Load() {
    auto rows = store->Scan(store::Table::kAsyncQueue, "");
    if (!rows.ok()) return rows.status();
    std::lock_guard<std::mutex> l(mu);
    for (const auto& [key, value] : *rows) {
      auto r = DecodeAsyncRecord(key, value);
      if (!r.ok()) {
        // Kept on disk for inspection; never run.
        fprintf(stderr, "silt-gateway: %s\n",
                std::string(r.status().message()).c_str());
        continue;
      }
      next_seq = std::max(next_seq, r->seq + 1);
      PutLocked(*r);
    }
    if (!entries.empty()) {
      fprintf(stderr,
              "silt-gateway: async queue: %zu calls waiting, %zu dead "
              "letters\n",
              waiting, entries.size() - waiting);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<AsyncRecord> Read(const std::string& id) const {
    auto v = store->Get(store::Table::kAsyncQueue, id);
    if (!v.ok()) return v.status();
    return DecodeAsyncRecord(id, *v);
  }

  absl::Status Write(const AsyncRecord& r, store::Durability d) {
    store::WriteBatch b;
    b.Put(store::Table::kAsyncQueue, r.call.call_id, EncodeAsyncRecord(r));
    return store->Write(b, d);
  }

  // ---- policy ----

  // Caller holds mu.
  int64_t BackoffMsLocked(uint32_t tries) {
    int64_t ms = options.initial_backoff.count();
    for (uint32_t i = 1; i < tries && ms < options.max_backoff.count(); ++i)
      ms *= 2;
    ms = std::min<int64_t>(ms, options.max_backoff.count());
    // Up to a fifth less, so that calls failing together spread out.
    return ms - static_cast<int64_t>(rng() % (ms / 5 + 1));
  }

  uint32_t LimitFor(const std::string& ns, const std::string& name) const {
    uint32_t limit = options.max_inflight_per_function;
    auto rec = store->GetFunction(ns, name);
    if (!rec.ok()) return limit;
    auto d = ParseFunctionDeployment(rec->spec);
    if (!d.ok() || !d->labels) return limit;
    auto it = d->labels->find(std::string(kInflightLabel));
    uint32_t v = 0;
    if (it != d->labels->end() && absl::SimpleAtoi(it->second, &v) && v > 0)
      limit = v;
    return limit;
  }

  // ---- the dispatcher ----

  void DispatchLoop() {
    for (;;) {
      std::deque<Done> done;
      {
        std::unique_lock<std::mutex> l(inbox->mu);
        if (inbox->closed) return;
        done.swap(inbox->done);
        inbox->kick = false;
      }
      for (Done& d : done) Finish(std::move(d));
      int64_t wake = StartDue();
      std::unique_lock<std::mutex> l(inbox->mu);
      auto until = Clock::time_point(std::chrono::milliseconds(wake));
      inbox->cv.wait_until(l, until, [&] {
        return inbox->closed || inbox->kick || !inbox->done.empty();
      });
    }
  }

  // Starts every run that is due and allowed; when to look again.
  int64_t StartDue() {
    int64_t now = NowMs();
    std::vector<std::pair<std::string, std::string>> refresh;  // ns, name
    {
      std::lock_guard<std::mutex> l(mu);
      for (auto& [key, f] : fns) {
        if (!f.due.empty() && now - f.limit_checked_ms > 1000) {
          const Entry& e = entries.at(std::get<2>(*f.due.begin()));
          refresh.emplace_back(e.ns, e.name);
        }
      }
    }
    std::vector<std::pair<std::string, uint32_t>> limits;
    for (const auto& [ns, name] : refresh)
      limits.emplace_back(FnKey(ns, name), LimitFor(ns, name));
    std::vector<std::string> start;
    int64_t wake = now + 60000;
    {
      std::lock_guard<std::mutex> l(mu);
      for (const auto& [key, limit] : limits) {
        fns[key].limit = limit;
        fns[key].limit_checked_ms = now;
      }
      for (auto& [key, f] : fns) {
        while (!f.due.empty() && f.inflight < std::max<uint32_t>(1, f.limit)) {
          auto first = f.due.begin();
          if (std::get<0>(*first) > now) {
            wake = std::min(wake, std::get<0>(*first));
            break;
          }
          std::string id = std::get<2>(*first);
          f.due.erase(first);
          entries.at(id).running = true;
          ++f.inflight;
          start.push_back(std::move(id));
        }
      }
    }
    for (const auto& id : start) Run(id, now);
    return wake;
  }

  void Run(const std::string& id, int64_t now) {
    auto r = Read(id);
    if (r.ok()) {
      // Counted before it runs, so that a call that brings the gateway down
      // every time still reaches max_attempts.
      ++r->attempts;
      if (auto s = Write(*r, store::Durability::kBuffered); !s.ok()) r = s;
    }
    if (!r.ok()) {
      fprintf(stderr, "silt-gateway: async call %s: %s\n", id.c_str(),
              std::string(r.status().message()).c_str());
      std::lock_guard<std::mutex> l(mu);
      auto it = entries.find(id);
      if (it == entries.end()) return;
      --fns[FnKey(it->second.ns, it->second.name)].inflight;
      if (absl::IsNotFound(r.status())) {
        EraseLocked(id);
      } else {  // the store failed: try again later
        it->second.running = false;
        it->second.next_ms = now + options.initial_backoff.count();
        IndexLocked(id, it->second);
      }
      return;
    }
    {
      std::lock_guard<std::mutex> l(mu);
      if (auto it = entries.find(id); it != entries.end())
        it->second.attempts = r->attempts;
    }
    InvokeCall call;
    call.ns = r->call.ns;
    call.name = r->call.name;
    call.call_id = id;
    call.method = "POST";
    call.path = r->call.path;
    call.query = r->call.query;
    call.headers = std::move(r->call.headers);
    call.headers.emplace_back("X-Silt-Async-Attempt",
                              absl::StrCat(r->attempts));
    call.body = std::move(r->call.body);
    call.timeout = options.call_timeout;
    std::weak_ptr<Inbox> weak = inbox;
    nodes->Invoke(std::move(call),
                  [weak, id, now](absl::StatusOr<InvokeResult> result) {
                    auto box = weak.lock();
                    if (!box) return;
                    {
                      std::lock_guard<std::mutex> l(box->mu);
                      if (box->closed) return;
                      box->done.push_back(Done{id, std::move(result), now});
                    }
                    box->cv.notify_all();
                  });
  }

  // A run ended: the call is done, waits for its callback, is retried or
  // becomes a dead letter.
  void Finish(Done d) {
    auto r = Read(d.id);
    int64_t now = NowMs();
    std::string fn_key;
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = entries.find(d.id);
      if (it == entries.end()) return;
      fn_key = FnKey(it->second.ns, it->second.name);
      --fns[fn_key].inflight;
    }
    if (!r.ok()) {
      fprintf(stderr, "silt-gateway: async call %s finished: %s\n",
              d.id.c_str(), std::string(r.status().message()).c_str());
      std::lock_guard<std::mutex> l(mu);
      if (absl::IsNotFound(r.status())) {
        EraseLocked(d.id);
      } else {  // the store failed: run it again later
        Entry& e = entries.at(d.id);
        e.running = false;
        e.next_ms = now + options.initial_backoff.count();
        IndexLocked(d.id, e);
      }
      return;
    }
    enum { kDone, kRetry, kWait, kGiveUp } next;
    int status = 503;
    HeaderList headers;
    std::string body;
    int64_t retry_after = -1;
    const absl::Status& s = d.result.status();
    if (d.result.ok()) {
      status = d.result->status;
      r->last_status = status;
      r->last_error =
          d.result->failure == invoker::call_wire::Failure::kNone
              ? ""
              : absl::StrCat(
                    "instance failed: ",
                    invoker::call_wire::FailureName(d.result->failure));
      headers = std::move(d.result->headers);
      body = std::move(d.result->body);
      retry_after = RetryAfterMs(headers);
      next = Retryable(status) ? kRetry : kDone;
    } else {
      r->last_error = std::string(s.message());
      body = r->last_error;
      if (absl::IsNotFound(s)) {
        status = 404;
        next = kGiveUp;
      } else if (absl::IsUnavailable(s) || absl::IsCancelled(s)) {
        next = kWait;  // the platform's, not the function's: no attempt spent
        --r->attempts;
      } else {
        status = absl::IsDeadlineExceeded(s) ? 504 : 502;
        next = kRetry;
      }
    }
    if (next == kRetry && r->attempts >= options.max_attempts) next = kGiveUp;
    if (next == kWait && now - r->enqueued_ms >= options.max_age.count()) {
      r->last_error =
          absl::StrCat("no node could run it for ",
                       options.max_age.count() / 1000, " s: ", r->last_error);
      next = kGiveUp;
    }
    uint32_t waits = 0;
    {
      std::lock_guard<std::mutex> l(mu);
      waits = ++entries.at(d.id).waits;
      if (next == kRetry || next == kWait) {
        int64_t backoff =
            BackoffMsLocked(next == kRetry ? r->attempts : std::min(waits, 8u));
        r->next_ms = now + std::max(backoff, retry_after);
      }
    }
    Fn* fn = nullptr;
    if (next == kRetry || next == kWait) {
      r->state = AsyncState::kQueued;
    } else {
      r->has_result = true;
      r->failed = next == kGiveUp;
      r->result_status = status;
      r->result_headers = std::move(headers);
      r->result_body = std::move(body);
      r->duration_s = (now - d.started_ms) / 1000.0;
      r->next_ms = now;
      r->state = !r->call.callback_url.empty() ? AsyncState::kCallback
                 : r->failed                   ? AsyncState::kDead
                                               : AsyncState::kQueued;
      if (r->failed) {
        fprintf(stderr,
                "silt-gateway: async call %s to %s.%s gave up after %u runs "
                "(status %d%s%s)\n",
                d.id.c_str(), r->call.name.c_str(), r->call.ns.c_str(),
                r->attempts, status, r->last_error.empty() ? "" : ": ",
                r->last_error.c_str());
      }
    }
    bool erase = next == kDone && r->call.callback_url.empty();
    store::WriteBatch b;
    if (erase) {
      b.Delete(store::Table::kAsyncQueue, d.id);
    } else {
      b.Put(store::Table::kAsyncQueue, d.id, EncodeAsyncRecord(*r));
    }
    if (auto w = store->Write(b); !w.ok()) {
      // The record stays as it was (queued): it runs again.
      fprintf(stderr, "silt-gateway: async call %s: %s\n", d.id.c_str(),
              std::string(w.message()).c_str());
      std::lock_guard<std::mutex> l(mu);
      auto& e = entries.at(d.id);
      e.running = false;
      e.next_ms = now + options.initial_backoff.count();
      IndexLocked(d.id, e);
      return;
    }
    {
      std::lock_guard<std::mutex> l(mu);
      fn = &fns[fn_key];
      if (next == kDone) ++fn->completed;
      if (next == kRetry) ++fn->retried;
      if (next == kGiveUp) ++fn->dead;
      if (erase) {
        EraseLocked(d.id);
      } else {
        uint32_t keep_waits = entries.at(d.id).waits;
        PutLocked(*r);
        entries.at(d.id).waits = next == kWait ? keep_waits : 0;
      }
    }
    if (r->state == AsyncState::kCallback) callback_cv.notify_one();
  }

  // ---- callbacks ----

  void DeliverLoop() {
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      if (stopping) return;
      int64_t now = NowMs();
      if (callbacks_due.empty() || std::get<0>(*callbacks_due.begin()) > now) {
        if (callbacks_due.empty()) {
          callback_cv.wait(l);
        } else {
          callback_cv.wait_until(l, Clock::time_point(std::chrono::milliseconds(
                                        std::get<0>(*callbacks_due.begin()))));
        }
        continue;
      }
      std::string id = std::get<2>(*callbacks_due.begin());
      callbacks_due.erase(callbacks_due.begin());
      entries.at(id).running = true;
      l.unlock();
      Deliver(id);
      l.lock();
    }
  }

  void Deliver(const std::string& id) {
    auto r = Read(id);
    if (!r.ok()) {
      std::lock_guard<std::mutex> l(mu);
      if (absl::IsNotFound(r.status())) {
        EraseLocked(id);
      } else {  // the store failed: try again later
        Entry& e = entries.at(id);
        e.running = false;
        e.next_ms = NowMs() + options.initial_backoff.count();
        IndexLocked(id, e);
      }
      return;
    }
    deploy::HttpCall cb;
    cb.method = "POST";
    cb.url = r->call.callback_url;
    cb.timeout = options.callback_timeout;
    cb.body = r->result_body;
    bool has_ct = false;
    for (const auto& [k, v] : r->result_headers) {
      if (IsHopByHop(k) || absl::EqualsIgnoreCase(k, "Content-Length"))
        continue;
      has_ct |= absl::EqualsIgnoreCase(k, "Content-Type");
      cb.headers.emplace_back(k, v);
    }
    if (!has_ct) cb.headers.emplace_back("Content-Type", "text/plain");
    std::string fn_name = r->call.ns == "openfaas-fn"
                              ? r->call.name
                              : absl::StrCat(r->call.name, ".", r->call.ns);
    cb.headers.emplace_back("X-Call-Id", id);
    cb.headers.emplace_back("X-Function-Name", fn_name);
    cb.headers.emplace_back("X-Function-Status",
                            absl::StrCat(r->result_status));
    cb.headers.emplace_back("X-Duration-Seconds",
                            absl::StrFormat("%.6f", r->duration_s));
    cb.headers.emplace_back("X-Silt-Attempts", absl::StrCat(r->attempts));
    cb.headers.emplace_back("User-Agent", "silt-async");
    auto sent = deploy::Send(cb);
    ++r->callback_attempts;
    int64_t now = NowMs();
    bool delivered = sent.ok() && sent->status < 500;
    if (sent.ok() && sent->status >= 400 && sent->status < 500) {
      // The receiver refused it: sending it again would not change that.
      fprintf(stderr, "silt-gateway: async call %s: callback %s answered %d\n",
              id.c_str(), cb.url.c_str(), sent->status);
    }
    bool give_up =
        !delivered && r->callback_attempts >= options.max_callback_attempts;
    if (!delivered) {
      r->last_error =
          absl::StrCat("callback to ", cb.url, ": ",
                       sent.ok() ? absl::StrCat("answered ", sent->status)
                                 : std::string(sent.status().message()));
    }
    bool erase = delivered && !r->failed;
    if (!erase) {
      if (delivered || give_up) {
        r->state = AsyncState::kDead;
      } else {
        std::lock_guard<std::mutex> l(mu);
        r->next_ms = now + BackoffMsLocked(r->callback_attempts);
      }
    }
    store::WriteBatch b;
    if (erase) {
      b.Delete(store::Table::kAsyncQueue, id);
    } else {
      b.Put(store::Table::kAsyncQueue, id, EncodeAsyncRecord(*r));
    }
    auto w = store->Write(b);
    std::lock_guard<std::mutex> l(mu);
    auto it = entries.find(id);
    if (it == entries.end()) return;
    it->second.running = false;
    Fn& fn = fns[FnKey(r->call.ns, r->call.name)];
    if (!w.ok()) {
      fprintf(stderr, "silt-gateway: async call %s: %s\n", id.c_str(),
              std::string(w.message()).c_str());
      it->second.next_ms = now + options.initial_backoff.count();
      IndexLocked(id, it->second);
      return;
    }
    if (delivered) ++fn.callbacks;
    if (give_up) ++fn.dead;
    if (erase) {
      EraseLocked(id);
    } else {
      PutLocked(*r);
    }
  }
};

AsyncQueue::AsyncQueue(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AsyncQueue::~AsyncQueue() = default;

absl::StatusOr<std::unique_ptr<AsyncQueue>> AsyncQueue::Start(
    const AsyncQueueOptions& options, store::Store* store,
    NodeRegistry* nodes) {
  if (options.max_attempts == 0 || options.max_callback_attempts == 0)
    return absl::InvalidArgumentError("async attempts must be at least 1");
  if (options.initial_backoff.count() <= 0 ||
      options.max_backoff < options.initial_backoff)
    return absl::InvalidArgumentError(
        "async backoff: initial must be positive and at most the maximum");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->store = store;
  impl->nodes = nodes;
  if (auto s = impl->Load(); !s.ok()) return s;
  Impl* p = impl.get();
  impl->dispatcher = std::thread([p] { p->DispatchLoop(); });
  for (int i = 0; i < 2; ++i)
    impl->deliverers.emplace_back([p] { p->DeliverLoop(); });
  return std::unique_ptr<AsyncQueue>(new AsyncQueue(std::move(impl)));
}

absl::Status AsyncQueue::Enqueue(AsyncCall call) {
  Impl& q = *impl_;
  AsyncRecord r;
  r.call = std::move(call);
  r.enqueued_ms = r.next_ms = NowMs();
  {
    std::lock_guard<std::mutex> l(q.mu);
    if (q.entries.count(r.call.call_id) || q.enqueuing.count(r.call.call_id))
      return absl::AlreadyExistsError(
          absl::StrCat("async call ", r.call.call_id, " was accepted before"));
    if (q.waiting >= q.options.max_queued)
      return absl::ResourceExhaustedError(absl::StrCat(
          "the async queue is full (", q.waiting, " calls waiting)"));
    r.seq = q.next_seq++;
    q.enqueuing.insert(r.call.call_id);
  }
  // Outside the lock: the fsync must not hold up the dispatcher.
  absl::Status s = q.Write(r, store::Durability::kSynced);
  {
    std::lock_guard<std::mutex> l(q.mu);
    q.enqueuing.erase(r.call.call_id);
    if (!s.ok()) return s;
    q.PutLocked(r);
  }
  q.Kick();
  return absl::OkStatus();
}

std::vector<AsyncView> AsyncQueue::List(const AsyncFilter& filter) const {
  std::vector<std::pair<uint64_t, AsyncView>> rows;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (const auto& [id, e] : impl_->entries) {
      if (!filter.ns.empty() && e.ns != filter.ns) continue;
      if (!filter.name.empty() && e.name != filter.name) continue;
      if (!filter.any_state && e.state != filter.state) continue;
      AsyncView v;
      v.call_id = id;
      v.ns = e.ns;
      v.name = e.name;
      v.state = e.state;
      v.running = e.running;
      v.attempts = e.attempts;
      v.callback_attempts = e.callback_attempts;
      v.enqueued_unix_ms = e.enqueued_ms;
      v.next_attempt_unix_ms = e.next_ms;
      v.last_status = e.last_status;
      v.last_error = e.last_error;
      v.callback_url = e.callback_url;
      rows.emplace_back(e.seq, std::move(v));
    }
  }
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<AsyncView> out;
  for (auto& [seq, v] : rows) out.push_back(std::move(v));
  return out;
}

absl::Status AsyncQueue::Retry(const std::string& call_id) {
  Impl& q = *impl_;
  {
    std::lock_guard<std::mutex> l(q.mu);
    auto it = q.entries.find(call_id);
    if (it == q.entries.end())
      return absl::NotFoundError(
          absl::StrCat("no async call ", call_id, " (it may have completed)"));
    if (it->second.state != AsyncState::kDead)
      return absl::FailedPreconditionError(
          absl::StrCat("async call ", call_id, " is ",
                       AsyncStateName(it->second.state), ", not dead"));
  }
  auto r = q.Read(call_id);
  if (!r.ok()) return r.status();
  r->next_ms = NowMs();
  r->last_error.clear();
  if (r->has_result && !r->failed) {
    // It ran; only its callback failed.
    r->state = AsyncState::kCallback;
    r->callback_attempts = 0;
  } else {
    r->state = AsyncState::kQueued;
    r->attempts = 0;
    r->callback_attempts = 0;
    r->has_result = false;
    r->failed = false;
    r->result_headers.clear();
    r->result_body.clear();
  }
  if (auto s = q.Write(*r, store::Durability::kSynced); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> l(q.mu);
    q.PutLocked(*r);
  }
  q.Kick();
  q.callback_cv.notify_one();
  return absl::OkStatus();
}

absl::StatusOr<size_t> AsyncQueue::RetryAll(const AsyncFilter& filter) {
  AsyncFilter dead = filter;
  dead.any_state = false;
  dead.state = AsyncState::kDead;
  size_t n = 0;
  for (const auto& v : List(dead)) {
    auto s = Retry(v.call_id);
    if (s.ok()) {
      ++n;
    } else if (!absl::IsNotFound(s) && !absl::IsFailedPrecondition(s)) {
      return s;
    }
  }
  return n;
}

absl::Status AsyncQueue::Remove(const std::string& call_id) {
  Impl& q = *impl_;
  {
    std::lock_guard<std::mutex> l(q.mu);
    auto it = q.entries.find(call_id);
    if (it == q.entries.end())
      return absl::NotFoundError(absl::StrCat("no async call ", call_id));
    if (it->second.running)
      return absl::FailedPreconditionError(absl::StrCat(
          "async call ", call_id, " is running: remove it once it finished"));
    // Out of the due sets first, so that nothing starts it meanwhile.
    q.UnindexLocked(call_id, it->second);
    it->second.running = true;
  }
  store::WriteBatch b;
  b.Delete(store::Table::kAsyncQueue, call_id);
  auto s = q.store->Write(b);
  std::lock_guard<std::mutex> l(q.mu);
  auto it = q.entries.find(call_id);
  if (!s.ok()) {
    it->second.running = false;
    q.IndexLocked(call_id, it->second);
    return s;
  }
  q.EraseLocked(call_id);
  return absl::OkStatus();
}

std::string AsyncQueue::RenderMetrics() const {
  struct Row {
    uint64_t depth = 0, dead = 0;
    uint32_t inflight = 0;
    int64_t oldest = 0;
    uint64_t completed = 0, retried = 0, dead_total = 0, callbacks = 0;
  };
  std::map<std::string, Row> rows;  // by label
  int64_t now = NowMs();
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (const auto& [id, e] : impl_->entries) {
      Row& row = rows[FnLabel(e.ns, e.name)];
      if (e.state == AsyncState::kDead) {
        ++row.dead;
        continue;
      }
      ++row.depth;
      if (row.oldest == 0 || e.enqueued_ms < row.oldest)
        row.oldest = e.enqueued_ms;
    }
    for (const auto& [key, f] : impl_->fns) {
      size_t slash = key.find('/');
      Row& row = rows[FnLabel(key.substr(0, slash), key.substr(slash + 1))];
      row.inflight = f.inflight;
      row.completed = f.completed;
      row.retried = f.retried;
      row.dead_total = f.dead;
      row.callbacks = f.callbacks;
    }
  }
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help,
                    auto value) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                    type, "\n");
    for (const auto& [label, row] : rows) value(name, label, row);
  };
  auto line = [&](const char* name, const std::string& label,
                  const std::string& extra, auto v) {
    absl::StrAppend(&out, name, "{function_name=\"", label, "\"", extra, "} ",
                    v, "\n");
  };
  family("silt_async_queue_depth", "gauge",
         "Accepted async calls not yet completed (not dead letters).",
         [&](const char* n, const std::string& lb, const Row& r) {
           line(n, lb, "", r.depth);
         });
  family("silt_async_oldest_age_seconds", "gauge",
         "Age of the oldest async call waiting.",
         [&](const char* n, const std::string& lb, const Row& r) {
           line(n, lb, "",
                absl::StrFormat("%.3f",
                                r.oldest ? (now - r.oldest) / 1000.0 : 0.0));
         });
  family("silt_async_in_flight", "gauge", "Async calls running now.",
         [&](const char* n, const std::string& lb, const Row& r) {
           line(n, lb, "", r.inflight);
         });
  family("silt_async_dead_letters", "gauge",
         "Async calls given up on (silt async retry puts them back).",
         [&](const char* n, const std::string& lb, const Row& r) {
           line(n, lb, "", r.dead);
         });
  family("silt_async_runs_total", "counter",
         "Ends of async runs since the gateway started, by outcome.",
         [&](const char* n, const std::string& lb, const Row& r) {
           line(n, lb, ",outcome=\"completed\"", r.completed);
           line(n, lb, ",outcome=\"retried\"", r.retried);
           line(n, lb, ",outcome=\"dead\"", r.dead_total);
         });
  family("silt_async_callbacks_total", "counter",
         "Callbacks delivered since the gateway started.",
         [&](const char* n, const std::string& lb, const Row& r) {
           line(n, lb, "", r.callbacks);
         });
  return out;
}

}  // namespace silt::gateway
