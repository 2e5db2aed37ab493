// silt-worker: one function instance. Started by the invoker inside a sandbox
// with the channel to the invoker on fd 3. Reads its WorkerConfig, gets the
// function ready (loads the native bundle and runs its init, or starts the exec
// server), reports WorkerReady, then serves WorkerCalls: one at a time, or,
// for a native function that declared itself thread-safe (SILT_CONCURRENCY),
// up to its concurrency at once on threads of their own (CallThreads).
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>  // Boost 1.74 Asio under C++20 + GCC 12 needs this first.
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "channel.h"
#include "frames.h"
#include "invoker/proto/worker.pb.h"
#include "local_maps.h"
#include "proclets/function_library.h"
#include "ring_client.h"
#include "sandbox.h"
#include "silt/state_wire.h"
#include "state_http.h"

extern char** environ;

namespace silt::invoker {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using v1::WorkerCall;
using v1::WorkerConfig;
using v1::WorkerReply;

constexpr int kChannel = 3;
constexpr int kState = 4;  // the state connection to the invoker
// Largest body a call's Content-Length reserves room for up front (the
// gateway's default limit for a streamed body).
constexpr uint64_t kMaxAssembledReserve = uint64_t{1} << 30;

// The function's state service: requests go to the invoker on kState, one at
// a time (the handler may call from several threads), except map reads that
// a shard of this node answers in place (LocalMaps).
class StateLink {
 public:
  // Takes `fd` as kState (or closes the link when fd < 0).
  void Attach(int fd) {
    std::lock_guard<std::mutex> l(mu_);
    local_.Clear();
    ring_.Close();
    ring_tried_ = false;
    if (fd >= 0 && fd != kState) {
      dup3(fd, kState, O_CLOEXEC);
      close(fd);
    } else if (fd < 0) {
      close(kState);
    }
    open_ = fd >= 0;
    reader_ = std::make_unique<FrameReader>(kState, wire::kMaxFrameBytes);
  }
  const silt_state_api* api() { return &api_; }

