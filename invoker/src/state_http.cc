#include "state_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>  // the wire format's; absl::string_view differs here
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "silt/state_wire.h"

namespace silt::invoker {
namespace {

using Clock = std::chrono::steady_clock;
using wire::StateCode;
using wire::StateKind;
using wire::StateOp;

constexpr size_t kReadChunk = 64 * 1024;
// A connection's requests are not read further while this much of its
// answers is unsent (a client pipelining GETs without reading).
constexpr size_t kMaxUnsentBytes = 8u << 20;
constexpr char kRouteHelp[] =
    "routes: GET|HEAD|PUT|DELETE /state/maps/NAME/KEY, GET /state/maps/NAME, "
    "POST /state/vectors/NAME, GET|PUT /state/vectors/NAME/INDEX, "
    "GET /state/vectors/NAME, POST /state/queues/NAME, "
    "POST /state/queues/NAME/pop?timeout_ms=N, GET /state/queues/NAME";

// ---- HTTP ----

struct Response {
  int status = 200;
  std::string content_type;  // empty: no body
  std::string body;
  std::string state_code;  // X-Silt-State-Code, on state errors
  std::string allow;       // Allow, on 405
  bool close = false;      // the connection closes after this answer
  bool bad = false;        // malformed HTTP: the stream cannot be framed
};

const char* Reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
  }
  return "Unknown";
}

Response Text(int status, absl::string_view message) {
  Response r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = absl::StrCat(message, "\n");
  return r;
}

// Malformed HTTP: answered, then the connection closes (the rest of its
// bytes cannot be framed).
Response BadHttp(int status, absl::string_view message) {
  Response r = Text(status, message);
  r.close = true;
  r.bad = true;
  return r;
}

Response Value(std::string_view bytes) {
  Response r;
  r.content_type = "application/octet-stream";
  r.body = std::string(bytes);
  return r;
}

Response Json(absl::string_view field, uint64_t n) {
  Response r;
  r.content_type = "application/json";
  r.body = absl::StrCat("{\"", field, "\":", n, "}");
  return r;
}

Response NoContent() {
  Response r;
  r.status = 204;
  return r;
}

Response MethodNotAllowed(absl::string_view method, absl::string_view allow) {
  Response r = Text(405, absl::StrCat(method, " is not allowed here; use ",
                                      allow, " (", kRouteHelp, ")"));
  r.allow = std::string(allow);
  return r;
}

std::string Serialize(const Response& r, bool head_request) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", r.status, " ", Reason(r.status), "\r\n");
  if (r.status != 204) {
    if (!r.content_type.empty())
      absl::StrAppend(&out, "Content-Type: ", r.content_type, "\r\n");
    absl::StrAppend(&out, "Content-Length: ", r.body.size(), "\r\n");
  }
  if (!r.state_code.empty())
    absl::StrAppend(&out, "X-Silt-State-Code: ", r.state_code, "\r\n");
  if (!r.allow.empty()) absl::StrAppend(&out, "Allow: ", r.allow, "\r\n");
  if (r.close) out += "Connection: close\r\n";
  out += "\r\n";
  if (!head_request) out += r.body;
  return out;
}

struct Request {
  std::string method;
  std::string path;   // before '?', still percent-encoded
  std::string query;  // after '?'
  std::string body;
  bool keep_alive = true;
};

// A request's line and headers.
struct Head {
  Request request;    // without its body
  size_t length = 0;  // bytes of the head, blank line included
  size_t content_length = 0;
  bool expect_continue = false;
};

// Where the head ends (after its blank line), or npos while incomplete. Bare
// LF line ends are accepted as well as CRLF.
size_t HeadEnd(absl::string_view in) {
  for (size_t i = in.find('\n'); i != absl::string_view::npos;
       i = in.find('\n', i + 1)) {
    size_t next = i + 1;
    if (next < in.size() && in[next] == '\r') ++next;
    if (next < in.size() && in[next] == '\n') return next + 1;
  }
  return absl::string_view::npos;
}

// Why a head is refused: the HTTP status to answer and its message.
struct HeadError {
  int status;
  std::string message;
};

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c))) continue;
    if (absl::string_view("!#$%&'*+-.^_`|~").find(c) == absl::string_view::npos)
      return false;
  }
  return true;
}

