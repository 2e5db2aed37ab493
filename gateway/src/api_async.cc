// Async calls over HTTP (async_queue.h):
//   POST   /async-function/NAME[.NS][/path]  accept: 202 with X-Call-Id
//   GET    /system/async[?namespace=&function=&state=queued|callback|dead]
//   GET    /system/async/ID                  one call
//   DELETE /system/async/ID                  drop it (not while it runs)
//   POST   /system/async/ID/retry            a dead letter back in the queue
//   POST   /system/async/retry[?namespace=&function=]  every dead letter
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "api.h"

namespace silt::gateway {
namespace {

using nlohmann::ordered_json;

HttpResponse MethodNotAllowed() { return HttpResponse::Empty(405); }

// Call ids are store keys and travel in headers: printable, no separators a
// header or a path could not carry.
absl::Status ValidateCallId(absl::string_view id) {
  bool ok = !id.empty() && id.size() <= 128;
  for (char c : id)
    ok = ok && (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' ||
                c == ':');
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "X-Call-Id must be 1 to 128 letters, digits, '-', '_', '.' or ':'");
}

// What the callback sender can reach: http://HOST[:PORT][/PATH].
absl::Status ValidateCallbackUrl(absl::string_view url) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("X-Callback-Url \"", url, "\": ", why));
  };
  for (char c : url)
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f)
      return bad("contains spaces or control characters");
  absl::string_view rest = url;
  if (absl::StartsWithIgnoreCase(rest, "https://"))
    return bad("https is not supported yet: give an http:// URL");
  if (!absl::ConsumePrefix(&rest, "http://"))
    return bad("must be an http:// URL");
  absl::string_view hostport = rest.substr(0, rest.find('/'));
  if (hostport.empty() || absl::StartsWith(hostport, ":"))
    return bad("has no host");
  size_t colon = hostport.rfind(':');
  if (colon != absl::string_view::npos && hostport.back() != ']') {
    absl::string_view port = hostport.substr(colon + 1);
    int p = 0;
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
        (p = std::stoi(std::string(port))) == 0 || p > 65535)
      return bad("has a bad port");
  }
  return absl::OkStatus();
}

std::string Rfc3339(int64_t unix_ms) {
  return absl::FormatTime(absl::RFC3339_full, absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

ordered_json ViewJson(const AsyncView& v) {
  ordered_json j = {{"callId", v.call_id},
                    {"function", v.name},
                    {"namespace", v.ns},
                    {"state", AsyncStateName(v.state)},
                    {"running", v.running},
                    {"attempts", v.attempts},
                    {"callbackAttempts", v.callback_attempts},
                    {"enqueued", Rfc3339(v.enqueued_unix_ms)},
                    {"enqueuedUnixMs", v.enqueued_unix_ms},
                    {"nextAttempt", Rfc3339(v.next_attempt_unix_ms)},
                    {"lastStatus", v.last_status},
                    {"lastError", v.last_error}};
  if (!v.callback_url.empty()) j["callbackUrl"] = v.callback_url;
  return j;
}

}  // namespace

absl::StatusOr<HttpResponse> Api::EnqueueAsync(const HttpRequest& req,
                                               const std::string& ns,
                                               const std::string& name,
                                               const std::string& call_id) {
  if (async_ == nullptr)
    return absl::UnavailableError(
        "asynchronous calls are not available on this gateway");
  if (req.HasHeader("X-Call-Id"))
    if (auto s = ValidateCallId(call_id); !s.ok()) return s;
  AsyncCall call;
  call.call_id = call_id;
  call.ns = ns;
  call.name = name;
  if (req.HasHeader("X-Callback-Url")) {
    call.callback_url =
        std::string(absl::StripAsciiWhitespace(req.Header("X-Callback-Url")));
    if (auto s = ValidateCallbackUrl(call.callback_url); !s.ok()) return s;
  }
  absl::string_view rest =
      absl::string_view(req.path).substr(16);  // "/async-function/"
  size_t slash = rest.find('/');
  call.path =
      slash == absl::string_view::npos ? "/" : std::string(rest.substr(slash));
  call.query = req.query;
  for (const auto& [k, v] : req.headers) {
    if (IsHopByHop(k) || absl::EqualsIgnoreCase(k, "Content-Length") ||
        absl::EqualsIgnoreCase(k, "X-Call-Id"))
      continue;
    call.headers.emplace_back(k, v);
  }
  call.headers.emplace_back("X-Call-Id", call_id);
  if (!req.HasHeader("X-Forwarded-For"))
    call.headers.emplace_back("X-Forwarded-For", req.remote);
  call.body = req.body;
  absl::Status s = async_->Enqueue(std::move(call));
  if (!s.ok() && !absl::IsAlreadyExists(s)) {
    if (absl::IsResourceExhausted(s)) return s;
    return absl::InternalError(
        absl::StrCat("Error queuing request: ", s.message()));
  }
  HttpResponse res = HttpResponse::Empty(202);
  res.SetHeader("X-Call-Id", call_id);
  return res;
}

absl::StatusOr<HttpResponse> Api::ListAsync(const HttpRequest& req) {
  if (async_ == nullptr)
    return absl::UnavailableError(
        "asynchronous calls are not available on this gateway");
  AsyncFilter f;
  f.ns = req.QueryParam("namespace");
  f.name = req.QueryParam("function");
  std::string state = req.QueryParam("state");
  if (!state.empty()) {
    auto st = ParseAsyncState(state);
    if (!st.ok()) return st.status();
    f.any_state = false;
    f.state = *st;
  }
  ordered_json out = ordered_json::array();
  for (const auto& v : async_->List(f)) out.push_back(ViewJson(v));
  return HttpResponse::Json(200, JsonText(out));
}

absl::StatusOr<HttpResponse> Api::AsyncCallAction(const HttpRequest& req,
                                                  absl::string_view arg) {
  if (async_ == nullptr)
    return absl::UnavailableError(
        "asynchronous calls are not available on this gateway");
  const std::string& m = req.method;
  if (arg == "retry") {
    if (m != "POST") return MethodNotAllowed();
    AsyncFilter f;
    f.ns = req.QueryParam("namespace");
    f.name = req.QueryParam("function");
    auto n = async_->RetryAll(f);
    if (!n.ok()) return n.status();
    return HttpResponse::Json(200, JsonText(ordered_json({{"retried", *n}})));
  }
  std::string id(arg);
  bool retry = absl::ConsumeSuffix(&arg, "/retry");
  id = std::string(arg);
  if (auto s = ValidateCallId(id); !s.ok())
    return HttpResponse::Text(404, "404 page not found");
  auto find = [&]() -> absl::StatusOr<AsyncView> {
    for (auto& v : async_->List({}))
      if (v.call_id == id) return v;
    return absl::NotFoundError(
        absl::StrCat("no async call ", id, " (it may have completed)"));
  };
  if (retry) {
    if (m != "POST") return MethodNotAllowed();
    if (auto s = async_->Retry(id); !s.ok()) return s;
    auto v = find();
    if (!v.ok()) return HttpResponse::Empty(202);  // already done again
    return HttpResponse::Json(202, JsonText(ViewJson(*v)));
  }
  if (m == "DELETE") {
    if (auto s = async_->Remove(id); !s.ok()) return s;
    return HttpResponse::Empty(204);
  }
  if (m != "GET") return MethodNotAllowed();
  auto v = find();
  if (!v.ok()) return v.status();
  return HttpResponse::Json(200, JsonText(ViewJson(*v)));
}

}  // namespace silt::gateway