 private:
  static int Call(void* host, const char* req, size_t len, void* out,
                  void (*append)(void*, const char*, size_t)) {
    auto* self = static_cast<StateLink*>(host);
    std::lock_guard<std::mutex> l(self->mu_);
    if (!self->open_) return -1;
    if (!self->local_.TryAnswer(std::string_view(req, len), &self->reply_) &&
        !self->Send(std::string_view(req, len)))
      return -1;
    append(out, self->reply_.data(), self->reply_.size());
    return 0;
  }
  // Through the mailbox when there is one (asked for on first use), else a
  // frame each way on the socketpair.
  bool Send(std::string_view req) {
    if (!ring_tried_) {
      ring_tried_ = true;
      std::string ask;
      wire::WriteRequestHeader(&ask, wire::StateOp::kShareRing,
                               wire::StateKind::kMap, "");
      std::vector<int> fds = Share(ask);
      if (fds.size() == 2) {
        ring_.Open(fds[0], fds[1]);
      } else {
        for (int fd : fds) close(fd);
      }
    }
    if (!ring_.usable(req.size())) return RoundTrip(req);
    switch (ring_.Call(req, &reply_, kState)) {
      case RingClient::Got::kReply:
        return true;
      case RingClient::Got::kOnSocket:
        if (reader_->Next(&reply_).ok()) return true;
        break;
      case RingClient::Got::kBroken:
        break;
    }
    open_ = false;
    return false;
  }
  bool RoundTrip(std::string_view req) {
    if (!WriteBytesFrame(kState, req).ok() || !reader_->Next(&reply_).ok()) {
      open_ = false;
      return false;
    }
    return true;
  }
  // kShareMap, kShareRing: the reply carries memory files (and nothing is
  // buffered past a reply: one request at a time). None unless it is kOk.
  std::vector<int> Share(std::string_view req) {
    std::vector<int> fds;
    if (!open_) return fds;
    if (!WriteBytesFrame(kState, req).ok() ||
        !ReadFrameWithFds(kState, wire::kMaxFrameBytes, &reply_, &fds).ok()) {
      open_ = false;
      return fds;
    }
    if (reply_.empty() || reply_[0] != 0) {
      for (int fd : fds) close(fd);
      fds.clear();
    }
    return fds;
  }
  std::mutex mu_;
  bool open_ = false;
  std::unique_ptr<FrameReader> reader_;
  std::string reply_;
  LocalMaps local_{[this](std::string_view req) { return Share(req); }};
  RingClient ring_;
  bool ring_tried_ = false;
  silt_state_api api_{this, &StateLink::Call};
};
StateLink g_state;

// The loopback state API of exec functions (null for native ones, which have
// the SDK). Its thread and sockets exist only while the worker serves: no
// checkpoint, parked worker or fork template may hold them.
std::unique_ptr<StateHttpServer> g_state_http;

// Starts it and points the function's processes at it (SILT_STATE_URL; a
// classic fprocess gets the environment of its call, an http-mode server that
// of its start, which stays valid because the port is kept).
void StartStateApi() {
  if (!g_state_http) return;
  uint16_t before = g_state_http->port();
  if (absl::Status s = g_state_http->Start(); !s.ok()) {
    fprintf(stderr, "silt-worker: no state API: %s\n",
            std::string(s.message()).c_str());
    unsetenv("SILT_STATE_URL");
    return;
  }
  if (before != 0 && g_state_http->port() != before)
    fprintf(stderr, "silt-worker: the state API moved from port %u to %u\n",
            before, g_state_http->port());
  setenv("SILT_STATE_URL", g_state_http->url().c_str(), 1);
}

void StopStateApi() {
  if (g_state_http) g_state_http->Stop();
}

void LogLine(const std::string& msg) {
  // Go's log format, as the OpenFaaS watchdogs write it.
  time_t now = time(nullptr);
  struct tm tm;
  localtime_r(&now, &tm);
  char ts[32];
  strftime(ts, sizeof(ts), "%Y/%m/%d %H:%M:%S", &tm);
  fprintf(stderr, "%s %s\n", ts, msg.c_str());
  fflush(stderr);
}

std::vector<std::string> SplitCommand(const std::string& cmd) {
  return absl::StrSplit(cmd, ' ', absl::SkipEmpty());
}

WorkerReply Ok(std::string body = "") {
  WorkerReply r;
  r.set_status(200);
  r.set_body(std::move(body));
  return r;
}

// A task that could not run: a task reply (StateCode byte, message).
WorkerReply TaskError(absl::string_view msg) {
  return Ok(absl::StrCat(
      std::string(1, static_cast<char>(wire::StateCode::kInvalid)), msg));
}

WorkerReply Error(int status, const std::string& msg) {
  WorkerReply r;
  r.set_status(status);
  r.set_error(msg);
  r.set_body(msg + "\n");
  auto* h = r.add_headers();
  h->set_name("Content-Type");
  h->set_value("text/plain; charset=utf-8");
  return r;
}

// Frames to the invoker go out whole, one at a time: calls that run at once
// write their replies and parts from their own threads.
std::mutex g_channel_write_mu;

// Sends a reply (or a part of one) for call `seq`. False when the invoker is
// gone.
bool SendReply(WorkerReply& r, uint64_t seq) {
  r.set_seq(seq);
  std::lock_guard<std::mutex> l(g_channel_write_mu);
  return WriteFrame(kChannel, r).ok();
}

// The largest body part one frame carries: a bigger write goes as several.
constexpr size_t kMaxPart = 1 << 20;

// Sends one part of call `seq`'s streamed response (the head with the first:
// `head` non-null). False when the invoker is gone.
bool SendPart(uint64_t seq, const WorkerReply* head, absl::string_view body) {
  do {
    WorkerReply part;
    if (head != nullptr) {
      part.set_status(head->status());
      *part.mutable_headers() = head->headers();
      head = nullptr;
    }
    absl::string_view now = body.substr(0, kMaxPart);
    body.remove_prefix(now.size());
    part.set_body(std::string(now));
    part.set_more(true);
    if (!SendReply(part, seq)) return false;
  } while (!body.empty());
  return true;
}

// The end of a streamed response: the last bytes, or why it broke off.
WorkerReply StreamEnd(std::string rest, std::string error = "") {
  WorkerReply r;
  r.set_body(std::move(rest));
  r.set_error(std::move(error));
  return r;
}

std::string HeaderValue(const WorkerCall& c, absl::string_view name) {
  for (const auto& h : c.headers())
    if (absl::EqualsIgnoreCase(h.name(), name)) return h.value();
  return "";
}

constexpr char kRunSocket[] = "/var/silt/run/s";

// The C library's generators; C++ engines seeded from std::random_device in
// init are the function's to reseed in its after-restore hook.
void Reseed(uint64_t seed) {
  srandom(static_cast<unsigned>(seed));
  srand(static_cast<unsigned>(seed >> 32));
  unsigned short x[3] = {static_cast<unsigned short>(seed),
                         static_cast<unsigned short>(seed >> 16),
                         static_cast<unsigned short>(seed >> 32)};
  seed48(x);
}

// Ends every process a call left behind (a child in a session of its own,
// a daemon) and reaps it: nothing of one call runs on into the next. The
// worker is pid 1 of its sandbox (every process there is its descendant) or
// a forked clone, a child subreaper (SetUpLeftoverReaping) whose orphaned
// descendants become its children. Returns how many were ended; `killed`:
// the caller already sent the leftovers SIGKILL (so each one reaped counts).
int EndLeftovers(bool killed = false) {
  int ended = 0;
  while (true) {
    pid_t p = waitpid(-1, nullptr, WNOHANG | __WALL);
    if (p > 0) {
      ended += killed;
      continue;
    }
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) return ended;  // ECHILD: no descendant left
    // Live children: end them all, then wait for one (their children, if
    // any, become ours and are ended on the next round).
    if (getpid() == 1) {
      kill(-1, SIGKILL);  // every process of the namespace but this one
    } else if (DIR* d = opendir("/proc")) {
      std::string self = std::to_string(getpid());
      while (dirent* e = readdir(d)) {
        pid_t child = 0;
        if (!absl::SimpleAtoi(e->d_name, &child)) continue;
        std::ifstream stat(absl::StrCat("/proc/", child, "/stat"));
        std::string line;
        std::getline(stat, line);
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        size_t close_paren = line.rfind(')');
        if (close_paren == std::string::npos) continue;
        std::vector<std::string> f = absl::StrSplit(
            line.substr(close_paren + 2), ' ', absl::SkipEmpty());
        if (f.size() > 1 && f[1] == self) kill(child, SIGKILL);
      }
      closedir(d);
    }
    killed = true;
    p = waitpid(-1, nullptr, __WALL);
    if (p > 0) ++ended;
  }
}

