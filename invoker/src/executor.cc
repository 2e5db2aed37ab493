#include "executor.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <deque>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "hosted_shard.h"
#include "silt/state_wire.h"

namespace silt::invoker {

using wire::JobKind;
using wire::StateCode;
using wire::StateKind;
using wire::StateOp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxJobsPerNamespace = 64;
constexpr auto kKeepFinished = std::chrono::minutes(10);

const char* JobName(JobKind k) {
  switch (k) {
    case JobKind::kParallelFor:
      return "ParallelFor";
    case JobKind::kMap:
      return "Map";
    case JobKind::kSpawn:
      return "Spawn";
  }
  return "job";
}

std::string Request(StateOp op, std::string_view name,
                    const std::function<void(wire::Writer&)>& args = {}) {
  std::string req;
  wire::WriteRequestHeader(&req, op, StateKind::kVector, name);
  wire::Writer w(&req);
  if (args) args(w);
  return req;
}

// The u64 of an ok reply, else the reply itself as the error.
absl::StatusOr<uint64_t> U64Reply(const std::string& reply,
                                  std::string* error) {
  if (reply.empty() || reply[0] != 0) {
    *error = reply.empty() ? Error(StateCode::kInternal, "empty reply") : reply;
    return absl::UnknownError("");
  }
  wire::Reader r(std::string_view(reply).substr(1));
  uint64_t v;
  if (!r.U64(&v)) {
    *error = Error(StateCode::kInternal, "bad reply");
    return absl::UnknownError("");
  }
  return v;
}

}  // namespace

// A part of the input not handed out yet, and the node holding its data.
// For a vector, [first, end) are element indexes; for a map, scan
// positions of the entries whose key hash lies in its shard's [lo, hi).
struct Executor::Piece {
  uint64_t first, end;
  std::string home;
  uint64_t lo = 0, hi = 0;
};

struct Executor::Job {
  uint64_t id = 0;
  std::string ns, function;
  TaskTarget target;
  JobKind kind = JobKind::kSpawn;
  StateKind input_kind = StateKind::kVector;
  std::string task, input, output, argument;
  bool retriable = false;

  struct Pace {
    double per_second = 0;  // elements, smoothed
  };

  absl::Mutex mu;
  std::deque<Piece> pending ABSL_GUARDED_BY(mu);
  uint64_t remaining ABSL_GUARDED_BY(mu) = 0;              // elements not done
  std::map<std::string, int> want ABSL_GUARDED_BY(mu);     // slots per node
  std::map<std::string, int> running ABSL_GUARDED_BY(mu);  // share threads
  std::map<std::string, Pace> pace ABSL_GUARDED_BY(mu);
  // Where the work ran: elements and shares done, by node address.
  std::map<std::string, std::pair<uint64_t, uint32_t>> ran ABSL_GUARDED_BY(mu);
  // Elements done so far, at each share's end (unix µs; the first 4096).
  std::vector<std::pair<int64_t, uint64_t>> progress ABSL_GUARDED_BY(mu);
  uint64_t done_elements ABSL_GUARDED_BY(mu) = 0;
  std::set<std::string> excluded ABSL_GUARDED_BY(mu);
  std::map<std::string, std::string> names ABSL_GUARDED_BY(mu);  // by address
  bool changed ABSL_GUARDED_BY(mu) = false;  // wakes the job's thread
  bool finished ABSL_GUARDED_BY(mu) = false;
  StateCode code ABSL_GUARDED_BY(mu) = StateCode::kOk;
  std::string outcome ABSL_GUARDED_BY(mu);  // the result, or the error
  Clock::time_point ended ABSL_GUARDED_BY(mu);
  std::vector<std::thread> threads ABSL_GUARDED_BY(mu);
  std::set<int> remote_fds ABSL_GUARDED_BY(mu);  // shut down on stop

  // Ends the job with an error (the first one counts).
  void Fail(StateCode c, std::string why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (finished) return;
    code = c;
    outcome = std::move(why);
    Finish();
  }
  // Ends the job; its outcome is what `code` and `outcome` say.
  void Finish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    finished = true;
    ended = Clock::now();
    pending.clear();
    changed = true;
  }
  std::string NodeName(const std::string& addr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = names.find(addr);
    return it == names.end() ? addr : it->second;
  }
};

Executor::Executor(ExecutorOptions options)
    : options_(std::move(options)), peers_(options_.hello, 16) {}

