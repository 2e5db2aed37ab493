// Function calls over HTTP, the edge of the call path: the route is checked
// and the call validated here, once, then handed to the node registry
// (nodes_calls.cc: to an instance leased from a node, instance_leases.h, or
// to a node's call port, call_client.h), and its answer becomes the HTTP
// response.
//   GET|POST|PUT|PATCH|DELETE|OPTIONS|HEAD /function/NAME[.NS][/path]
//   POST /async-function/NAME[.NS][/path]   (queued: api_async.cc)
#include <algorithm>
#include <iterator>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "api.h"
#include "invoker/call_wire.h"
#include "silt/version.h"

namespace silt::gateway {
namespace {

HttpResponse MethodNotAllowed() { return HttpResponse::Empty(405); }

// What the OpenFaaS gateway answers for a call to an unknown function.
HttpResponse FunctionNotFound(absl::string_view fn, absl::string_view name) {
  return HttpResponse::Text(
      404, absl::StrCat("error finding function ", fn,
                        ": server returned non-200 status code (404) for "
                        "function, ",
                        name, ", body: "));
}
std::string NewCallId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  uint64_t a = rng(), b = rng();
  // RFC 4122 version 4 layout.
  a = (a & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;
  b = (b & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", a >> 32,
                         (a >> 16) & 0xffff, a & 0xffff, b >> 48,
                         b & 0xffffffffffffULL);
}

}  // namespace

absl::StatusOr<std::optional<HttpResponse>> Api::Invoke(
    const HttpRequest& req, bool async, absl::string_view name_and_ns,
    Reply& reply) {
  static constexpr absl::string_view kMethods[] = {
      "GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"};
  bool allowed = async ? req.method == "POST"
                       : std::find(std::begin(kMethods), std::end(kMethods),
                                   req.method) != std::end(kMethods);
  if (!allowed) return MethodNotAllowed();

  std::string name(name_and_ns);
  std::string ns(kDefaultNamespace);
  if (size_t dot = name.rfind('.'); dot != std::string::npos) {
    ns = name.substr(dot + 1);
    name = name.substr(0, dot);
  }
  std::string call_id(req.Header("X-Call-Id"));
  bool echo_call_id = call_id.empty();
  if (echo_call_id) call_id = NewCallId();
  std::string start_time = std::to_string(absl::GetCurrentTimeNanos());
  std::string fn = absl::StrCat(name, ".", ns);
  auto decorate = [echo_call_id, call_id, start_time](HttpResponse& res) {
    if (echo_call_id) res.SetHeader("X-Call-Id", call_id);
    res.SetHeader("X-Start-Time", start_time);
    res.SetHeader("X-Served-By", absl::StrCat("silt/", silt::kVersion));
  };

  // A synchronous call learns that the function does not exist from the
  // node registry's table (no store read per call); an async one is checked
  // here, before it is queued.
  bool exists = !name.empty() && CheckNamespace(ns).ok() &&
                (!async || store_->GetFunction(ns, name).ok());
  if (!exists) {
    HttpResponse res = FunctionNotFound(fn, name);
    decorate(res);
    return res;
  }
  if (async) {
    auto res = EnqueueAsync(req, ns, name, call_id);
    if (!res.ok()) res = ErrorResponse(res.status());
    decorate(*res);
    return *std::move(res);
  }

  InvokeCall call;
  call.ns = ns;
  call.name = name;
  call.call_id = call_id;
  call.method = req.method;
  absl::string_view rest =
      absl::string_view(req.path).substr(10);  // "/function/"
  size_t slash = rest.find('/');
  call.path =
      slash == absl::string_view::npos ? "/" : std::string(rest.substr(slash));
  call.query = req.query;
  for (const auto& [k, v] : req.headers) {
    if (!IsHopByHop(k)) call.headers.emplace_back(k, v);
  }
  if (echo_call_id) call.headers.emplace_back("X-Call-Id", call_id);
  call.headers.emplace_back("X-Start-Time", start_time);
  if (!req.HasHeader("X-Forwarded-Host") && req.HasHeader("Host"))
    call.headers.emplace_back("X-Forwarded-Host",
                              std::string(req.Header("Host")));
  if (!req.HasHeader("X-Forwarded-For"))
    call.headers.emplace_back("X-Forwarded-For", req.remote);
  call.body = req.body;
  call.body_rest = req.body_rest;
  call.timeout = options_.upstream_timeout;
  call.take_parts = true;
  if (req.HasHeader("X-Silt-Cold-Start")) {
    absl::string_view h = req.Header("X-Silt-Cold-Start");
    auto cold = invoker::call_wire::ParseColdStart({h.data(), h.size()});
    if (!cold) {
      HttpResponse res = HttpResponse::Text(
          400, "X-Silt-Cold-Start must be boot, restore, fork or criu");
      decorate(res);
      return res;
    }
    call.cold_start = *cold;
  }
  std::string request_ct(req.Header("Content-Type"));

  metrics_->InvocationStarted(fn);
  auto start = std::chrono::steady_clock::now();
  nodes_->Invoke(std::move(call), [this, reply = std::move(reply), decorate, fn,
                                   name, request_ct, start](
                                      absl::StatusOr<InvokeResult> r) mutable {
    // On a gRPC thread, outside the HTTP server's catch: the last line of
    // defence for this request is here.
    try {
      HttpResponse res;
      if (r.ok()) {
        res.status = r->status;
        std::string ct;
        for (auto& [k, v] : r->headers) {
          if (IsHopByHop(k) || absl::EqualsIgnoreCase(k, "Content-Length"))
            continue;
          if (absl::EqualsIgnoreCase(k, "Content-Type")) ct = v;
          res.headers.emplace_back(std::move(k), std::move(v));
        }
        if (ct.empty()) {
          res.SetHeader("Content-Type",
                        request_ct.empty() ? "text/plain" : request_ct);
        }
        res.body = std::move(r->body);
        res.parts = std::move(r->parts);
        namespace cw = invoker::call_wire;
        const char* tier = cw::StartTierName(r->start_tier);
        metrics_->Start(fn, tier, r->start_ms / 1000);
        if (r->failure != cw::Failure::kNone)
          metrics_->InstanceFailure(fn, cw::FailureName(r->failure));
        res.SetHeader("X-Silt-Start", tier);
        res.SetHeader("X-Silt-Start-Ms", absl::StrFormat("%.3f", r->start_ms));
        if (!r->node.empty()) res.SetHeader("X-Silt-Node", r->node);
      } else if (absl::IsNotFound(r.status())) {
        res = FunctionNotFound(fn, name);
      } else if (absl::IsUnavailable(r.status())) {
        res = HttpResponse::Text(
            503, absl::StrCat("No endpoints available for: ", name, "."));
        res.SetHeader("X-OpenFaaS-Internal", "proxy");
      } else if (absl::IsDeadlineExceeded(r.status())) {
        res = HttpResponse::Text(504, r.status().message());
      } else if (absl::IsResourceExhausted(r.status())) {
        res = HttpResponse::Text(429, r.status().message());
      } else if (absl::IsOutOfRange(r.status())) {  // a body over the limit
        res = HttpResponse::Text(413, r.status().message());
      } else {
        res = HttpResponse::Text(
            502, absl::StrCat("function ", name, ": ", r.status().message()));
        res.SetHeader("X-OpenFaaS-Internal", "proxy");
      }
      decorate(res);
      metrics_->InvocationDone(fn, res.status,
                               std::chrono::duration<double>(
                                   std::chrono::steady_clock::now() - start)
                                   .count());
      reply(std::move(res));
    } catch (const std::exception& e) {
      fprintf(stderr,
              "silt-gateway: internal error answering a call to %s: %s\n",
              fn.c_str(), e.what());
      reply(HttpResponse::Text(
          500, absl::StrCat("internal error answering a call to ", name,
                            " (the gateway logged it): ", e.what())));
    }
  });
  return std::optional<HttpResponse>();
}

}  // namespace silt::gateway