// A forked clone is not pid 1 of its sandbox: it adopts its orphaned
// descendants so that EndLeftovers finds them.
void SetUpLeftoverReaping() {
  if (getpid() != 1) prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
}

// After a call: says in the function's log what was ended.
void EndCallLeftovers(bool killed = false) {
  if (int n = EndLeftovers(killed); n > 0)
    LogLine(absl::StrCat("Ended ", n, " process", n == 1 ? "" : "es",
                         " the call left behind."));
}

// Children the worker starts must not inherit its blocked SIGUSR1.
void UnblockSignals() {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// ---- native ----

class NativeRuntime {
 public:
  absl::Status Start(const WorkerConfig& cfg) {
    ctx_.function_name = cfg.spec().name();
    ctx_.function_namespace = cfg.spec().namespace_();
    ctx_.instance_id = cfg.instance_id();
    ctx_.secrets_dir = kSandboxSecretsDir;
    ctx_.state = g_state.api();
    auto lib =
        proclets::FunctionLibrary::Load(cfg.bundle_dir() + "/" + cfg.entry());
    if (!lib.ok()) return lib.status();
    lib_ = *std::move(lib);
    if (absl::Status s = lib_->Init(ctx_); !s.ok()) return s;
    concurrency_ = lib_->MaxConcurrency();
    if (auto it = cfg.spec().labels().find("com.silt.concurrency");
        it != cfg.spec().labels().end()) {
      uint32_t most = 0;
      if (absl::SimpleAtoi(it->second, &most) && most > 0)
        concurrency_ = std::min(concurrency_, most);
    }
    return absl::OkStatus();
  }

  // How many calls run at once: what the function declared, at most what its
  // deployment's com.silt.concurrency label allows.
  uint32_t Concurrency() const { return concurrency_; }
  // No call runs: the processes they left behind are ended.
  void CallsEnded() { EndCallLeftovers(); }

  // Runs on the call's own thread when calls run at once: ctx_ is only read.
  WorkerReply Call(const WorkerCall& c) {
    proclets::CallContext ctx = ctx_;
    ctx.call_id = c.call_id();
    proclets::FunctionCall call;
    call.method = c.method();
    call.path = c.path();
    call.query = c.query();
    for (const auto& h : c.headers())
      call.headers.emplace_back(h.name(), h.value());
    call.body = c.body();
    bool streamed = false;
    auto res = lib_->Handle(
        ctx, call, [&streamed, &c](const proclets::FunctionResult& so_far) {
          WorkerReply head;
          if (!so_far.streamed) {
            head.set_status(so_far.status);
            for (const auto& [k, v] : so_far.headers) {
              auto* h = head.add_headers();
              h->set_name(k);
              h->set_value(v);
            }
          }
          streamed = true;
          return SendPart(c.seq(), so_far.streamed ? nullptr : &head,
                          so_far.body);
        });
    if (streamed) {
      if (!res.ok()) return StreamEnd("", std::string(res.status().message()));
      return StreamEnd(std::move(res->body));
    }
    if (!res.ok()) return Error(500, std::string(res.status().message()));
    WorkerReply r;
    r.set_status(res->status);
    for (auto& [k, v] : res->headers) {
      auto* h = r.add_headers();
      h->set_name(k);
      h->set_value(v);
    }
    r.set_body(std::move(res->body));
    return r;
  }

  // A compute proclet's share of a job: the reply body is the task's reply
  // (silt/abi.h silt_task).
  WorkerReply Task(const WorkerCall& c) {
    proclets::CallContext ctx = ctx_;
    ctx.call_id = c.call_id();
    auto res = lib_->Task(ctx, c.body());
    if (!res.ok()) return TaskError(res.status().message());
    return Ok(*std::move(res));
  }

  void BeforePark() {}
  // A restored or forked clone: its own identity and random state, then the
  // function's after-restore hook.
  void Resumed(const std::string& instance_id, uint64_t seed) {
    ctx_.instance_id = instance_id;
    Reseed(seed);
    lib_->AfterRestore(ctx_);
  }

 private:
  proclets::CallContext ctx_;
  std::unique_ptr<proclets::FunctionLibrary> lib_;
  uint32_t concurrency_ = 1;
};

// ---- exec, classic: fork fprocess per request ----

// Reads what `fd` (non-blocking) holds into `out`; false at end of file or
// on an error.
bool Drain(int fd, std::string& out) {
  char buf[65536];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && errno == EAGAIN;
  }
}

class ClassicRuntime {
 public:
  absl::Status Start(const WorkerConfig& cfg) {
    argv_ = SplitCommand(cfg.entry());
    if (argv_.empty()) return absl::InvalidArgumentError("empty fprocess");
    if (chdir(cfg.bundle_dir().c_str()) != 0)
      return absl::InternalError("cannot enter the bundle directory");
    return absl::OkStatus();
  }

