#include "invoker/call_wire.h"

#include <cstring>

#include "silt/state_wire.h"

namespace silt::invoker::call_wire {
namespace {

// Reserves the length prefix; Finish fills it in.
size_t Begin(std::string* out, Op op) {
  size_t at = out->size();
  out->append(4, '\0');
  out->push_back(static_cast<char>(op));
  return at;
}

void Finish(std::string* out, size_t at) {
  uint32_t n = static_cast<uint32_t>(out->size() - at - 4);
  memcpy(out->data() + at, &n, 4);
}

void WriteHeaders(wire::Writer& w, const Headers& h) {
  w.U32(static_cast<uint32_t>(h.size()));
  for (const auto& [k, v] : h) {
    w.Str(k);
    w.Str(v);
  }
}

bool ReadStr(wire::Reader& r, std::string* s) {
  std::string_view v;
  if (!r.Str(&v)) return false;
  s->assign(v.data(), v.size());
  return true;
}

bool ReadHeaders(wire::Reader& r, Headers* h) {
  uint32_t n;
  // Each header takes at least 8 bytes: a count past that is malformed.
  if (!r.U32(&n) || n > r.rest().size() / 8) return false;
  h->resize(n);
  for (auto& [k, v] : *h)
    if (!ReadStr(r, &k) || !ReadStr(r, &v)) return false;
  return true;
}

bool Expect(wire::Reader& r, Op op) {
  uint8_t b;
  return r.U8(&b) && b == static_cast<uint8_t>(op);
}

}  // namespace

std::optional<ColdStart> ParseColdStart(std::string_view s) {
  if (s == "boot") return ColdStart::kBoot;
  if (s == "restore") return ColdStart::kRestore;
  if (s == "fork") return ColdStart::kFork;
  if (s == "criu") return ColdStart::kCriu;
  return std::nullopt;
}

const char* StartTierName(StartTier t) {
  switch (t) {
    case StartTier::kWarm:
      return "warm";
    case StartTier::kBoot:
      return "boot";
    case StartTier::kRestore:
      return "restore";
    case StartTier::kFork:
      return "fork";
    case StartTier::kCriu:
      return "criu";
  }
  return "unknown";
}

const char* FailureName(Failure f) {
  switch (f) {
    case Failure::kNone:
      return "";
    case Failure::kOom:
      return "oom";
    case Failure::kSeccomp:
      return "seccomp";
    case Failure::kCrash:
      return "crash";
  }
  return "crash";
}

void AppendHello(std::string* out, std::string_view key) {
  size_t at = Begin(out, Op::kHello);
  wire::Writer w(out);
  w.Str(key);
  Finish(out, at);
}

void AppendRequest(std::string* out, const Request& r) {
  size_t at = Begin(out, r.head ? Op::kRequestHead : Op::kRequest);
  out->reserve(out->size() + 128 + r.body.size() + r.spec.size());
  wire::Writer w(out);
  w.Str(r.ns);
  w.Str(r.name);
  w.U64(r.generation);
  w.Str(r.call_id);
  w.Str(r.method);
  w.Str(r.path);
  w.Str(r.query);
  WriteHeaders(w, r.headers);
  w.Str(r.body);
  w.U32(r.timeout_ms);
  w.U8(static_cast<uint8_t>(r.cold_start));
  w.Str(r.spec);
  Finish(out, at);
}

void AppendReply(std::string* out, const Reply& r) {
  size_t at = Begin(out, r.head ? Op::kReplyHead : Op::kReply);
  out->reserve(out->size() + 128 + r.body.size());
  wire::Writer w(out);
  w.U8(static_cast<uint8_t>(r.outcome));
  w.U8(r.error_code);
  w.Str(r.error);
  w.U16(r.status);
  WriteHeaders(w, r.headers);
  w.Str(r.body);
  w.U8(static_cast<uint8_t>(r.tier));
  w.U32(r.start_us);
  w.Str(r.instance);
  w.U8(static_cast<uint8_t>(r.failure));
  w.U32(r.ready);
  w.U32(r.busy);
  Finish(out, at);
}

void AppendBodyPart(std::string* out, std::string_view bytes) {
  size_t at = Begin(out, Op::kBodyPart);
  out->append(bytes.data(), bytes.size());
  Finish(out, at);
}

void AppendBodyEnd(std::string* out, std::string_view bytes) {
  size_t at = Begin(out, Op::kBodyEnd);
  out->append(bytes.data(), bytes.size());
  Finish(out, at);
}

bool ParseBodyPart(std::string_view payload, std::string_view* bytes) {
  if (OpOf(payload) != static_cast<uint8_t>(Op::kBodyPart)) return false;
  *bytes = payload.substr(1);
  return true;
}

bool ParseRequestPart(std::string_view payload, std::string_view* bytes,
                      bool* last) {
  uint8_t op = OpOf(payload);
  if (op != static_cast<uint8_t>(Op::kBodyPart) &&
      op != static_cast<uint8_t>(Op::kBodyEnd))
    return false;
  *bytes = payload.substr(1);
  *last = op == static_cast<uint8_t>(Op::kBodyEnd);
  return true;
}

bool ParseHello(std::string_view payload, std::string_view* key) {
  wire::Reader r(payload);
  return Expect(r, Op::kHello) && r.Str(key) && r.done();
}

bool ParseRequest(std::string_view payload, Request* out) {
  wire::Reader r(payload);
  uint8_t op, cold;
  if (!r.U8(&op) || (op != static_cast<uint8_t>(Op::kRequest) &&
                     op != static_cast<uint8_t>(Op::kRequestHead)))
    return false;
  out->head = op == static_cast<uint8_t>(Op::kRequestHead);
  if (!ReadStr(r, &out->ns) || !ReadStr(r, &out->name) ||
      !r.U64(&out->generation) || !ReadStr(r, &out->call_id) ||
      !ReadStr(r, &out->method) || !ReadStr(r, &out->path) ||
      !ReadStr(r, &out->query) || !ReadHeaders(r, &out->headers) ||
      !ReadStr(r, &out->body) || !r.U32(&out->timeout_ms) || !r.U8(&cold) ||
      !ReadStr(r, &out->spec) || !r.done())
    return false;
  if (cold > static_cast<uint8_t>(ColdStart::kCriu)) return false;
  out->cold_start = static_cast<ColdStart>(cold);
  return true;
}

bool ParseReply(std::string_view payload, Reply* out) {
  wire::Reader r(payload);
  uint8_t op, outcome, tier, failure;
  if (!r.U8(&op) || (op != static_cast<uint8_t>(Op::kReply) &&
                     op != static_cast<uint8_t>(Op::kReplyHead)))
    return false;
  out->head = op == static_cast<uint8_t>(Op::kReplyHead);
  if (!r.U8(&outcome) || !r.U8(&out->error_code) || !ReadStr(r, &out->error) ||
      !r.U16(&out->status) || !ReadHeaders(r, &out->headers) ||
      !ReadStr(r, &out->body) || !r.U8(&tier) || !r.U32(&out->start_us) ||
      !ReadStr(r, &out->instance) || !r.U8(&failure) || !r.U32(&out->ready) ||
      !r.U32(&out->busy) || !r.done())
    return false;
  if (outcome > static_cast<uint8_t>(Outcome::kError) ||
      tier > static_cast<uint8_t>(StartTier::kCriu) ||
      failure > static_cast<uint8_t>(Failure::kCrash))
    return false;
  out->outcome = static_cast<Outcome>(outcome);
  out->tier = static_cast<StartTier>(tier);
  out->failure = static_cast<Failure>(failure);
  return true;
}

void AppendLeaseAsk(std::string* out, const LeaseAsk& a) {
  size_t at = Begin(out, Op::kLease);
  wire::Writer w(out);
  w.U64(a.ask);
  w.Str(a.ns);
  w.Str(a.name);
  w.U64(a.generation);
  Finish(out, at);
}

void AppendLeased(std::string* out, const Leased& l) {
  size_t at = Begin(out, Op::kLeased);
  wire::Writer w(out);
  w.U64(l.ask);
  w.U64(l.lease);
  w.Str(l.instance);
  w.U32(l.timeout_ms);
  Finish(out, at);
}

void AppendNoLease(std::string* out, uint64_t ask) {
  size_t at = Begin(out, Op::kNoLease);
  wire::Writer w(out);
  w.U64(ask);
  Finish(out, at);
}

void AppendReturn(std::string* out, const Return& r) {
  size_t at = Begin(out, Op::kReturn);
  wire::Writer w(out);
  w.U64(r.lease);
  w.U8(static_cast<uint8_t>(r.how));
  Finish(out, at);
}

void AppendReturned(std::string* out, const Returned& r) {
  size_t at = Begin(out, Op::kReturned);
  wire::Writer w(out);
  w.U64(r.lease);
  w.U8(static_cast<uint8_t>(r.failure));
  w.Str(r.text);
  Finish(out, at);
}

void AppendRecall(std::string* out, uint64_t lease) {
  size_t at = Begin(out, Op::kRecall);
  wire::Writer w(out);
  w.U64(lease);
  Finish(out, at);
}

bool ParseLeaseAsk(std::string_view payload, LeaseAsk* a) {
  wire::Reader r(payload);
  return Expect(r, Op::kLease) && r.U64(&a->ask) && ReadStr(r, &a->ns) &&
         ReadStr(r, &a->name) && r.U64(&a->generation) && r.done();
}

bool ParseLeased(std::string_view payload, Leased* l) {
  wire::Reader r(payload);
  return Expect(r, Op::kLeased) && r.U64(&l->ask) && r.U64(&l->lease) &&
         ReadStr(r, &l->instance) && r.U32(&l->timeout_ms) && r.done();
}

bool ParseNoLease(std::string_view payload, uint64_t* ask) {
  wire::Reader r(payload);
  return Expect(r, Op::kNoLease) && r.U64(ask) && r.done();
}

bool ParseReturn(std::string_view payload, Return* out) {
  wire::Reader r(payload);
  uint8_t how;
  if (!Expect(r, Op::kReturn) || !r.U64(&out->lease) || !r.U8(&how) ||
      !r.done() || how > static_cast<uint8_t>(ReturnHow::kCheck))
    return false;
  out->how = static_cast<ReturnHow>(how);
  return true;
}

bool ParseReturned(std::string_view payload, Returned* out) {
  wire::Reader r(payload);
  uint8_t failure;
  if (!Expect(r, Op::kReturned) || !r.U64(&out->lease) || !r.U8(&failure) ||
      !ReadStr(r, &out->text) || !r.done() ||
      failure > static_cast<uint8_t>(Failure::kCrash))
    return false;
  out->failure = static_cast<Failure>(failure);
  return true;
}

bool ParseRecall(std::string_view payload, uint64_t* lease) {
  wire::Reader r(payload);
  return Expect(r, Op::kRecall) && r.U64(lease) && r.done();
}

}  // namespace silt::invoker::call_wire