// Parses a head (request line and headers) into *head.
std::optional<HeadError> ParseHead(absl::string_view text, Head* head) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  for (auto& l : lines) absl::ConsumeSuffix(&l, "\r");
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return HeadError{400, "empty request"};
  std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3 || !IsToken(parts[0]) || parts[1].empty())
    return HeadError{
        400, "malformed request line: expected \"METHOD /path HTTP/1.1\""};
  Request& req = head->request;
  req.method = std::string(parts[0]);
  absl::string_view version = parts[2];
  if (version == "HTTP/1.0") {
    req.keep_alive = false;
  } else if (version != "HTTP/1.1") {
    return HeadError{absl::StartsWith(version, "HTTP/") ? 505 : 400,
                     "use HTTP/1.1 (or HTTP/1.0)"};
  }
  absl::string_view target = parts[1];
  // Absolute form (a proxy-style request): keep only the path.
  if (absl::ConsumePrefix(&target, "http://")) {
    size_t slash = target.find('/');
    target = slash == absl::string_view::npos ? "/" : target.substr(slash);
  }
  if (target[0] != '/')
    return HeadError{400, "the request target must be a path"};
  size_t q = target.find('?');
  req.path = std::string(target.substr(0, q));
  if (q != absl::string_view::npos)
    req.query = std::string(target.substr(q + 1));
  std::optional<size_t> length;
  for (size_t i = 1; i < lines.size(); ++i) {
    absl::string_view line = lines[i];
    size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon)))
      return HeadError{
          400, absl::StrCat("malformed header line \"",
                            absl::CHexEscape(line.substr(0, 80)), "\"")};
    absl::string_view name = line.substr(0, colon);
    absl::string_view value =
        absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "Content-Length")) {
      size_t n = 0;
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(),
                       [](char c) { return c >= '0' && c <= '9'; }) ||
          !absl::SimpleAtoi(value, &n) || (length && *length != n))
        return HeadError{400, "bad Content-Length"};
      length = n;
    } else if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      return HeadError{411,
                       "send the body with a Content-Length (chunked or other "
                       "transfer codings are not supported)"};
    } else if (absl::EqualsIgnoreCase(name, "Connection")) {
      for (absl::string_view token : absl::StrSplit(value, ',')) {
        token = absl::StripAsciiWhitespace(token);
        if (absl::EqualsIgnoreCase(token, "close")) req.keep_alive = false;
        if (absl::EqualsIgnoreCase(token, "keep-alive")) req.keep_alive = true;
      }
    } else if (absl::EqualsIgnoreCase(name, "Expect")) {
      if (!absl::EqualsIgnoreCase(value, "100-continue"))
        return HeadError{400, "only \"Expect: 100-continue\" is understood"};
      head->expect_continue = true;
    }
  }
  head->content_length = length.value_or(0);
  return std::nullopt;
}

// Percent-decoding of a path segment or query value ('+' stays '+').
absl::StatusOr<std::string> PercentDecode(absl::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size() || !absl::ascii_isxdigit(in[i + 1]) ||
        !absl::ascii_isxdigit(in[i + 2]))
      return absl::InvalidArgumentError(
          "bad percent-encoding: '%' must be followed by two hex digits");
    auto digit = [](char c) {
      return absl::ascii_isdigit(c) ? c - '0'
                                    : absl::ascii_tolower(c) - 'a' + 10;
    };
    out.push_back(static_cast<char>(digit(in[i + 1]) * 16 + digit(in[i + 2])));
    i += 2;
  }
  return out;
}

// The raw value of `key` in a query string, if present.
std::optional<absl::string_view> QueryParam(absl::string_view query,
                                            absl::string_view key) {
  for (absl::string_view kv : absl::StrSplit(query, '&')) {
    size_t eq = kv.find('=');
    if (kv.substr(0, eq) == key)
      return eq == absl::string_view::npos ? absl::string_view()
                                           : kv.substr(eq + 1);
  }
  return std::nullopt;
}

// For messages: a key as readable text, shortened.
std::string Printable(absl::string_view bytes) {
  constexpr size_t kMax = 120;
  std::string s = absl::CHexEscape(bytes.substr(0, kMax));
  if (bytes.size() > kMax) s += "...";
  return s;
}