  WorkerReply Call(const WorkerCall& c) {
    auto start = std::chrono::steady_clock::now();
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    for (const auto& h : c.headers()) {
      std::string name = h.name();
      for (char& ch : name)
        if (ch == '-') ch = '_';
      env.push_back(absl::StrCat("Http_", name, "=", h.value()));
    }
    env.push_back("Http_Method=" + c.method());
    env.push_back(absl::StrCat("Http_ContentLength=", c.body().size()));
    env.push_back(absl::StrCat("Http_Content_Length=", c.body().size()));
    if (!c.query().empty()) env.push_back("Http_Query=" + c.query());
    env.push_back("Http_Path=" + c.path());
    env.push_back("Http_Host=" + HeaderValue(c, "Host"));

    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
      return Error(500, "cannot create pipes for fprocess");
    std::vector<char*> argv, envp;
    for (auto& a : argv_) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    LogLine("Forking fprocess.");
    pid_t pid = fork();
    if (pid == 0) {
      UnblockSignals();
      setpgid(0, 0);  // its leftovers are killed with the group
      dup2(in[0], 0);
      dup2(out[1], 1);
      environ = envp.data();
      execvp(argv[0], argv.data());
      fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (pid < 0) {
      close(in[1]);
      close(out[0]);
      return Error(500, "fork of fprocess failed");
    }
    // The call ends when the process exits (not when every process holding
    // its stdout has closed it): watched through a pidfd.
    int exited = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    // Feed stdin and drain stdout together so that neither side blocks the
    // other.
    const std::string& body = c.body();
    size_t written = 0;
    std::string output;
    fcntl(in[1], F_SETFL, O_NONBLOCK);
    bool in_open = true;
    if (body.empty()) {
      close(in[1]);
      in_open = false;
    }
    auto deadline =
        c.timeout_ms() > 0
            ? std::optional(start + std::chrono::milliseconds(c.timeout_ms()))
            : std::nullopt;
    bool timed_out = false;
    bool done = false;
    bool exited_seen = false;  // the fprocess exited (its pidfd said so)
    while (!done) {
      pollfd fds[3] = {{out[0], POLLIN, 0},
                       {in_open ? in[1] : -1, POLLOUT, 0},
                       {exited, POLLIN, 0}};
      int wait_ms = -1;
      if (deadline) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            *deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
          timed_out = true;
          break;
        }
        wait_ms = static_cast<int>(left.count());
      }
      int r = poll(fds, 3, wait_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) continue;
      // Exited: take what it wrote (still in the pipe) and stop there.
      if (fds[2].revents & POLLIN) {
        fds[0].revents |= POLLIN;
        done = exited_seen = true;
      }
      if (in_open && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
        ssize_t n = write(in[1], body.data() + written, body.size() - written);
        if (n > 0) written += static_cast<size_t>(n);
        if (n < 0 && errno != EAGAIN) written = body.size();
        if (written == body.size()) {
          close(in[1]);
          in_open = false;
        }
      }
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (!Drain(out[0], output)) done = true;
      }
    }
    if (in_open) close(in[1]);
    close(out[0]);
    if (exited >= 0) close(exited);
    // Whatever it left behind (a child still holding stdout, a daemon) ends
    // with the call. The fprocess is reaped first when it exited, so that
    // its group holds only what it left (said in the log as such even when
    // the group's kill ends it before EndLeftovers looks).
    int status = 0;
    auto reap = [&] {
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    };
    if (exited_seen) reap();
    // Once it is reaped, whatever its group still holds was left behind.
    const bool killed = kill(-pid, SIGKILL) == 0;
    if (!exited_seen) {
      kill(pid, SIGKILL);
      reap();
    }
    EndCallLeftovers(killed);
    double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (timed_out) return Error(504, "Killed process: exec_timeout exceeded");
    LogLine(absl::StrCat("Wrote ", output.size(), " Bytes - Duration: ",
                         absl::StrFormat("%f", secs), "s"));
    WorkerReply r;
    if (WIFSIGNALED(status)) {
      // Seccomp kills with SIGSYS, the OOM killer with SIGKILL.
      int sig = WTERMSIG(status);
      std::string why = absl::StrCat(
          "fprocess killed by signal ", sig, " (", strsignal(sig), ")",
          sig == SIGSYS ? ": forbidden system call (seccomp)" : "");
      LogLine(why);
      r = Error(500, why + "\n");
      r.set_body(absl::StrCat(r.body(), output));
      return r;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      r = Error(500,
                absl::StrCat("exit status ",
                             WIFEXITED(status) ? WEXITSTATUS(status) : -1));
      r.set_body(absl::StrCat(r.body(), output));
      return r;
    }
    r.set_status(200);
    std::string ct =
        std::getenv("content_type") ? std::getenv("content_type") : "";
    if (ct.empty()) ct = HeaderValue(c, "Content-Type");
    if (!ct.empty()) {
      auto* h = r.add_headers();
      h->set_name("Content-Type");
      h->set_value(ct);
    }
    auto* d = r.add_headers();
    d->set_name("X-Duration-Seconds");
    d->set_value(absl::StrFormat("%f", secs));
    r.set_body(std::move(output));
    return r;
  }

  WorkerReply Task(const WorkerCall&) {
    return TaskError(
        "compute tasks need a C++ function (a native bundle built with "
        "silt/function.h); this function is an exec bundle");
  }
  void BeforePark() {}
  void Resumed(const std::string&, uint64_t seed) { Reseed(seed); }
  uint32_t Concurrency() const { return 1; }
  void CallsEnded() {}

 private:
  std::vector<std::string> argv_;
};

