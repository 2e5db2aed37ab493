// GPU proclet moves (GpuProclets::Migrate, AdoptPeer): pre-copy while the
// proclet serves, then a pause at a kernel boundary for what was written
// since; the target is a second process here (another backend of this node)
// or a peer's data port (PeerOp::kGpuAdopt, a conversation of GpuAdoptStep
// frames).
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "frames.h"
#include "gpu_proclet.h"
#include "gpu_proclets.h"
#include "silt/gpu_wire.h"

namespace silt::invoker {

using gpu_internal::ClearOnExit;
using gpu_internal::CodeOf;
using gpu_internal::kPrecopyPartBytes;
using gpu_internal::kPrecopyPasses;
using gpu_internal::MovingRequest;
using gpu_internal::MsSince;
using gpu_internal::ParseInfo;
using gpu_internal::PrecopyRequest;
using gpu_internal::ProcletKey;
using gpu_internal::Reply;
using gpu_internal::Sv;
using wire::GpuOp;
using wire::StateCode;

std::string GpuProclets::AdoptPeer(wire::Reader& r, PeerStream& stream) {
  std::string_view ns, function, name, backend;
  uint64_t memory_limit;
  if (!r.Str(&ns) || !r.Str(&function) || !r.Str(&name) ||
      !r.U64(&memory_limit) || !r.Str(&backend) ||
      !wire::ValidStructureName(name))
    return {};  // malformed: the connection ends
  auto p = Start(std::string(ns), std::string(function), std::string(name),
                 memory_limit, std::string(backend));
  if (!p.ok())
    return Reply(
        StateCode::kUnavailable,
        absl::StrCat("starting the GPU proclet here: ", p.status().message()));
  // Started: which backend and device it got (the source's callbacks hear
  // of them before the move ends).
  {
    GpuProcletInfo started = (*p)->Info();
    std::string ready = Reply(StateCode::kOk);
    wire::Writer w(&ready);
    w.Str(started.backend);
    w.Str(started.device);
    if (!stream.reply(ready).ok()) return {};
  }
  // Its state's parts, each into the process as it comes; the first failure
  // is the commit's answer. Until then nobody calls it, and it ends (with
  // *p) if the source gives up.
  std::string failed, frame, part;
  double inject_ms = 0;
  for (;;) {
    if (!stream.next(&frame).ok()) return {};
    wire::Reader f(frame);
    uint8_t step;
    uint64_t n;
    if (!f.U8(&step) || !f.U64(&n) || n > (uint64_t{1} << 40) ||
        (step != static_cast<uint8_t>(GpuAdoptStep::kPart) &&
         step != static_cast<uint8_t>(GpuAdoptStep::kCommit) &&
         step != static_cast<uint8_t>(GpuAdoptStep::kFlush)))
      return {};
    if (step == static_cast<uint8_t>(GpuAdoptStep::kFlush)) {
      if (n != 0 ||
          !stream.reply(failed.empty() ? Reply(StateCode::kOk) : failed).ok())
        return {};
      continue;
    }
    part.resize(1 + n);
    part[0] = static_cast<char>(GpuOp::kInject);
    if (!stream.read_raw(part.data() + 1, n).ok()) return {};
    const auto start = Clock::now();
    if (failed.empty()) {
      std::string done = (*p)->Exchange(part);
      if (CodeOf(done) != StateCode::kOk) failed = std::move(done);
    }
    if (step == static_cast<uint8_t>(GpuAdoptStep::kPart)) continue;
    if (!failed.empty()) return failed;
    inject_ms = MsSince(start);
    break;
  }
  GpuProcletInfo info = (*p)->Info();
  {
    const std::string key = ProcletKey(ns, function, name);
    absl::MutexLock lock(&mu_);
    if (auto it = proclets_.find(key);
        it != proclets_.end() && !it->second->lost)
      return Reply(StateCode::kUnavailable,
                   "this node holds that GPU proclet already");
    proclets_[key] = *p;
    moved_.erase(key);
    where_[key] = options_.data_address();
  }
  std::string out(1, static_cast<char>(StateCode::kOk));
  wire::Writer w(&out);
  w.Str(info.backend);
  w.Str(info.device);
  w.U64(static_cast<uint64_t>(inject_ms * 1000));
  return out;
}

// Where a move sends the proclet's state: a second process here (onto
// another backend of this node), or a peer's data port (kGpuAdopt).
namespace {

// The target's reply to a step of the conversation, past its code:
// Unavailable when the connection is gone, FailedPrecondition (`refused`
// and its message) when it did not answer kOk.
absl::StatusOr<std::string> ReadReply(PeerConn& conn,
                                      const std::string& address,
                                      absl::string_view refused) {
  std::string reply;
  if (!conn.reader->Next(&reply).ok() || reply.empty())
    return absl::UnavailableError(
        absl::StrCat("lost the connection to ", address, " while moving"));
  if (CodeOf(reply) != StateCode::kOk)
    return absl::FailedPreconditionError(
        absl::StrCat(refused, Sv(std::string_view(reply).substr(1))));
  return reply.substr(1);
}

}  // namespace

struct GpuProclets::MoveTarget {
  std::string address;
  std::string backend, device;  // what its process runs on
  std::shared_ptr<Proclet> local;
  std::unique_ptr<PeerConn> conn;
  absl::Status failed;  // the first part the local process refused
};

absl::Status GpuProclets::BeginMove(const Proclet& p, const std::string& target,
                                    const std::string& backend,
                                    MoveTarget* to) {
  to->address = target;
  if (target == options_.data_address()) {
    auto q = Start(p.ns, p.function, p.name, p.memory_limit, backend);
    if (!q.ok()) return q.status();
    to->local = *std::move(q);
    GpuProcletInfo started = to->local->Info();
    to->backend = started.backend;
    to->device = started.device;
    return absl::OkStatus();
  }
  to->conn = peers_.Take(target);
  if (!to->conn)
    return absl::UnavailableError(
        absl::StrCat("cannot reach the target node's data port ", target));
  std::string frame;
  wire::Writer w(&frame);
  w.U8(static_cast<uint8_t>(PeerOp::kGpuAdopt));
  w.Str(p.ns);
  w.Str(p.function);
  w.Str(p.name);
  w.U64(p.memory_limit);
  w.Str(backend);
  if (!WriteBytesFrame(to->conn->fd, frame).ok())
    return absl::UnavailableError(
        absl::StrCat("lost the connection to ", target, " while moving"));
  auto started =
      ReadReply(*to->conn, target, "the target cannot host the GPU proclet: ");
  if (!started.ok()) return started.status();
  wire::Reader r(*started);
  std::string_view started_backend, started_device;
  if (r.Str(&started_backend) && r.Str(&started_device)) {
    to->backend = started_backend;
    to->device = started_device;
  }
  return absl::OkStatus();
}

absl::Status GpuProclets::SendPart(MoveTarget& to, GpuAdoptStep step,
                                   std::string_view state) {
  if (to.local) {
    if (!to.failed.ok()) return absl::OkStatus();  // said at the commit
    const char op = static_cast<char>(GpuOp::kInject);
    std::string done = to.local->Exchange(std::string_view(&op, 1), state);
    if (CodeOf(done) != StateCode::kOk)
      to.failed = absl::FailedPreconditionError(
          absl::StrCat("the target backend refused the state: ",
                       Sv(std::string_view(done).substr(1))));
    return absl::OkStatus();
  }
  std::string frame;
  wire::Writer w(&frame);
  w.U8(static_cast<uint8_t>(step));
  w.U64(state.size());
  if (!WriteBytesFrame(to.conn->fd, frame).ok() ||
      !WriteAll(to.conn->fd, state).ok())
    return absl::UnavailableError(
        absl::StrCat("lost the connection to ", to.address, " while moving"));
  return absl::OkStatus();
}

absl::Status GpuProclets::FlushMove(MoveTarget& to) {
  if (to.local) return to.failed;  // its parts were applied as they went
  std::string frame;
  wire::Writer w(&frame);
  w.U8(static_cast<uint8_t>(GpuAdoptStep::kFlush));
  w.U64(0);
  if (!WriteBytesFrame(to.conn->fd, frame).ok())
    return absl::UnavailableError(
        absl::StrCat("lost the connection to ", to.address, " while moving"));
  return ReadReply(*to.conn, to.address,
                   "the target refused the GPU proclet's state: ")
      .status();
}

absl::Status GpuProclets::CommitMove(MoveTarget& to, std::string_view delta,
                                     GpuMoveResult* m) {
  const auto start = Clock::now();
  if (auto s = SendPart(to, GpuAdoptStep::kCommit, delta); !s.ok()) return s;
  if (to.local) {
    if (!to.failed.ok()) return to.failed;
    m->inject_ms = MsSince(start);
    m->to_backend = to.backend;  // as BeginMove found it started
    m->to_device = to.device;
    return absl::OkStatus();
  }
  auto committed =
      ReadReply(*to.conn, to.address, "the target refused the GPU proclet: ");
  if (!committed.ok()) return committed.status();
  wire::Reader r(*committed);
  std::string_view to_backend, to_device;
  uint64_t inject_us = 0;
  if (!r.Str(&to_backend) || !r.Str(&to_device) || !r.U64(&inject_us))
    return absl::InternalError("bad reply from the target");
  peers_.Give(to.address, std::move(to.conn));
  m->to_backend = to_backend;
  m->to_device = to_device;
  m->inject_ms = inject_us / 1000.0;
  return absl::OkStatus();
}

absl::StatusOr<GpuMoveResult> GpuProclets::Migrate(const std::string& ns,
                                                   const std::string& function,
                                                   const std::string& name,
                                                   const std::string& target,
                                                   const std::string& backend) {
  auto held = HoldForChange(ns, function, name);
  if (!held.ok()) return held.status();
  std::shared_ptr<Proclet> p = *std::move(held);
  ClearOnExit not_moving{p->moving};
  GpuProcletInfo from;
  if (!ParseInfo(p->Exchange(std::string(1, char(GpuOp::kInfo))), &from))
    return absl::FailedPreconditionError(
        "the GPU proclet does not answer (its process ended?)");
  GpuMoveResult m;
  m.from_backend = from.backend;
  m.bytes = from.memory_used;
  MoveTarget to;
  if (auto s = BeginMove(*p, target, backend, &to); !s.ok()) return s;
  // The function's reconfiguration callbacks hear of the move before it
  // ends (kMoving); one called off is undone (kResume undoes it in the
  // pause).
  p->Exchange(MovingRequest(to.backend.empty() ? backend : to.backend,
                            to.device, p->memory_limit));
  struct CallOff {
    Proclet& p;
    bool moved = false;
    ~CallOff() {
      if (!moved) p.Exchange(MovingRequest("", "", 0));
    }
  } call_off{*p};

  // Parts a pass may take: its allocation's worth and one per buffer, with
  // room to spare; a proclet that keeps answering "not done" is stuck.
  const uint64_t max_parts =
      from.memory_limit / kPrecopyPartBytes + (uint64_t{1} << 16);
  // Pre-copy: the buffers go a part at a time while calls go on between the
  // parts; then again what was written meanwhile, while that shrinks.
  const auto precopy_start = Clock::now();
  bool restart = true;
  uint64_t last_pass = ~uint64_t{0};
  for (int pass = 0; pass < kPrecopyPasses; ++pass) {
    uint64_t pass_bytes = 0, parts = 0;
    for (bool done = false; !done;) {
      if (++parts > max_parts)
        return absl::InternalError(
            "the GPU proclet's pre-copy does not end (its process is stuck?)");
      std::string part = p->Exchange(PrecopyRequest(restart));
      restart = false;
      if (CodeOf(part) != StateCode::kOk || part.size() < 2)
        return absl::FailedPreconditionError(
            absl::StrCat("copying the GPU proclet's state: ",
                         Sv(std::string_view(part).substr(1))));
      done = part[1] != 0;
      pass_bytes += part.size() - 2;
      if (auto s = SendPart(to, GpuAdoptStep::kPart,
                            std::string_view(part).substr(2));
          !s.ok())
        return s;
    }
    m.precopy_bytes += pass_bytes;
    if (pass_bytes < kPrecopyPartBytes || pass_bytes >= last_pass) break;
    last_pass = pass_bytes;
  }
  // The target has applied it all (not queued behind the pause).
  if (auto s = FlushMove(to); !s.ok()) return s;
  m.precopy_ms = MsSince(precopy_start);

  // The pause: calls wait on the proclet's lock from here on (at a kernel
  // boundary) while what was written since its pre-copy goes.
  const std::string key = ProcletKey(ns, function, name);
  std::unique_ptr<SandboxedProcess> ended;  // after the pause, unlocked
  {
    absl::MutexLock lock(&p->mu);
    const auto start = Clock::now();
    auto resume = [&](absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu) {
      p->ExchangeLocked(std::string(1, static_cast<char>(GpuOp::kResume)));
      return why;
    };
    // What was written since goes in parts too, so that taking one off the
    // device, sending one and putting one on overlap.
    uint64_t parts = 0;
    for (bool done = false; !done;) {
      if (++parts > max_parts)
        return resume(absl::InternalError(
            "the GPU proclet's pre-copy does not end (its process is stuck?)"));
      std::string part = p->ExchangeLocked(PrecopyRequest(false));
      if (CodeOf(part) != StateCode::kOk || part.size() < 2)
        return resume(absl::FailedPreconditionError(
            absl::StrCat("copying the GPU proclet's state: ",
                         Sv(std::string_view(part).substr(1)))));
      done = part[1] != 0;
      m.paused_bytes += part.size() - 2;
      if (auto s = SendPart(to, GpuAdoptStep::kPart,
                            std::string_view(part).substr(2));
          !s.ok())
        return resume(s);
    }
    std::string delta = p->ExchangeLocked(
        std::string{static_cast<char>(GpuOp::kExtract), char{1}});
    if (CodeOf(delta) != StateCode::kOk)
      return resume(absl::InternalError(
          absl::StrCat("taking the GPU proclet's state: ",
                       Sv(std::string_view(delta).substr(1)))));
    m.extract_ms = MsSince(start);
    m.paused_bytes += delta.size() - 1;
    if (auto s = CommitMove(to, std::string_view(delta).substr(1), &m); !s.ok())
      return resume(s);
    {
      absl::MutexLock l(&mu_);
      if (to.local) {
        proclets_[key] = to.local;
      } else {
        if (auto it = proclets_.find(key);
            it != proclets_.end() && it->second == p)
          proclets_.erase(it);
        moved_[key] = {target, Clock::now()};
        where_[key] = target;
      }
    }
    // Late callers waiting on this proclet follow it.
    p->moved_to = target;
    if (p->channel >= 0) close(p->channel);
    p->channel = -1;
    ended = std::move(p->proc);
    m.pause_ms = MsSince(start);
    call_off.moved = true;
  }
  ended.reset();  // its process, killed and reaped with nobody waiting
  return m;
}

}  // namespace silt::invoker