// ---- state requests ----

void AppendTo(void* out, const char* data, size_t len) {
  static_cast<std::string*>(out)->append(data, len);
}

// A state reply: its code, and its results (ok) or message (errors).
struct StateReply {
  StateCode code;
  std::string data;
  bool ok() const { return code == StateCode::kOk; }
};

int HttpStatus(StateCode c) {
  switch (c) {
    case StateCode::kOk:
      return 200;
    case StateCode::kNotFound:
      return 404;
    case StateCode::kInvalid:
      return 400;
    case StateCode::kWrongKind:
      return 409;
    case StateCode::kTooLarge:
      return 413;
    case StateCode::kTimeout:
      return 408;
    case StateCode::kUnavailable:
    case StateCode::kLost:
    case StateCode::kMoved:
    case StateCode::kRetry:
    case StateCode::kReconfigured:
      return 503;
    case StateCode::kInternal:
      return 500;
  }
  return 500;
}

Response StateError(const StateReply& r, absl::string_view message = {}) {
  Response res = Text(HttpStatus(r.code), message.empty() ? r.data : message);
  res.state_code = wire::StateCodeName(r.code);
  return res;
}

// A request the API refuses itself (the state service never sees it).
Response Invalid(absl::string_view message) {
  Response r = Text(400, message);
  r.state_code = wire::StateCodeName(StateCode::kInvalid);
  return r;
}

// One structure's requests, built the way silt/state.h builds them.
class Structure {
 public:
  Structure(const silt_state_api* api, StateKind kind, std::string name)
      : api_(api), kind_(kind), name_(std::move(name)) {}

  const std::string& name() const { return name_; }

  std::string Begin(StateOp op) const {
    std::string req;
    wire::WriteRequestHeader(&req, op, kind_, name_);
    return req;
  }

  StateReply Run(const std::string& req) const {
    std::string reply;
    if (api_->call(api_->host, req.data(), req.size(), &reply, &AppendTo) != 0)
      return {StateCode::kUnavailable,
              "the state service is unreachable: the instance lost its link "
              "to its invoker"};
    if (reply.empty())
      return {StateCode::kInternal, "empty reply from the state service"};
    auto code = static_cast<StateCode>(static_cast<uint8_t>(reply[0]));
    return {code, reply.substr(1)};
  }

  // Runs an op whose only result is a u64 (sizes, push_back's index).
  Response U64Op(std::string req, absl::string_view field) const {
    StateReply r = Run(req);
    if (!r.ok()) return StateError(r);
    wire::Reader rd(r.data);
    uint64_t n;
    if (!rd.U64(&n)) return Text(500, "bad reply from the state service");
    return Json(field, n);
  }

  // Runs an op whose result is one str (a value).
  Response ValueOp(std::string req, absl::string_view not_found = {}) const {
    StateReply r = Run(req);
    if (!r.ok())
      return StateError(r, r.code == StateCode::kNotFound ? not_found : "");
    wire::Reader rd(r.data);
    std::string_view v;
    if (!rd.Str(&v)) return Text(500, "bad reply from the state service");
    return Value(v);
  }

  // Runs an op without results.
  Response DoneOp(std::string req) const {
    StateReply r = Run(req);
    return r.ok() ? NoContent() : StateError(r);
  }

  // Pops with `timeout`: the value, or the reply's error (kTimeout included).
  StateReply Pop(std::chrono::milliseconds timeout) const {
    std::string req = Begin(StateOp::kQueuePop);
    wire::Writer(&req).U32(static_cast<uint32_t>(timeout.count()));
    return Run(req);
  }

 private:
  const silt_state_api* api_;
  StateKind kind_;
  std::string name_;
};

// A queue pop still waiting for a value.
struct PendingPop {
  std::string name;
  uint32_t timeout_ms = 0;
  Clock::time_point deadline;
};