// ---- exec, http: a long-running server the worker proxies to ----
// ---- container: the same, to the watchdog of a container whose network
// namespace the worker shares (the container runs the server) ----

class HttpRuntime {
 public:
  absl::Status Start(const WorkerConfig& cfg) {
    const bool container = container_ = cfg.kind() == "container";
    std::vector<std::string> argv = SplitCommand(cfg.entry());
    if (argv.empty() && !container)
      return absl::InvalidArgumentError("empty fprocess");
    if (chdir(cfg.bundle_dir().c_str()) != 0)
      return absl::InternalError("cannot enter the bundle directory");
    std::string url = cfg.upstream_url().empty() ? "http://127.0.0.1:5000"
                                                 : cfg.upstream_url();
    absl::string_view u = url;
    absl::ConsumePrefix(&u, "http://");
    u = u.substr(0, u.find('/'));
    size_t colon = u.rfind(':');
    host_ = std::string(u.substr(0, colon));
    port_ = colon == absl::string_view::npos ? "80"
                                             : std::string(u.substr(colon + 1));
    if (container) {
      // Its watchdog answered its health check already (the invoker's
      // ContainerRuntime): it must take connections now.
      if (auto s = Connect(); !s.ok())
        return absl::UnavailableError(
            absl::StrCat("the container's watchdog at ", url,
                         " takes no connection: ", s.message()));
      return absl::OkStatus();
    }
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    // The server writes to pipes of the worker's, which it relays to its own
    // stdout and stderr: both ends stay inside the instance, so a checkpoint
    // holds them whole, and after a restore the server's lines reach the
    // log pipes the resume gave the worker (the invoker's end of a pipe the
    // server held itself would be gone: its next write would fail).
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      return absl::InternalError("pipe failed");
    }
    server_ = fork();
    if (server_ == 0) {
      UnblockSignals();
      dup2(out[1], 1);
      dup2(err[1], 2);
      execvp(args[0], args.data());
      fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    if (server_ < 0) {
      close(out[0]);
      close(err[0]);
      return absl::InternalError("fork of the function server failed");
    }
    for (auto [from, to] : {std::pair{out[0], 1}, std::pair{err[0], 2}})
      std::thread([from, to] {
        char buf[4096];
        for (;;) {
          ssize_t n = read(from, buf, sizeof buf);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) break;
          for (ssize_t off = 0; off < n;) {
            ssize_t w = write(to, buf + off, static_cast<size_t>(n - off));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;
            off += w;
          }
        }
        close(from);
      }).detach();
    // Wait until the server accepts connections (or dies).
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (waitpid(server_, &st, WNOHANG) == server_)
        return absl::FailedPreconditionError(
            absl::StrCat("the function server \"", cfg.entry(),
                         "\" exited during start-up"));
      if (Connect().ok()) return absl::OkStatus();
      struct timespec ts = {0, 5 * 1000 * 1000};
      nanosleep(&ts, nullptr);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "the function server did not listen on ", url, " within 30 s"));
  }

  // Proxies the call to the server. A response whose length is known and at
  // most kWholeBody comes back whole; a longer one, a chunked one or one
  // that runs until the server closes (server-sent events, say) is passed
  // on in parts as the server writes them.
  WorkerReply Call(const WorkerCall& c) {
    auto start = std::chrono::steady_clock::now();
    bool broke = false;  // a connection broke off before an answer came
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!stream_ && !Connect().ok()) break;
      http::request<http::string_body> req;
      req.method_string(c.method());
      req.target(c.query().empty() ? c.path() : c.path() + "?" + c.query());
      req.version(11);
      for (const auto& h : c.headers()) req.insert(h.name(), h.value());
      req.body() = c.body();
      req.prepare_payload();
      req.keep_alive(true);
      beast::error_code ec;
      if (c.timeout_ms() > 0)
        stream_->expires_after(std::chrono::milliseconds(c.timeout_ms()));
      http::write(*stream_, req, ec);
      beast::flat_buffer buffer;
      http::response_parser<http::buffer_body> parser;
      parser.body_limit(std::numeric_limits<uint64_t>::max());
      if (c.method() == "HEAD") parser.skip(true);
      if (!ec) http::read_header(*stream_, buffer, parser, ec);
      if (ec == beast::error::timeout) {
        stream_.reset();
        return Error(504, "function server timed out");
      }
      if (ec) {
        stream_
            .reset();  // stale keep-alive connection: retry once on a new one
        broke = true;
        continue;
      }
      auto& res = parser.get();
      WorkerReply r;
      r.set_status(static_cast<int>(res.result_int()));
      for (const auto& f : res) {
        if (beast::iequals(f.name_string(), "Connection") ||
            beast::iequals(f.name_string(), "Transfer-Encoding") ||
            beast::iequals(f.name_string(), "Content-Length"))
          continue;
        auto* h = r.add_headers();
        h->set_name(std::string(f.name_string()));
        h->set_value(std::string(f.value()));
      }
      auto length = parser.content_length();
      if (parser.is_done() || (length && *length <= kWholeBody)) {
        std::string body(length.value_or(0), '\0');
        if (!parser.is_done()) {
          res.body().data = body.data();
          res.body().size = body.size();
          http::read(*stream_, buffer, parser, ec);
          if (ec == http::error::need_buffer) ec = {};
        }
        if (ec) {
          stream_.reset();
          if (ec == beast::error::timeout)
            return Error(504, "function server timed out");
          return Lost(Error(502, "the function server's answer broke off"));
        }
        auto* d = r.add_headers();
        d->set_name("X-Duration-Seconds");
        d->set_value(
            absl::StrFormat("%f", std::chrono::duration<double>(
                                      std::chrono::steady_clock::now() - start)
                                      .count()));
        r.set_body(std::move(body));
        if (!res.keep_alive()) stream_.reset();
        // A server error right after a connection broke: the server may be
        // going (a watchdog answers 502 for its dead upstream before it
        // exits itself).
        if (broke && r.status() >= 500) return Lost(std::move(r));
        return r;
      }
      return Relay(parser, buffer, r, c.seq());
    }
    return Lost(Error(502, broke ? "the function server broke the connection "
                                   "off without an answer"
                                 : "cannot reach the function server"));
  }

  // Sends the head at once, then passes the body on as it comes, each read a
  // part. The connection stays only if the body ended cleanly.
  WorkerReply Relay(http::response_parser<http::buffer_body>& parser,
                    beast::flat_buffer& buffer, const WorkerReply& head,
                    uint64_t seq) {
    if (!SendPart(seq, &head, {})) {
      stream_.reset();
      return StreamEnd("", "the invoker is gone");
    }
    std::string part(kPartBuffer, '\0');
    beast::error_code ec;
    while (!parser.is_done()) {
      parser.get().body().data = part.data();
      parser.get().body().size = part.size();
      http::read_some(*stream_, buffer, parser, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) break;
      size_t n = part.size() - parser.get().body().size;
      if (n > 0 && !SendPart(seq, nullptr, {part.data(), n})) {
        stream_.reset();
        return StreamEnd("", "the invoker is gone");
      }
    }
    if (ec || !parser.get().keep_alive()) stream_.reset();
    if (ec)
      return StreamEnd("", ec == beast::error::timeout
                               ? "function server timed out"
                               : "the function server's answer broke off");
    return StreamEnd("");
  }

  // No connection may cross a checkpoint: the server's listening socket does.
  WorkerReply Task(const WorkerCall&) {
    return TaskError(
        "compute tasks need a C++ function (a native bundle built with "
        "silt/function.h); this function is an exec bundle");
  }
  void BeforePark() { stream_.reset(); }
  void Resumed(const std::string&, uint64_t seed) { Reseed(seed); }
  uint32_t Concurrency() const { return 1; }
  void CallsEnded() {}

 private:
  absl::Status Connect() {
    auto s = std::make_unique<beast::tcp_stream>(ioc_);
    asio::ip::tcp::resolver resolver(ioc_);
    beast::error_code ec;
    auto eps = resolver.resolve(host_, port_, ec);
    if (!ec) s->connect(eps, ec);
    if (ec) return absl::UnavailableError(ec.message());
    stream_ = std::move(s);
    return absl::OkStatus();
  }
  // A container's watchdog that takes no connection, or breaks one off,
  // is gone with its container (which the invoker sees to); an exec
  // bundle's server that exited is gone too: this instance is lost.
  WorkerReply Lost(WorkerReply r) {
    if (container_ || ServerExited(std::chrono::milliseconds(100)))
      r.set_instance_lost(true);
    return r;
  }
  // Whether the worker's own function server has exited (reaped here),
  // waiting up to `wait` for it: its sockets close before it is a zombie.
  bool ServerExited(std::chrono::milliseconds wait) {
    if (server_ <= 0) return false;
    int status = 0;
    auto deadline = std::chrono::steady_clock::now() + wait;
    pid_t r;
    while ((r = waitpid(server_, &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (r != server_) return false;
    LogLine(absl::StrCat("the function server exited (",
                         WIFSIGNALED(status)
                             ? absl::StrCat("signal ", WTERMSIG(status))
                             : absl::StrCat("status ", WEXITSTATUS(status)),
                         ")"));
    server_ = -1;
    return true;
  }

  static constexpr uint64_t kWholeBody = 1 << 20;
  static constexpr size_t kPartBuffer = 64 << 10;
  bool container_ = false;

  asio::io_context ioc_;
  std::unique_ptr<beast::tcp_stream> stream_;
  std::string host_, port_;
  pid_t server_ = -1;
};

void NullStdio() {
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  dup2(null, 1);
  dup2(null, 2);
  close(null);
}

// The checkpoint point: nothing of the invoker stays open (CRIU could not
// restore the channel, and the image must not hold it). The invoker dumps us
// here, and wakes us (this process, a restored copy, or several) with
// SIGUSR1; we then connect to the run directory the invoker bound for us.
// The channel closes last: the invoker starts the dump as soon as it reads
// its end, and the state connection (a socket of the invoker's network
// namespace: "Unix socket N not found" to CRIU) and the log pipes must be
// gone by then.
template <typename Runtime>
bool ParkAndResume(Runtime& rt) {
  g_state.Attach(-1);
  NullStdio();
  close(kChannel);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  while (sigwaitinfo(&usr1, nullptr) != SIGUSR1) {
  }
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, kRunSocket, sizeof(kRunSocket));
  if (s < 0 ||
      connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return false;
  if (s != kChannel) {  // fd 3 is free: socket() usually returns it
    dup3(s, kChannel, O_CLOEXEC);
    close(s);
  }
  int fds[3];
  if (!RecvFds(kChannel, fds, 3).ok()) return false;
  dup2(fds[0], 1);
  dup2(fds[1], 2);
  close(fds[0]);
  close(fds[1]);
  WorkerCall resume;
  if (!ReadFrame(kChannel, &resume).ok() ||
      resume.op() != v1::WORKER_OP_RESUME) {
    close(fds[2]);
    return false;
  }
  if (resume.as_template()) {  // templates serve no calls; clones get links
    close(fds[2]);
  } else {
    g_state.Attach(fds[2]);
    StartStateApi();
  }
  if (!resume.as_template()) rt.Resumed(resume.instance_id(), resume.seed());
  v1::WorkerReady ready;
  ready.set_ok(true);
  ready.set_concurrency(rt.Concurrency());
  return WriteFrame(kChannel, ready).ok();
}

// A fork template: each fork frame comes with the clone's channel and log
// fds. Returns true in a clone (which then serves calls), false when the
// template's channel closes.
template <typename Runtime>
bool TemplateLoop(Runtime& rt) {
  signal(SIGCHLD, SIG_IGN);  // clones are reaped by the kernel
  while (true) {
    int fds[4];
    if (!RecvFds(kChannel, fds, 4).ok()) return false;
    WorkerCall fork_call;
    if (!ReadFrame(kChannel, &fork_call).ok()) return false;
    pid_t pid = fork();
    if (pid == 0) {
      signal(SIGCHLD, SIG_DFL);
      SetUpLeftoverReaping();
      dup3(fds[0], kChannel, O_CLOEXEC);
      dup2(fds[1], 1);
      dup2(fds[2], 2);
      for (int i = 0; i < 3; ++i) close(fds[i]);
      g_state.Attach(fds[3]);
      StartStateApi();
      rt.Resumed(fork_call.instance_id(), fork_call.seed());
      v1::WorkerReady ready;
      ready.set_ok(true);
      ready.set_concurrency(rt.Concurrency());
      if (!WriteFrame(kChannel, ready).ok()) _exit(0);
      return true;
    }
    for (int fd : fds) close(fd);
    WorkerReply r = pid > 0
                        ? Ok(std::to_string(pid))
                        : Error(500, std::string("fork: ") + strerror(errno));
    if (!WriteFrame(kChannel, r).ok()) return false;
  }
}

// A clone's own stack-protector canary, drawn after a restore or fork (it is
// the snapshot's otherwise, the same in every clone). Only frames entered
// from here on check it: those still live (Serve, main, the C library's
// start) never check theirs, hence no stack protector for Serve and main.
// x86-64 keeps the canary per thread (fs:0x28); the threads already running
// keep theirs, and new threads copy the creating thread's. Elsewhere the
// canary is one global that every thread's live frames hold: left alone.
void RedrawStackCanary() {
#if defined(__x86_64__)
  uint64_t canary = 0;
  if (getrandom(&canary, sizeof(canary), 0) != sizeof(canary)) return;
  canary &= ~uint64_t{0xff};  // as the C library draws it: a zero low byte
  asm volatile("movq %0, %%fs:0x28" : : "r"(canary) : "memory");
#endif
}

template <typename Runtime>
WorkerReply Answer(Runtime& rt, const WorkerCall& call) {
  return call.op() == v1::WORKER_OP_TASK ? rt.Task(call) : rt.Call(call);
}

// Runs the calls of a function that takes several at once, each on a thread
// of up to Concurrency() (started as calls come, kept while the worker
// serves). A frame comes whole from one thread at a time (SendReply).
// CallsEnded runs when no call does; no call starts meanwhile.
template <typename Runtime>
class CallThreads {
 public:
  explicit CallThreads(Runtime& rt) : rt_(rt) {}
  ~CallThreads() { Stop(); }

  void Run(WorkerCall call) {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(std::move(call));
    // A thread counted as waiting may not have taken the call it was woken
    // for yet: a new one starts whenever calls outnumber the waiting.
    if (queue_.size() > static_cast<size_t>(waiting_) &&
        threads_.size() < rt_.Concurrency())
      threads_.emplace_back([this] { Loop(); });
    cv_.notify_one();
  }

  // Waits for the running calls (the invoker parks or templates an idle
  // instance: none) and ends the threads; Run starts new ones.
  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = false;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      ++waiting_;
      cv_.wait(l, [this] { return stopping_ || !queue_.empty(); });
      --waiting_;
      if (queue_.empty()) return;  // stopping
      WorkerCall call = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      l.unlock();
      WorkerReply reply = Answer(rt_, call);
      SendReply(reply, call.seq());
      l.lock();
      if (--running_ == 0 && queue_.empty()) rt_.CallsEnded();
    }
  }

  Runtime& rt_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<WorkerCall> queue_;  // guarded by mu_
  int waiting_ = 0;               // threads with no call (mu_)
  int running_ = 0;               // calls running (mu_)
  bool stopping_ = false;         // (mu_)
  std::vector<std::thread> threads_;
};