Executor::~Executor() {
  std::map<uint64_t, std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    jobs = jobs_;
  }
  for (auto& [id, job] : jobs) {
    absl::MutexLock l(&job->mu);
    job->Fail(StateCode::kUnavailable, "the node running the job stopped");
    for (int fd : job->remote_fds) shutdown(fd, SHUT_RDWR);
  }
  std::map<uint64_t, std::thread> threads;
  {
    absl::MutexLock l(&mu_);
    threads.swap(threads_);
  }
  for (auto& [id, t] : threads) t.join();
}

size_t Executor::running() const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [id, job] : jobs_) {
    absl::MutexLock jl(&job->mu);
    if (!job->finished) ++n;
  }
  return n;
}

std::string Executor::Handle(const std::string& ns, const std::string& function,
                             std::string_view request) {
  if (!request.empty() && request[0] == static_cast<char>(StateOp::kJobWait))
    return Wait(ns, request);
  return Start(ns, function, request);
}

std::string Executor::Start(const std::string& ns, const std::string& function,
                            std::string_view request) {
  wire::Reader r(request);
  StateOp op;
  StateKind kind;
  std::string_view input;
  uint8_t job_kind, flags;
  std::string_view task, output, argument;
  uint64_t first, count;
  if (!wire::ReadRequestHeader(&r, &op, &kind, &input) || !r.U8(&job_kind) ||
      !r.Str(&task) || !r.Str(&output) || !r.U64(&first) || !r.U64(&count) ||
      !r.Str(&argument) || !r.U8(&flags))
    return Error(StateCode::kInvalid, "malformed job request");
  auto job = std::make_shared<Job>();
  job->ns = ns;
  job->function = function;
  job->kind = static_cast<JobKind>(job_kind);
  job->task = std::string(task);
  job->input = std::string(input);
  job->output = std::string(output);
  job->argument = std::string(argument);
  if (job->kind != JobKind::kParallelFor && job->kind != JobKind::kMap &&
      job->kind != JobKind::kSpawn)
    return Error(StateCode::kInvalid, "unknown job kind");
  if (task.empty()) return Error(StateCode::kInvalid, "a job names its task");
  job->retriable =
      job->kind == JobKind::kMap || (flags & wire::kJobIdempotent) != 0;
  job->target = options_.target(ns, function);

  job->input_kind = kind;
  if (job->kind != JobKind::kSpawn && kind != StateKind::kMap &&
      kind != StateKind::kVector)
    return Error(StateCode::kInvalid,
                 "ParallelFor and Map run over a vector or a map");
  std::deque<Piece> pieces;
  uint64_t total = 1;
  if (job->kind == JobKind::kSpawn) {
    pieces.push_back({0, 1, options_.data_address});
  } else if (kind == StateKind::kMap) {
    std::string error = MapPieces(*job, first, count, &pieces, &total);
    if (!error.empty()) return error;
  } else {
    std::string error = VectorPieces(*job, first, count, &pieces, &total);
    if (!error.empty()) return error;
  }

  {
    absl::MutexLock l(&mu_);
    if (stopping_)
      return Error(StateCode::kUnavailable, "the node is stopping");
    auto now = Clock::now();
    size_t in_ns = 0;
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      absl::MutexLock jl(&it->second->mu);
      if (it->second->finished && now - it->second->ended > kKeepFinished) {
        it = jobs_.erase(it);
        continue;
      }
      if (it->second->ns == ns && !it->second->finished) ++in_ns;
      ++it;
    }
    if (in_ns >= kMaxJobsPerNamespace)
      return Error(StateCode::kTooLarge,
                   absl::StrCat("namespace ", ns, " already runs ", in_ns,
                                " jobs on this node; wait for some to end"));
    job->id = next_id_++;
    {
      absl::MutexLock jl(&job->mu);
      job->pending = std::move(pieces);
      job->remaining = total;
      if (total == 0) job->Finish();
    }
    jobs_[job->id] = job;
    for (uint64_t id : ended_threads_) {
      threads_[id].join();
      threads_.erase(id);
    }
    ended_threads_.clear();
    threads_[job->id] = std::thread([this, job] {
      Run(job);
      absl::MutexLock l(&mu_);
      ended_threads_.push_back(job->id);
    });
  }
  std::string reply(1, '\0');
  wire::Writer(&reply).U64(job->id);
  return reply;
}