Response PopResult(const StateReply& r, const PendingPop& p) {
  if (r.ok()) {
    wire::Reader rd(r.data);
    std::string_view v;
    if (!rd.Str(&v)) return Text(500, "bad reply from the state service");
    return Value(v);
  }
  if (r.code == StateCode::kTimeout) {
    std::string waited =
        p.timeout_ms ? absl::StrCat(" for ", p.timeout_ms, " ms") : "";
    return StateError(
        r, absl::StrCat("queue \"", p.name, "\" stayed empty", waited,
                        "; pass ?timeout_ms=N to wait longer"));
  }
  return StateError(r);
}

// Answers one request, or sets *wait for a queue pop that has to wait.
Response Handle(const silt_state_api* api, const Request& req,
                std::optional<PendingPop>* wait) {
  absl::string_view path = req.path;
  const std::string& m = req.method;
  bool get = m == "GET" || m == "HEAD";
  if (!absl::ConsumePrefix(&path, "/state/"))
    return Text(404, absl::StrCat("no such route: ", kRouteHelp));
  size_t slash = path.find('/');
  if (slash == absl::string_view::npos)
    return Text(404, absl::StrCat("no such route: ", kRouteHelp));
  absl::string_view kind_seg = path.substr(0, slash);
  path.remove_prefix(slash + 1);
  slash = path.find('/');
  auto name = PercentDecode(path.substr(0, slash));
  if (!name.ok()) return Invalid(name.status().message());
  if (name->size() > 0xffff)
    return Invalid("the structure name is too long: use 1-63 characters");
  std::optional<absl::string_view> rest;
  if (slash != absl::string_view::npos) rest = path.substr(slash + 1);

  if (kind_seg == "maps") {
    Structure s(api, StateKind::kMap, *std::move(name));
    if (!rest) {
      if (get) return s.U64Op(s.Begin(StateOp::kMapSize), "size");
      return MethodNotAllowed(m, "GET, HEAD");
    }
    auto key = PercentDecode(*rest);
    if (!key.ok()) return Invalid(key.status().message());
    std::string absent = absl::StrCat("map \"", s.name(), "\" has no key \"",
                                      Printable(*key), "\"");
    if (m == "GET") {
      std::string r = s.Begin(StateOp::kMapGet);
      wire::Writer(&r).Str(*key);
      return s.ValueOp(std::move(r), absent);
    }
    if (m == "HEAD" || m == "DELETE") {
      std::string r =
          s.Begin(m == "HEAD" ? StateOp::kMapContains : StateOp::kMapErase);
      wire::Writer(&r).Str(*key);
      StateReply rep = s.Run(r);
      if (!rep.ok()) return StateError(rep);
      wire::Reader rd(rep.data);
      uint8_t had;
      if (!rd.U8(&had)) return Text(500, "bad reply from the state service");
      if (!had) {
        Response res = Text(404, absent);
        res.state_code = wire::StateCodeName(StateCode::kNotFound);
        return res;
      }
      return m == "HEAD" ? Response{} : NoContent();
    }
    if (m == "PUT") {
      std::string r = s.Begin(StateOp::kMapPut);
      wire::Writer w(&r);
      w.Str(*key);
      w.Str(req.body);
      return s.DoneOp(std::move(r));
    }
    return MethodNotAllowed(m, "GET, HEAD, PUT, DELETE");
  }

  if (kind_seg == "vectors") {
    Structure s(api, StateKind::kVector, *std::move(name));
    if (!rest) {
      if (get) return s.U64Op(s.Begin(StateOp::kVecSize), "size");
      if (m == "POST") {
        std::string r = s.Begin(StateOp::kVecPush);
        wire::Writer(&r).Str(req.body);
        return s.U64Op(std::move(r), "index");
      }
      return MethodNotAllowed(m, "GET, HEAD, POST");
    }
    uint64_t index = 0;
    if (rest->empty() ||
        !std::all_of(rest->begin(), rest->end(),
                     [](char c) { return c >= '0' && c <= '9'; }) ||
        !absl::SimpleAtoi(*rest, &index))
      return Invalid(absl::StrCat("vector index \"", Printable(*rest),
                                  "\" is not a number: use "
                                  "/state/vectors/NAME/INDEX, INDEX from 0"));
    if (get) {
      std::string r = s.Begin(StateOp::kVecGet);
      wire::Writer(&r).U64(index);
      return s.ValueOp(std::move(r));
    }
    if (m == "PUT") {
      std::string r = s.Begin(StateOp::kVecSet);
      wire::Writer w(&r);
      w.U64(index);
      w.Str(req.body);
      return s.DoneOp(std::move(r));
    }
    return MethodNotAllowed(m, "GET, HEAD, PUT");
  }

  if (kind_seg == "queues") {
    Structure s(api, StateKind::kQueue, *std::move(name));
    if (!rest) {
      if (get) return s.U64Op(s.Begin(StateOp::kQueueSize), "size");
      if (m == "POST") {
        std::string r = s.Begin(StateOp::kQueuePush);
        wire::Writer(&r).Str(req.body);
        return s.DoneOp(std::move(r));
      }
      return MethodNotAllowed(m, "GET, HEAD, POST");
    }
    if (*rest != "pop")
      return Text(404, absl::StrCat("no such route: ", kRouteHelp));
    if (m != "POST") return MethodNotAllowed(m, "POST");
    PendingPop p;
    p.name = s.name();
    if (auto t = QueryParam(req.query, "timeout_ms"); t) {
      if (t->empty() || !absl::SimpleAtoi(*t, &p.timeout_ms) ||
          !std::all_of(t->begin(), t->end(),
                       [](char c) { return c >= '0' && c <= '9'; }))
        return Invalid(
            "timeout_ms must be a number of milliseconds "
            "(0 to 4294967295)");
    }
    // A first try without waiting: errors (bad name, wrong kind) come now.
    StateReply r = s.Pop(std::chrono::milliseconds(0));
    if (r.code == StateCode::kTimeout && p.timeout_ms > 0) {
      p.deadline = Clock::now() + std::chrono::milliseconds(p.timeout_ms);
      *wait = std::move(p);
      return Response{};
    }
    return PopResult(r, p);
  }
  return Text(404, absl::StrCat("no such route: ", kRouteHelp));
}