template <typename Runtime>
__attribute__((no_stack_protector)) int Serve(const WorkerConfig& cfg) {
  Runtime rt;
  StartStateApi();  // first: an http-mode server inherits SILT_STATE_URL
  absl::Status s = rt.Start(cfg);
  v1::WorkerReady ready;
  ready.set_ok(s.ok());
  ready.set_concurrency(s.ok() ? rt.Concurrency() : 1);
  if (!s.ok()) {
    ready.set_error(std::string(s.message()));
    fprintf(stderr, "silt-worker: %s\n", ready.error().c_str());
  }
  if (!WriteFrame(kChannel, ready).ok() || !s.ok()) return 1;
  CallThreads<Runtime> threads(rt);
  // Calls whose body is still coming (WORKER_OP_BODY), by seq: a call runs
  // once its body is whole.
  std::map<uint64_t, WorkerCall> assembling;
  while (true) {
    WorkerCall call;
    absl::Status r = ReadFrame(kChannel, &call);
    if (!r.ok()) {
      // The invoker closed the channel: stop (whatever calls still run).
      if (rt.Concurrency() <= 1) return 0;
      fflush(stdout);
      fflush(stderr);
      _exit(0);
    }
    if (call.op() == v1::WORKER_OP_BODY) {
      auto it = assembling.find(call.seq());
      if (it == assembling.end()) continue;  // of a call the invoker gave up
      it->second.mutable_body()->append(call.body());
      if (call.body_follows()) continue;
      call = std::move(it->second);
      assembling.erase(it);
      call.set_body_follows(false);
    } else if (call.body_follows()) {
      // Room for the whole body at once when its size is known.
      uint64_t size = 0;
      if (absl::SimpleAtoi(HeaderValue(call, "Content-Length"), &size) &&
          size <= kMaxAssembledReserve)
        call.mutable_body()->reserve(size);
      assembling[call.seq()] = std::move(call);
      continue;
    }
    if (call.op() == v1::WORKER_OP_PARK || call.op() == v1::WORKER_OP_TEMPLATE)
      threads.Stop();  // no thread may be in the image or the template
    if (call.op() == v1::WORKER_OP_PARK) {
      StopStateApi();
      rt.BeforePark();
      if (!WriteFrame(kChannel, Ok()).ok()) return 0;
      if (!ParkAndResume(rt)) return 0;
      RedrawStackCanary();
      continue;
    }
    if (call.op() == v1::WORKER_OP_TEMPLATE) {
      StopStateApi();
      if (!WriteFrame(kChannel, Ok()).ok()) return 0;
      if (!TemplateLoop(rt)) return 0;
      RedrawStackCanary();
      continue;  // a clone
    }
    if (rt.Concurrency() > 1) {
      threads.Run(std::move(call));
      continue;
    }
    WorkerReply reply = Answer(rt, call);
    rt.CallsEnded();
    if (!SendReply(reply, call.seq())) return 0;
  }
}

}  // namespace
}  // namespace silt::invoker