// A job over a vector: its range, cut where the layout's shards meet.
std::string Executor::VectorPieces(Job& job, uint64_t first, uint64_t count,
                                   std::deque<Piece>* pieces, uint64_t* total) {
  if (!wire::ValidStructureName(job.input))
    return Error(StateCode::kInvalid,
                 absl::StrCat("invalid vector name \"", job.input, "\""));
  if (job.kind == JobKind::kMap && !wire::ValidStructureName(job.output))
    return Error(
        StateCode::kInvalid,
        absl::StrCat("invalid output vector name \"", job.output, "\""));
  auto layout = options_.layout(job.ns, job.input);
  if (!layout.ok()) {
    if (absl::IsNotFound(layout.status()))
      return Error(
          StateCode::kNotFound,
          absl::StrCat("no vector named \"", job.input, "\" in namespace ",
                       job.ns, ": a job runs over a vector that exists"));
    return Error(CodeOf(layout.status()), layout.status().message());
  }
  if (layout->kind() != proclets::v1::KIND_VECTOR)
    return Error(
        StateCode::kWrongKind,
        absl::StrCat("\"", job.input, "\" is a ", KindName(layout->kind()),
                     ", not a vector: ParallelFor and Map run over "
                     "vectors"));
  std::string error;
  auto size = U64Reply(options_.state(job.ns, job.function,
                                      Request(StateOp::kVecSize, job.input)),
                       &error);
  if (!size.ok()) return error;
  uint64_t end = count == wire::kAll ? *size : first + count;
  if (first > *size || end > *size || end < first)
    return Error(StateCode::kNotFound,
                 absl::StrCat("elements [", first, ", ",
                              count == wire::kAll ? "end" : absl::StrCat(end),
                              ") are not all in \"", job.input, "\" (", *size,
                              " elements)"));
  if (job.kind == JobKind::kMap) {
    auto grown =
        U64Reply(options_.state(job.ns, job.function,
                                Request(StateOp::kVecExtend, job.output,
                                        [&](wire::Writer& w) { w.U64(end); })),
                 &error);
    if (!grown.ok()) return error;
  }
  for (const auto& s : layout->shards()) {
    uint64_t lo = std::max(first, s.lo());
    uint64_t hi = std::min(end, s.hi());
    if (lo < hi) pieces->push_back({lo, hi, s.data_address()});
  }
  std::sort(pieces->begin(), pieces->end(),
            [](const Piece& a, const Piece& b) { return a.first < b.first; });
  *total = end - first;
  // Cover what the layout did not (it may be stale): run it anywhere.
  std::deque<Piece> whole;
  uint64_t at = first;
  for (auto& p : *pieces) {
    if (p.first > at) whole.push_back({at, p.first, ""});
    whole.push_back(p);
    at = p.end;
  }
  if (at < end) whole.push_back({at, end, ""});
  pieces->swap(whole);
  return {};
}

// A job over a map: every shard's scan positions, each piece at home where
// the shard is. The layout may be stale: the router joins the answers of
// the shards a piece's hash range covers now.
std::string Executor::MapPieces(Job& job, uint64_t first, uint64_t count,
                                std::deque<Piece>* pieces, uint64_t* total) {
  if (first != 0 || count != wire::kAll)
    return Error(StateCode::kInvalid,
                 "a job over a map runs over all of it (no first or count)");
  if (!wire::ValidStructureName(job.input))
    return Error(StateCode::kInvalid,
                 absl::StrCat("invalid map name \"", job.input, "\""));
  if (job.kind == JobKind::kMap && !wire::ValidStructureName(job.output))
    return Error(StateCode::kInvalid,
                 absl::StrCat("invalid output map name \"", job.output, "\""));
  auto layout = options_.layout(job.ns, job.input);
  if (!layout.ok()) {
    if (absl::IsNotFound(layout.status()))
      return Error(
          StateCode::kNotFound,
          absl::StrCat("no map named \"", job.input, "\" in namespace ", job.ns,
                       ": a job runs over a map that exists"));
    return Error(CodeOf(layout.status()), layout.status().message());
  }
  if (layout->kind() != proclets::v1::KIND_MAP)
    return Error(
        StateCode::kWrongKind,
        absl::StrCat("\"", job.input, "\" is a ", KindName(layout->kind()),
                     ", not a map: open it as a Vector to run a job "
                     "over it"));
  if (job.kind == JobKind::kMap) {
    auto out = options_.layout(job.ns, job.output);
    if (out.ok() && out->kind() != proclets::v1::KIND_MAP)
      return Error(StateCode::kWrongKind,
                   absl::StrCat("the output \"", job.output, "\" is a ",
                                KindName(out->kind()), ", not a map"));
    if (!out.ok() && !absl::IsNotFound(out.status()))
      return Error(CodeOf(out.status()), out.status().message());
  }
  for (const auto& s : layout->shards())
    pieces->push_back({0, wire::kScanEnd, s.data_address(), s.lo(), s.hi()});
  *total = pieces->size() * wire::kScanEnd;
  return {};
}