// ---- the server thread ----

struct Connection {
  int fd = -1;
  std::string in;   // received, not yet served
  std::string out;  // answers not yet sent, from out_sent on
  size_t out_sent = 0;
  bool continue_sent = false;
  bool keep_alive = true;
  bool peer_shut = false;  // the client shut down its side
  bool closing = false;    // no more requests: close once `out` is sent
  bool linger = false;     // ... after reading what the client still sends
  bool draining = false;   // lingering: reading and dropping its bytes
  size_t drained = 0;
  bool dead = false;  // close now
  std::optional<PendingPop> pop;
  bool Unsent() const { return out_sent < out.size(); }
};

class Loop {
 public:
  Loop(const silt_state_api* api, const StateHttpOptions& options,
       int listen_fd, int wake_fd)
      : api_(api),
        options_(options),
        listen_fd_(listen_fd),
        wake_fd_(wake_fd) {}

  ~Loop() {
    for (auto& c : conns_) close(c->fd);
  }

  // Serves until the wake fd is signalled.
  void Run() {
    size_t next_pop = 0;
    while (true) {
      bool popping = false;
      std::vector<pollfd> fds;
      fds.push_back({wake_fd_, POLLIN, 0});
      bool accepting =
          static_cast<int>(conns_.size()) < options_.max_connections;
      fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
      for (auto& c : conns_) {
        popping |= c->pop.has_value();
        short events = 0;
        if (c->draining || Readable(*c)) events |= POLLIN;
        if (c->Unsent()) events |= POLLOUT;
        if (!c->peer_shut) events |= POLLRDHUP;
        fds.push_back({c->fd, events, 0});
      }
      int n = poll(fds.data(), fds.size(), popping ? 0 : -1);
      if (n < 0 && errno != EINTR) return;
      if (n < 0) continue;
      if (fds[0].revents) break;  // Stop()
      if (fds[1].revents & POLLIN) Accept();
      for (size_t i = 2; i < fds.size(); ++i) {
        Connection& c = *conns_[i - 2];
        short ev = fds[i].revents;
        if (ev & (POLLERR | POLLNVAL | POLLHUP)) {
          c.dead = true;
          continue;
        }
        if (ev & POLLIN) ReadFrom(c);
        if (ev & POLLOUT) WriteTo(c);
        if ((ev & POLLRDHUP) && !(ev & POLLIN)) {
          c.peer_shut = true;
          if (c.pop) c.dead = true;  // it stopped waiting for the value
        }
      }
      // One step of one waiting pop; it blocks only when nothing else is
      // ready.
      std::vector<Connection*> pops;
      for (auto& c : conns_)
        if (c->pop && !c->dead) pops.push_back(c.get());
      if (!pops.empty()) PopStep(*pops[next_pop++ % pops.size()], n > 0);
      Reap();
    }
    // Stopping: answer waiting pops, best effort.
    for (auto& c : conns_) {
      if (!c->pop || c->dead) continue;
      Response r = Text(503,
                        "the instance is being checkpointed or parked; retry "
                        "the pop");
      r.close = true;
      c->out += Serialize(r, false);
      c->pop.reset();
      WriteTo(*c);
    }
  }