__attribute__((no_stack_protector)) int main() {
  using namespace silt::invoker;
  signal(SIGPIPE, SIG_IGN);
  // SIGUSR1 ends a park (sigwaitinfo); blocked so it never kills us.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigprocmask(SIG_BLOCK, &usr1, nullptr);
  fcntl(kChannel, F_SETFD, FD_CLOEXEC);
  // The state connection comes first, then the configuration.
  int state_fd = -1;
  if (auto s = RecvFds(kChannel, &state_fd, 1, std::chrono::seconds(30));
      !s.ok()) {
    fprintf(stderr, "silt-worker: no state connection on fd 3: %s\n",
            std::string(s.message()).c_str());
    return 2;
  }
  g_state.Attach(state_fd);
  v1::WorkerConfig cfg;
  if (auto s = ReadFrame(kChannel, &cfg, std::chrono::seconds(30)); !s.ok()) {
    fprintf(stderr, "silt-worker: no configuration on fd 3: %s\n",
            std::string(s.message()).c_str());
    return 2;
  }
  if (cfg.kind() == "native") return Serve<NativeRuntime>(cfg);
  if (cfg.kind() == "exec")
    g_state_http = std::make_unique<StateHttpServer>(g_state.api());
  if ((cfg.kind() == "exec" && cfg.mode() == "http") ||
      cfg.kind() == "container")
    return Serve<HttpRuntime>(cfg);
  if (cfg.kind() == "exec") return Serve<ClassicRuntime>(cfg);
  fprintf(stderr, "silt-worker: unknown bundle kind %s\n", cfg.kind().c_str());
  return 2;
}