std::string Executor::Wait(const std::string& ns, std::string_view request) {
  wire::Reader r(request);
  StateOp op;
  StateKind kind;
  std::string_view name;
  uint64_t id;
  uint32_t timeout_ms;
  if (!wire::ReadRequestHeader(&r, &op, &kind, &name) || !r.U64(&id) ||
      !r.U32(&timeout_ms))
    return Error(StateCode::kInvalid, "malformed job wait");
  std::shared_ptr<Job> job;
  {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(id);
    if (it != jobs_.end() && it->second->ns == ns) job = it->second;
  }
  if (!job)
    return Error(StateCode::kNotFound,
                 absl::StrCat("no job ", id,
                              " (its outcome was already taken, or it "
                              "never existed here)"));
  std::string reply;
  {
    absl::MutexLock l(&job->mu);
    job->mu.AwaitWithTimeout(absl::Condition(&job->finished),
                             absl::Milliseconds(timeout_ms));
    if (!job->finished)
      return Error(StateCode::kRetry, "the job is still running");
    if (job->code == StateCode::kOk) {
      reply.assign(1, '\0');
      wire::Writer w(&reply);
      w.Str(job->outcome);
      w.U32(static_cast<uint32_t>(job->ran.size()));
      for (const auto& [addr, done] : job->ran) {
        w.Str(job->NodeName(addr));
        w.U64(done.first);
        w.U32(done.second);
      }
      w.U32(static_cast<uint32_t>(job->progress.size()));
      for (const auto& [at, done] : job->progress) {
        w.U64(static_cast<uint64_t>(at));
        w.U64(done);
      }
    } else {
      reply = Error(job->code, job->outcome);
    }
  }
  absl::MutexLock l(&mu_);
  jobs_.erase(id);
  return reply;
}

// The job's own thread: keeps each node's share threads in step with the
// CPU it has to spare, until the work is done or the job failed.
void Executor::Run(std::shared_ptr<Job> job) {
  Job& j = *job;
  while (true) {
    auto view = options_.view->Get();
    {
      absl::MutexLock l(&j.mu);
      if (!j.finished && j.pending.empty() && j.remaining == 0)
        j.Finish();  // done: ok, with the result
      if (j.finished) break;
      // Slots per node: its cores not busy with other work. This node is a
      // candidate even before the gateway has described the cluster.
      std::map<std::string, int> want;
      bool self_seen = false;
      for (const NodeLoad& n : *view) {
        j.names[n.data_address] = n.name;
        if (n.data_address == options_.data_address) self_seen = true;
        if (n.draining || j.excluded.contains(n.data_address)) continue;
        int ours = j.running[n.data_address];
        double others = std::max(0.0, n.cpu_used - ours);
        int slots = static_cast<int>(std::max<double>(
            n.cores > 0 ? 1.0 : 0.0, static_cast<double>(n.cores) - others));
        want[n.data_address] = slots;
      }
      if (!self_seen && !j.excluded.contains(options_.data_address))
        want[options_.data_address] =
            std::max(1u, std::thread::hardware_concurrency());
      // Hot nodes (the rebalancer moved compute off them) get no new shares
      // while another node has slots: their running shares finish, the rest
      // of the range goes elsewhere within one share (~share_target).
      bool cool_slots = false;
      for (const NodeLoad& n : *view)
        cool_slots = cool_slots || (!n.hot && want[n.data_address] > 0);
      if (cool_slots)
        for (const NodeLoad& n : *view)
          if (n.hot) want[n.data_address] = 0;
      if (j.kind == JobKind::kSpawn) {
        // One share: the node with the most CPU to spare (this one on a tie).
        std::string best = options_.data_address;
        int most = want.contains(best) ? want[best] : -1;
        for (auto& [addr, n] : want)
          if (n > most) best = addr, most = n;
        for (auto& [addr, n] : want) n = addr == best ? 1 : 0;
      }
      j.want = want;
      if (!j.pending.empty()) {
        bool any = false;
        for (auto& [addr, n] : want) {
          any = any || n > 0;
          while (j.running[addr] < n && !j.pending.empty()) {
            ++j.running[addr];
            j.threads.emplace_back(
                [this, job, addr = addr] { RunShares(job, addr); });
          }
        }
        int busy = 0;
        for (auto& [addr, n] : j.running) busy += n;
        if (!any && busy == 0)
          j.Fail(StateCode::kUnavailable,
                 absl::StrCat("no node can run ", JobName(j.kind), " task ",
                              j.task, " of ", j.function,
                              " (every node tried was lost, draining or "
                              "without the function)"));
      }
      j.changed = false;
      j.mu.AwaitWithTimeout(absl::Condition(&j.changed), absl::Milliseconds(5));
    }
  }
  std::vector<std::thread> threads;
  {
    absl::MutexLock l(&j.mu);
    threads.swap(j.threads);
  }
  for (auto& t : threads) t.join();
}

