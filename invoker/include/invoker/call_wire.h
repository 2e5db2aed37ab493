// The call path from the gateway to an invoker: the invoker's call port.
//
// Function calls do not go through gRPC (which stays for control: register,
// load reports, deploy, logs). The gateway keeps a pool of TCP connections per
// node, each carrying one call at a time: a request frame out, a reply frame
// back. One call per connection means no multiplexing layer and no thread
// handoff on either side: the gateway writes from the thread that parsed the
// HTTP request and completes the HTTP answer on the thread that reads the
// reply; the invoker's connection thread runs the call in an instance itself.
//
// Every frame is a u32 little-endian length and that many bytes; the first
// byte of a frame is its Op. A connection opens with kHello (the cluster's
// data key, which the gateway hands to its invokers); an invoker closes a
// connection whose key does not match, or any malformed frame.
//
// A call's answer is one kReply, or, when the function streams its response
// (silt/function.h Context::Write, an http-mode server's chunked or unsized
// body), a kReplyHead (a Reply: status, headers, the first bytes of the body,
// the start tier), any number of kBodyPart frames (the next bytes, as the
// function wrote them), and a kReply that ends it (the last bytes; its status
// and headers are not used; an outcome other than kAnswered, or a failure,
// means the body broke off).
//
// A request body may stream too (a large or chunked upload): a kRequestHead
// (a Request: the call, its spec and the first bytes of the body), any
// number of kBodyPart frames and a kBodyEnd (the last bytes); only then does
// the invoker answer. An invoker that answers without running the call (an
// error) reads the rest of the body first, so the connection stays usable.
//
// Leases (the node-local path). An invoker also listens on an abstract unix
// socket (Register.call_socket), reachable only from its own network
// namespace: a gateway there may lease a warm instance and send the
// function's calls straight to it (worker.proto's WorkerCall and WorkerReply
// on the instance's channel, passed with the lease), one at a time, taking
// the invoker off the call's path. The invoker counts a lent instance busy
// and touches nothing of it until it comes back. The lease connection opens
// with kHello too; then:
//   kLease (gateway)     ask for an idle instance of a function version;
//   kLeased (invoker)    one is lent, its channel passed with the frame; or
//   kNoLease (invoker)   none is (or the version is not here): the call
//                        port serves the function meanwhile;
//   kReturn (gateway)    the lease ends (or, kCheck, an answer is wanted);
//   kReturned (invoker)  the answer to a kReturn that asks for one;
//   kRecall (invoker)    give it back once its call ends (a call through
//                        the call port waits for an instance).
// A lease connection that closes gives back every lease on it, broken.
#ifndef SILT_INVOKER_CALL_WIRE_H_
#define SILT_INVOKER_CALL_WIRE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace silt::invoker::call_wire {

enum class Op : uint8_t {
  kHello = 1,        // str key
  kRequest = 2,      // a Request
  kReply = 3,        // a Reply
  kReplyHead = 4,    // a Reply whose body goes on in the frames after it
  kBodyPart = 5,     // raw bytes: the next part of a streamed body
  kRequestHead = 6,  // a Request whose body goes on in the frames after it
  kBodyEnd = 7,      // raw bytes: the last part of a streamed request body
  kLease = 8,        // a LeaseAsk
  kLeased = 9,       // a Leased (with the instance's channel as SCM_RIGHTS)
  kNoLease = 10,     // u64 ask
  kReturn = 11,      // a Return
  kReturned = 12,    // a Returned
  kRecall = 13,      // u64 lease
};

// How the call must start its instance (X-Silt-Cold-Start; benchmarks and
// tests): kAny takes an idle one or starts one the usual way; the others
// start a new instance that way and discard it after the call.
enum class ColdStart : uint8_t { kAny = 0, kBoot, kRestore, kFork, kCriu };
// "boot", "restore", "fork", "criu"; nullopt for anything else.
std::optional<ColdStart> ParseColdStart(std::string_view s);

// How the instance that served a call had started.
enum class StartTier : uint8_t { kWarm = 0, kBoot, kRestore, kFork, kCriu };
const char* StartTierName(StartTier t);  // "warm", "boot", ...

// Why an instance died serving a call (the reply is then a 502).
enum class Failure : uint8_t { kNone = 0, kOom, kSeccomp, kCrash };
const char* FailureName(Failure f);  // "", "oom", "seccomp", "crash"