 private:
  bool Readable(const Connection& c) const {
    return !c.closing && !c.dead && !c.pop && c.out.size() < kMaxUnsentBytes &&
           c.in.size() <= options_.max_head_bytes + options_.max_body_bytes;
  }

  void Accept() {
    while (static_cast<int>(conns_.size()) < options_.max_connections) {
      int fd =
          accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      auto c = std::make_unique<Connection>();
      c->fd = fd;
      conns_.push_back(std::move(c));
    }
  }

  void ReadFrom(Connection& c) {
    char buf[kReadChunk];
    ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n < 0) {
      c.dead = true;
      return;
    }
    if (c.draining) {
      c.drained += static_cast<size_t>(n);
      if (n == 0 ||
          c.drained > options_.max_head_bytes + options_.max_body_bytes)
        c.dead = true;
      return;
    }
    if (n == 0) {  // answer what it sent, then close
      c.peer_shut = true;
      c.closing = true;
      if (c.pop) c.dead = true;
      return;
    }
    c.in.append(buf, static_cast<size_t>(n));
    Serve(c);
  }

  // Answers the complete requests in c.in, in order.
  void Serve(Connection& c) {
    while (!c.closing && !c.dead && !c.pop && c.out.size() < kMaxUnsentBytes) {
      size_t end = HeadEnd(c.in);
      if (end == absl::string_view::npos ? c.in.size() > options_.max_head_bytes
                                         : end > options_.max_head_bytes + 2) {
        Answer(c,
               BadHttp(431, absl::StrCat("the request line and headers "
                                         "are over ",
                                         options_.max_head_bytes, " bytes")));
        break;
      }
      if (end == absl::string_view::npos) break;
      Head head;
      head.length = end;
      if (auto err = ParseHead(absl::string_view(c.in).substr(0, end), &head)) {
        Answer(c, BadHttp(err->status, err->message));
        break;
      }
      bool head_request = head.request.method == "HEAD";
      if (head.content_length > options_.max_body_bytes) {
        Answer(c,
               BadHttp(413, absl::StrCat("a body of ", head.content_length,
                                         " bytes is over the state API's "
                                         "limit of ",
                                         options_.max_body_bytes,
                                         " bytes (values are at most 1 MiB)")),
               head_request);
        break;
      }
      if (c.in.size() < end + head.content_length) {
        if (head.expect_continue && !c.continue_sent) {
          c.out += "HTTP/1.1 100 Continue\r\n\r\n";
          c.continue_sent = true;
          WriteTo(c);
        }
        break;
      }
      Request req = std::move(head.request);
      req.body = c.in.substr(end, head.content_length);
      c.in.erase(0, end + head.content_length);
      c.continue_sent = false;
      c.keep_alive = req.keep_alive;
      std::optional<PendingPop> wait;
      Response r = Dispatch(req, &wait);
      if (wait) {
        c.pop = std::move(wait);
        break;
      }
      Answer(c, std::move(r), head_request);
    }
  }

  // The last line of defence: nothing on the request path throws, but a
  // failed allocation must not take the instance down.
  Response Dispatch(const Request& req, std::optional<PendingPop>* wait) {
    try {
      return Handle(api_, req, wait);
    } catch (const std::exception& e) {
      return Text(500, absl::StrCat("state API: ", e.what()));
    } catch (...) {
      return Text(500, "state API: unexpected error");
    }
  }

  void Answer(Connection& c, Response r, bool head_request = false) {
    if (!c.keep_alive) r.close = true;
    if (r.close) c.closing = true;
    // After an error mid-stream the client may still be sending: read that
    // before closing, or the kernel would reset the connection and lose
    // the answer.
    if (r.bad) c.linger = true;
    c.out += Serialize(r, head_request);
    WriteTo(c);
  }

  void PopStep(Connection& c, bool busy) {
    PendingPop& p = *c.pop;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        p.deadline - Clock::now());
    std::chrono::milliseconds wait{0};
    if (!busy && left.count() > 0) wait = std::min(left, options_.pop_slice);
    Structure s(api_, StateKind::kQueue, p.name);
    StateReply r = s.Pop(wait);
    if (r.code == StateCode::kTimeout && Clock::now() < p.deadline) return;
    Response res = PopResult(r, p);
    c.pop.reset();
    Answer(c, std::move(res));
    Serve(c);  // requests pipelined behind the pop
  }

  void WriteTo(Connection& c) {
    while (c.Unsent()) {
      ssize_t n = send(c.fd, c.out.data() + c.out_sent,
                       c.out.size() - c.out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out_sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      c.dead = true;  // the client is gone
      return;
    }
    c.out.clear();
    c.out_sent = 0;
  }

  void Reap() {
    for (auto& c : conns_) {
      if (c->dead || !c->closing || c->Unsent() || c->draining) continue;
      if (c->linger && !c->peer_shut) {
        shutdown(c->fd, SHUT_WR);
        c->draining = true;
      } else {
        c->dead = true;
      }
    }
    auto gone = [](const std::unique_ptr<Connection>& c) {
      if (!c->dead) return false;
      close(c->fd);
      return true;
    };
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(), gone),
                 conns_.end());
  }

  const silt_state_api* api_;
  const StateHttpOptions& options_;
  int listen_fd_;
  int wake_fd_;
  std::vector<std::unique_ptr<Connection>> conns_;
};

}  // namespace