// One of `node`'s slots for the job: takes shares until the job is done,
// failed, or wants fewer slots there.
void Executor::RunShares(std::shared_ptr<Job> job, std::string node) {
  Job& j = *job;
  while (true) {
    Piece share;
    std::string call;
    {
      absl::MutexLock l(&j.mu);
      if (j.finished || j.pending.empty() || j.running[node] > j.want[node]) {
        --j.running[node];
        j.changed = true;
        return;
      }
      share = Take(j, node);
      wire::TaskCall t;
      t.kind = j.kind;
      t.task = j.task;
      t.input = j.input;
      t.output = j.output;
      t.argument = j.argument;
      t.first = share.first;
      t.count = share.end - share.first;
      t.input_kind = j.input_kind;
      t.lo = share.lo;
      t.hi = share.hi;
      // A share that runs long (its node slowed down) hands the rest back.
      if (j.kind != JobKind::kSpawn)
        t.budget_us = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(
                options_.share_target)
                .count());
      wire::WriteTaskCall(&call, t);
    }
    auto start = Clock::now();
    Outcome out = RunShare(j, node, call);
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    absl::MutexLock l(&j.mu);
    Account(j, node, share, out, secs);
  }
}

// The next share for `node`: from a piece whose data it holds if any, else
// from the largest piece; sized to the node's pace.
Executor::Piece Executor::Take(Job& j, const std::string& node) {
  size_t at = j.pending.size();
  uint64_t pending_total = 0;
  size_t largest = 0;
  for (size_t i = 0; i < j.pending.size(); ++i) {
    const auto& p = j.pending[i];
    pending_total += p.end - p.first;
    if (at == j.pending.size() && p.home == node) at = i;
    if (p.end - p.first > j.pending[largest].end - j.pending[largest].first)
      largest = i;
  }
  if (at == j.pending.size()) at = largest;
  Piece& piece = j.pending[at];
  uint64_t size = piece.end - piece.first;
  if (j.kind != JobKind::kSpawn) {
    int slots = 0;
    for (auto& [addr, n] : j.want) slots += n;
    slots = std::max(slots, 1);
    double pace = j.pace[node].per_second;
    // Before a node's pace is known: a few elements (they may be slow), or
    // a good part of a map's positions (an empty stretch costs nothing; a
    // share that runs long stops at its time budget anyway).
    uint64_t n =
        pace > 0
            ? static_cast<uint64_t>(
                  pace *
                  std::chrono::duration<double>(options_.share_target).count())
        : j.input_kind == StateKind::kMap
            ? pending_total / (4 * slots)
            : std::clamp<uint64_t>(pending_total / (4 * slots), 1, 64);
    // Never more than half of a fair share of what is left: the last shares
    // end together.
    n = std::min(n, std::max<uint64_t>(1, pending_total / (2 * slots)));
    size = std::clamp<uint64_t>(n, 1, size);
  }
  Piece share = piece;
  share.end = piece.first + size;
  piece.first += size;
  if (piece.first == piece.end) j.pending.erase(j.pending.begin() + at);
  return share;
}