// Whether the invoker ran the call. kAnswered: the function's answer (or a
// 502 for an instance that died) is in the reply. kNeedSpec: the node does
// not know this function version; send it again with `spec`. kError: it did
// not run; `error_code` (an absl::StatusCode) and `error` say why.
enum class Outcome : uint8_t { kAnswered = 0, kNeedSpec = 1, kError = 2 };

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string ns, name;
  uint64_t generation = 0;
  std::string call_id, method, path, query;
  Headers headers;
  std::string body;
  uint32_t timeout_ms = 0;  // 0: the function's own (exec_timeout) or 60 s
  ColdStart cold_start = ColdStart::kAny;
  std::string spec;  // a serialized FunctionSpec, after kNeedSpec; or empty
  // Sent (or read) as a kRequestHead: the body goes on in kBodyPart frames
  // and a kBodyEnd. Such a request carries its spec (a body already sent
  // cannot be sent again after a kNeedSpec).
  bool head = false;
};

struct Reply {
  Outcome outcome = Outcome::kAnswered;
  uint8_t error_code = 0;
  std::string error;
  uint16_t status = 0;
  Headers headers;
  std::string body;
  StartTier tier = StartTier::kWarm;
  uint32_t start_us = 0;  // the start's own cost (0 when warm)
  std::string instance;
  Failure failure = Failure::kNone;
  // The function's instances on the node once the call is done, so that the
  // gateway's availableReplicas is right the moment the caller has its answer.
  uint32_t ready = 0, busy = 0;
  // Sent (or read) as a kReplyHead: the body goes on in kBodyPart frames.
  bool head = false;
};

struct LeaseAsk {
  uint64_t ask = 0;  // echoed in the answer
  std::string ns, name;
  uint64_t generation = 0;
};

struct Leased {
  uint64_t ask = 0, lease = 0;
  std::string instance;
  uint32_t timeout_ms = 0;  // the function's longest call (exec_timeout)
};

// How a lease ends. kIdle: it served its calls and is given back whole.
// kBroken: its channel broke (closed, or a malformed reply): the invoker
// answers how the instance died. kTimedOut: a call ran past its time.
// kCallerGone: a streamed reply's caller went away. kLost: the reply said
// instance_lost (its server is gone): the invoker answers why. kCheck: not
// given back; a call answered 5xx and the invoker answers whether a process
// of the instance was killed at its memory limit meanwhile ("" if not).
// Every kind but kIdle and kCheck stops the instance.
enum class ReturnHow : uint8_t {
  kIdle = 0,
  kBroken,
  kTimedOut,
  kCallerGone,
  kLost,
  kCheck
};
// Whether the invoker answers a kReturn of this kind with a kReturned.
inline bool ReturnAnswered(ReturnHow h) {
  return h == ReturnHow::kBroken || h == ReturnHow::kLost ||
         h == ReturnHow::kCheck;
}

struct Return {
  uint64_t lease = 0;
  ReturnHow how = ReturnHow::kIdle;
};

struct Returned {
  uint64_t lease = 0;
  Failure failure = Failure::kNone;
  std::string text;  // how it died / why it was lost / the memory limit note
};

// Largest frame either side accepts (a body of 64 MiB and its headers).
inline constexpr uint32_t kMaxFrameBytes = (64u << 20) + (1u << 20);

// Append one whole frame (length prefix included) to *out.
void AppendHello(std::string* out, std::string_view key);
void AppendRequest(std::string* out, const Request& r);
void AppendReply(std::string* out, const Reply& r);  // kReply or kReplyHead
void AppendBodyPart(std::string* out, std::string_view bytes);
void AppendBodyEnd(std::string* out, std::string_view bytes);

void AppendLeaseAsk(std::string* out, const LeaseAsk& a);
void AppendLeased(std::string* out, const Leased& l);
void AppendNoLease(std::string* out, uint64_t ask);
void AppendReturn(std::string* out, const Return& r);
void AppendReturned(std::string* out, const Returned& r);
void AppendRecall(std::string* out, uint64_t lease);

// Parse a frame's payload (after the length prefix). False when it is not a
// well-formed frame of that kind.
bool ParseHello(std::string_view payload, std::string_view* key);
bool ParseRequest(std::string_view payload, Request* r);  // either kind
bool ParseReply(std::string_view payload, Reply* r);      // either kind
bool ParseBodyPart(std::string_view payload, std::string_view* bytes);
// A part of a streamed request body: a kBodyPart, or a kBodyEnd (`last`).
bool ParseRequestPart(std::string_view payload, std::string_view* bytes,
                      bool* last);
bool ParseLeaseAsk(std::string_view payload, LeaseAsk* a);
bool ParseLeased(std::string_view payload, Leased* l);
bool ParseNoLease(std::string_view payload, uint64_t* ask);
bool ParseReturn(std::string_view payload, Return* r);
bool ParseReturned(std::string_view payload, Returned* r);
bool ParseRecall(std::string_view payload, uint64_t* lease);
// A frame's Op byte; 0 for an empty frame.
inline uint8_t OpOf(std::string_view payload) {
  return payload.empty() ? 0 : static_cast<uint8_t>(payload[0]);
}

}  // namespace silt::invoker::call_wire

#endif  // SILT_INVOKER_CALL_WIRE_H_