StateHttpServer::StateHttpServer(const silt_state_api* api,
                                 StateHttpOptions options)
    : api_(api), options_(options) {}

StateHttpServer::~StateHttpServer() { Stop(); }

std::string StateHttpServer::url() const {
  return absl::StrCat("http://127.0.0.1:", port_);
}

absl::Status StateHttpServer::Start() {
  if (thread_.joinable())
    return absl::FailedPreconditionError("the state API is already running");
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return absl::UnavailableError(
        absl::StrCat("state API: socket: ", strerror(errno)));
  // Connections of the previous run may linger in TIME_WAIT on the port.
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port_);
  bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (!bound && port_ != 0) {  // taken (fork clones share a network namespace)
    addr.sin_port = 0;
    bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  socklen_t len = sizeof(addr);
  if (!bound || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("state API: cannot listen on 127.0.0.1: ", strerror(err)));
  }
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("state API: eventfd: ", strerror(err)));
  }
  listen_fd_ = fd;
  wake_fd_ = wake;
  port_ = ntohs(addr.sin_port);
  thread_tid_ = 0;
  try {
    thread_ = std::thread([this] { Run(); });
  } catch (const std::system_error& e) {  // e.g. the cgroup's pids limit
    close(listen_fd_);
    close(wake_fd_);
    listen_fd_ = wake_fd_ = -1;
    return absl::UnavailableError(
        absl::StrCat("state API: cannot start its thread: ", e.what()));
  }
  return absl::OkStatus();
}

void StateHttpServer::Run() {
  thread_tid_ = static_cast<int>(syscall(SYS_gettid));
  Loop loop(api_, options_, listen_fd_, wake_fd_);
  loop.Run();
}

void StateHttpServer::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
  // pthread_join returns when the thread's tid is cleared, a moment before
  // the kernel removes the task; a checkpoint must not see it.
  int tid = thread_tid_;
  for (int i = 0; tid > 0 && i < 10000; ++i) {
    if (syscall(SYS_tgkill, getpid(), tid, 0) != 0 && errno == ESRCH) break;
    struct timespec ts = {0, 100 * 1000};
    nanosleep(&ts, nullptr);
  }
}

}  // namespace silt::invoker