Executor::Outcome Executor::RunShare(Job& j, const std::string& node,
                                     std::string_view call) {
  if (node == options_.data_address)
    return {Outcome::kReplied, options_.run_local(j.target, call)};
  auto conn = peers_.Take(node);
  if (!conn) return {Outcome::kNotSent, {}};
  timeval tv{};
  tv.tv_sec = j.target.timeout_ms / 1000 + 10;
  setsockopt(conn->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  {
    absl::MutexLock l(&j.mu);
    if (j.finished) return {Outcome::kNotSent, {}};
    j.remote_fds.insert(conn->fd);
  }
  Outcome out;
  if (!WriteBytesFrame(conn->fd, RunTaskFrame(j.target, call)).ok()) {
    out.how = Outcome::kNotSent;
  } else if (!conn->reader->Next(&out.reply).ok() || out.reply.empty()) {
    out.how = Outcome::kBroken;
  }
  {
    absl::MutexLock l(&j.mu);
    j.remote_fds.erase(conn->fd);
  }
  if (out.how == Outcome::kReplied) peers_.Give(node, std::move(conn));
  return out;
}

void Executor::Account(Job& j, const std::string& node, const Piece& share,
                       const Outcome& out, double secs) {
  j.changed = true;
  if (j.finished) return;  // failed meanwhile: this share's outcome is moot
  const uint64_t n = share.end - share.first;
  auto range = [&] {
    if (j.kind == JobKind::kSpawn) return std::string();
    if (j.input_kind == StateKind::kMap)
      return absl::StrCat(" (entries of key hashes [", share.lo, ", ", share.hi,
                          ") at scan positions [", share.first, ", ", share.end,
                          "))");
    return absl::StrCat(" (elements [", share.first, ", ", share.end, "))");
  };
  auto again = [&] {
    j.pending.push_front(share);
    j.excluded.insert(node);
  };
  if (out.how == Outcome::kNotSent ||
      (out.how == Outcome::kReplied &&
       static_cast<StateCode>(out.reply[0]) == StateCode::kRetry))
    return again();  // nothing ran there
  if (out.how == Outcome::kBroken) {
    if (j.retriable) return again();
    return j.Fail(
        StateCode::kUnavailable,
        absl::StrCat("node ", j.NodeName(node), " was lost while it ran ",
                     JobName(j.kind), " task ", j.task, range(),
                     "; it may have run in part, so the job stops (mark the "
                     "task idempotent in TaskOptions to have it run again "
                     "elsewhere)"));
  }
  auto code = static_cast<StateCode>(out.reply[0]);
  wire::Reader r(std::string_view(out.reply).substr(1));
  std::string_view result;
  if (code != StateCode::kOk)
    return j.Fail(code, absl::StrCat("compute proclet of ", j.function,
                                     " on node ", j.NodeName(node), range(),
                                     ": ", out.reply.substr(1)));
  if (!r.Str(&result))
    return j.Fail(StateCode::kInternal, "bad reply from a compute proclet");
  if (j.kind == JobKind::kSpawn) {
    j.outcome = std::string(result);
    j.remaining = 0;
    j.ran[node] = {1, 1};
    return;
  }
  // How far the share got (elements, or a map's positions), and for a map
  // the entries it saw.
  wire::Reader rr(result);
  uint64_t processed = 0, elements = 0;
  if (!rr.U64(&processed) || processed == 0 || processed > n ||
      (j.input_kind == StateKind::kMap && !rr.U64(&elements)))
    return j.Fail(
        StateCode::kInternal,
        absl::StrCat("compute proclet on node ", j.NodeName(node), range(),
                     " ran over ", processed, " elements instead of ", n));
  if (processed < n) {  // it ran out of time: the rest goes to whoever is free
    Piece rest = share;
    rest.first += processed;
    j.pending.push_front(rest);
  }
  if (j.input_kind != StateKind::kMap) elements = processed;
  j.remaining -= processed;
  j.done_elements += elements;
  if (j.progress.size() < 4096)
    j.progress.emplace_back(
        std::chrono::duration_cast<std::chrono::microseconds>(
            std::chrono::system_clock::now().time_since_epoch())
            .count(),
        j.done_elements);
  j.ran[node].first += elements;
  j.ran[node].second += 1;
  double rate = secs > 0 ? processed / secs : 0;
  auto& pace = j.pace[node].per_second;
  pace = pace == 0 ? rate : 0.5 * pace + 0.5 * rate;
}

}  // namespace silt::invoker
