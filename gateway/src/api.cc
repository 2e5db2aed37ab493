#include "api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "autoscaler.h"
#include "containerd/archive.h"
#include "gpu_directory.h"
#include "proclets/bundle.h"
#include "silt/abi.h"
#include "silt/version.h"

namespace silt::gateway {

// The GPU proclets' gauges (api_gpu.cc).
std::string GpuMetricsText(GpuDirectory& d);
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

HttpResponse MethodNotAllowed() { return HttpResponse::Empty(405); }

HttpResponse PageNotFound() {
  return HttpResponse::Text(404, "404 page not found");
}

bool HasTraversal(absl::string_view name) {
  return absl::StrContains(name, "/") || absl::StrContains(name, "..");
}

// The {name} segment of OpenFaaS routes: [-a-zA-Z_0-9.]+
bool IsRouteName(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.'))
      return false;
  }
  return true;
}

// A Kubernetes resource quantity: 128Mi, 1G, 0.5, 100m, 1e3.
bool IsQuantity(absl::string_view q) {
  static const std::regex re(
      R"(^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$)");
  return std::regex_match(q.begin(), q.end(), re);
}

absl::Status ValidateResources(absl::string_view field,
                               const std::optional<FunctionResources>& r) {
  if (!r) return absl::OkStatus();
  if (!r->memory.empty() && !IsQuantity(r->memory)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", field, ".memory \"", r->memory,
                     "\": expected a Kubernetes quantity such as 128Mi or 1G"));
  }
  if (!r->cpu.empty() && !IsQuantity(r->cpu)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", field, ".cpu \"", r->cpu,
                     "\": expected a CPU quantity such as 500m or 1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<uint64_t>> ScaleLabel(const FunctionDeployment& d,
                                                   absl::string_view key) {
  if (!d.labels) return std::optional<uint64_t>();
  auto it = d.labels->find(std::string(key));
  if (it == d.labels->end()) return std::optional<uint64_t>();
  uint64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "label ", key, "=\"", it->second, "\" must be a non-negative integer"));
  }
  return std::optional<uint64_t>(v);
}

}  // namespace

int HttpStatusFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

HttpResponse ErrorResponse(const absl::Status& s) {
  return HttpResponse::Text(HttpStatusFor(s), s.message());
}

absl::Status ValidateName(absl::string_view kind, absl::string_view name) {
  bool ok = !name.empty() && name.size() <= 63 &&
            absl::ascii_isalnum(name.front()) &&
            absl::ascii_isalnum(name.back());
  for (char c : name) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-'))
      ok = false;
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid ", kind, " name \"", name,
      "\": use lowercase letters, digits and '-', starting and ending with a "
      "letter or digit, at most 63 characters"));
}

Api::Api(store::Store* store, Metrics* metrics, BundleStore* bundles,
         NodeRegistry* nodes, ApiOptions options, AsyncQueue* async,
         ImageArchives* images)
    : store_(store),
      metrics_(metrics),
      bundles_(bundles),
      nodes_(nodes),
      options_(std::move(options)),
      async_(async),
      images_(images) {}

size_t Api::BodyLimit(absl::string_view path) const {
  if (path == "/system/bundles") return options_.max_bundle_bytes;
  if (path == "/system/images") return options_.max_image_archive_bytes;
  if (absl::StartsWith(path, "/function/"))
    return options_.max_function_body_bytes;
  if (absl::StartsWith(path, "/async-function/"))
    return options_.max_async_body_bytes;
  return options_.max_system_body_bytes;
}

void Api::Handle(const HttpRequest& req, Reply reply, Listener listener) {
  auto start = std::chrono::steady_clock::now();
  auto route = std::make_shared<std::string>("other");
  Reply timed = [this, start, method = req.method, route,
                 reply = std::move(reply)](HttpResponse res) mutable {
    double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    metrics_->HttpRequest(method, *route, res.status, secs);
    reply(std::move(res));
  };
  auto res = Route(req, listener, *route, timed);
  if (!res.ok()) return timed(ErrorResponse(res.status()));
  if (*res) return timed(**std::move(res));
}

absl::StatusOr<std::optional<HttpResponse>> Api::Route(const HttpRequest& req,
                                                       Listener listener,
                                                       std::string& route,
                                                       Reply& reply) {
  absl::string_view path = req.path;
  const std::string& m = req.method;
  const bool provider = listener == Listener::kProvider;

  if (path == "/healthz") {
    route = "/healthz";
    if (m != "GET" && m != "HEAD") return MethodNotAllowed();
    return HttpResponse::Text(200, "OK");
  }
  if (provider && path == "/metrics") {
    route = "/metrics";
    return HandleMetricsPort(req);
  }
  // The OpenFaaS gateway queues async calls itself (its queue worker calls
  // /function/ here).
  if (provider && absl::StartsWith(path, "/async-function/"))
    return PageNotFound();
  if (absl::StartsWith(path, "/function/") ||
      absl::StartsWith(path, "/async-function/")) {
    bool async = absl::StartsWith(path, "/async-function/");
    route = async ? "/async-function/{name}" : "/function/{name}";
    absl::string_view rest = path.substr(async ? 16 : 10);
    absl::string_view name = rest.substr(0, rest.find('/'));
    if (!IsRouteName(name) && !absl::StartsWith(name, "."))
      return PageNotFound();
    return Invoke(req, async, name, reply);
  }
  if (!absl::StartsWith(path, "/system/")) {
    if (path == "/" && !provider) {
      route = "/";
      HttpResponse r = HttpResponse::Empty(307);
      r.SetHeader("Location", "/ui/");
      return r;
    }
    return PageNotFound();
  }

  // /system/*: find the route first (unknown routes are 404 even without
  // credentials), then authenticate.
  absl::string_view sub = path.substr(8);
  absl::string_view head = sub.substr(0, sub.find('/'));
  absl::string_view arg =
      head.size() < sub.size() ? sub.substr(head.size() + 1) : "";
  bool has_arg = head.size() < sub.size();
  auto need_auth = [&]() -> std::optional<HttpResponse> {
    if (!options_.auth_enabled) return std::nullopt;
    if (CheckBasicAuth(options_.credentials, req.Header("Authorization")))
      return std::nullopt;
    HttpResponse r = HttpResponse::Text(401, "invalid credentials");
    r.SetHeader("WWW-Authenticate", "Basic realm=\"Restricted\"");
    return r;
  };
#define SILT_AUTH() \
  if (auto denied = need_auth(); denied) return *std::move(denied);

  // The provider listener speaks the faas-provider contract only: Silt's
  // own routes are on the gateway's listener.
  static constexpr absl::string_view kProviderRoutes[] = {
      "functions", "function", "scale-function", "info", "namespaces",
      "namespace", "secrets",  "logs",           "alert"};
  if (provider &&
      std::find(std::begin(kProviderRoutes), std::end(kProviderRoutes), head) ==
          std::end(kProviderRoutes))
    return HttpResponse::Text(
        404, absl::StrCat("/system/", head,
                          " is Silt's own route: it is served on Silt's "
                          "gateway listener (--listen), not on the provider "
                          "listener (--provider-listen)"));

  if (head == "functions" && !has_arg) {
    route = "/system/functions";
    SILT_AUTH();
    if (m == "GET") return ListFunctions(req);
    if (m == "POST") return DeployFunction(req, false);
    if (m == "PUT") return DeployFunction(req, true);
    if (m == "DELETE") return DeleteFunction(req);
    return MethodNotAllowed();
  }
  if (head == "function" && has_arg && IsRouteName(arg)) {
    route = "/system/function/{name}";
    SILT_AUTH();
    if (m == "GET") return GetFunction(req, arg);
    return MethodNotAllowed();
  }
  if (head == "scale-function" && has_arg && IsRouteName(arg)) {
    route = "/system/scale-function/{name}";
    SILT_AUTH();
    if (m == "POST") return ScaleFunction(req, arg);
    return MethodNotAllowed();
  }
  if (head == "info" && !has_arg) {
    route = "/system/info";
    SILT_AUTH();
    if (m == "GET") return Info(listener);
    return MethodNotAllowed();
  }
  if (head == "namespaces" && !has_arg) {
    route = "/system/namespaces";
    SILT_AUTH();
    if (m == "GET") return ListNamespaces();
    return MethodNotAllowed();
  }
  if (head == "namespace" && has_arg && (arg.empty() || IsRouteName(arg))) {
    route = "/system/namespace/{namespace}";
    SILT_AUTH();
    return Namespace(req, arg);
  }
  if (head == "secrets" && !has_arg) {
    route = "/system/secrets";
    SILT_AUTH();
    if (m == "GET") return ListSecrets(req);
    if (m == "POST") return WriteSecret(req, false);
    if (m == "PUT") return WriteSecret(req, true);
    if (m == "DELETE") return DeleteSecret(req);
    return MethodNotAllowed();
  }
  if (head == "logs" && !has_arg) {
    route = "/system/logs";
    SILT_AUTH();
    if (m == "GET") return Logs(req);
    return MethodNotAllowed();
  }
  if (head == "bundles" && !has_arg) {
    route = "/system/bundles";
    SILT_AUTH();
    if (m == "POST") return PushBundle(req);
    if (m == "GET") return ListBundles();
    return MethodNotAllowed();
  }
  if (head == "images" && !has_arg) {
    route = "/system/images";
    SILT_AUTH();
    if (m == "POST") return PushImage(req);
    if (m == "GET") return ListImages();
    if (m == "DELETE") return RemoveImage(req);
    return MethodNotAllowed();
  }
  if (head == "nodes" && !has_arg) {
    route = "/system/nodes";
    SILT_AUTH();
    if (m == "GET") return ListNodes();
    return MethodNotAllowed();
  }
  if (head == "nodes" && has_arg && absl::EndsWith(arg, "/drain")) {
    route = "/system/nodes/{name}/drain";
    SILT_AUTH();
    if (m == "POST") return DrainNode(arg.substr(0, arg.size() - 6));
    return MethodNotAllowed();
  }
  if (head == "events" && !has_arg) {
    route = "/system/events";
    SILT_AUTH();
    if (m == "GET") return ListEvents(req);
    return MethodNotAllowed();
  }
  if (head == "proclets" && !has_arg) {
    route = "/system/proclets";
    SILT_AUTH();
    if (m == "GET") return ListProclets(req);
    return MethodNotAllowed();
  }
  if (head == "proclets" && has_arg && absl::EndsWith(arg, "/migrate")) {
    route = "/system/proclets/{id}/migrate";
    SILT_AUTH();
    if (m == "POST") return MigrateProclet(req, arg.substr(0, arg.size() - 8));
    return MethodNotAllowed();
  }
  if (head == "proclets" && has_arg && absl::EndsWith(arg, "/resize")) {
    route = "/system/proclets/{id}/resize";
    SILT_AUTH();
    if (m == "POST")
      return ResizeGpuProclet(req, arg.substr(0, arg.size() - 7));
    return MethodNotAllowed();
  }
  if (head == "gpu" && !has_arg) {
    route = "/system/gpu";
    SILT_AUTH();
    if (m == "GET") return ListGpus();
    return MethodNotAllowed();
  }
  if (head == "gpu" && has_arg && absl::EndsWith(arg, "/reclaim")) {
    route = "/system/gpu/{node}/reclaim";
    SILT_AUTH();
    if (m == "POST") return ReclaimGpu(arg.substr(0, arg.size() - 8));
    return MethodNotAllowed();
  }
  if (head == "gpu" && has_arg && absl::EndsWith(arg, "/release")) {
    route = "/system/gpu/{node}/release";
    SILT_AUTH();
    if (m == "POST") return ReleaseGpu(arg.substr(0, arg.size() - 8));
    return MethodNotAllowed();
  }
  if (head == "state") {
    route = has_arg ? "/system/state/{name}" : "/system/state";
    SILT_AUTH();
    if (m == "GET") return GetState(req, arg);
    if (m == "DELETE" && has_arg) return DeleteState(req, arg);
    return MethodNotAllowed();
  }
  if (head == "snapshots" && (!has_arg || IsRouteName(arg))) {
    route = has_arg ? "/system/snapshots/{name}" : "/system/snapshots";
    SILT_AUTH();
    if (m == "GET") return ListSnapshots(req, has_arg ? arg : "");
    if (m == "DELETE" && has_arg) return DeleteSnapshots(req, arg);
    return MethodNotAllowed();
  }
  if (head == "async") {
    route = has_arg ? "/system/async/{id}" : "/system/async";
    SILT_AUTH();
    if (!has_arg && m == "GET") return ListAsync(req);
    if (has_arg) return AsyncCallAction(req, arg);
    return MethodNotAllowed();
  }
  if (head == "alert" && !has_arg) {
    route = "/system/alert";
    SILT_AUTH();
    if (m == "POST") return HttpResponse::Empty(200);
    return MethodNotAllowed();
  }
#undef SILT_AUTH
  return PageNotFound();
}

// ---- helpers ----

absl::Status Api::CheckNamespace(absl::string_view ns) const {
  if (ns == kDefaultNamespace) return absl::OkStatus();
  auto rec = store_->GetNamespace(ns);
  if (!rec.ok()) {
    if (absl::IsNotFound(rec.status()))
      return absl::InvalidArgumentError("namespace not valid");
    return rec.status();
  }
  auto it = rec->labels.find("openfaas");
  if (it == rec->labels.end() || (it->second != "1" && it->second != "true"))
    return absl::InvalidArgumentError("namespace not valid");
  return absl::OkStatus();
}

absl::StatusOr<std::string> Api::ResolveNamespace(
    absl::string_view from_body, const HttpRequest& req) const {
  std::string ns(from_body);
  if (ns.empty()) ns = req.QueryParam("namespace");
  if (ns.empty()) ns = std::string(kDefaultNamespace);
  if (auto s = CheckNamespace(ns); !s.ok()) return s;
  return ns;
}

absl::StatusOr<FunctionDeployment> Api::LoadDeployment(
    const store::FunctionRecord& rec) const {
  auto d = ParseFunctionDeployment(rec.spec);
  if (!d.ok()) {
    return absl::DataLossError(
        absl::StrCat("stored deployment of ", rec.name, ".", rec.ns,
                     " is unreadable: ", d.status().message()));
  }
  return d;
}

ordered_json Api::StatusJson(const store::FunctionRecord& rec,
                             const FunctionDeployment& d) const {
  FunctionStatusExtra extra;
  extra.invocation_count =
      metrics_->InvocationCount(absl::StrCat(rec.name, ".", rec.ns));
  extra.replicas = nodes_->DesiredReplicas(rec.ns, rec.name, rec.replicas);
  extra.available_replicas = nodes_->AvailableReplicas(rec.ns, rec.name);
  extra.created_at_unix_nanos = rec.created_at_unix_nanos;
  return ToStatusJson(d, extra);
}

// ---- functions ----

absl::StatusOr<HttpResponse> Api::ListFunctions(const HttpRequest& req) {
  auto ns = ResolveNamespace("", req);
  if (!ns.ok()) return ns.status();
  auto recs = store_->ListFunctions(*ns);
  if (!recs.ok()) return recs.status();
  ordered_json out = ordered_json::array();
  for (const auto& rec : *recs) {
    auto d = LoadDeployment(rec);
    if (!d.ok()) return d.status();
    out.push_back(StatusJson(rec, *d));
  }
  return HttpResponse::Json(200, JsonText(out));
}

absl::StatusOr<HttpResponse> Api::DeployFunction(const HttpRequest& req,
                                                 bool update) {
  if (req.body.empty()) return absl::InvalidArgumentError("expected a body");
  auto d = ParseFunctionDeployment(req.body);
  if (!d.ok()) return d.status();
  if (d->service.empty())
    return absl::InvalidArgumentError(
        "service is required: the function's name");
  if (HasTraversal(d->service))
    return absl::InvalidArgumentError("directory traversal found in name");
  if (auto s = ValidateName("function", d->service); !s.ok()) return s;
  if (absl::StripAsciiWhitespace(d->image).empty())
    return absl::InvalidArgumentError("image is required");

  auto ns = ResolveNamespace(d->ns, req);
  if (!ns.ok()) return ns.status();
  d->ns = *ns;
  if (auto s = ValidateResources("limits", d->limits); !s.ok()) return s;
  if (auto s = ValidateResources("requests", d->requests); !s.ok()) return s;
  auto min_scale = ScaleLabel(*d, "com.openfaas.scale.min");
  if (!min_scale.ok()) return min_scale.status();
  auto max_scale = ScaleLabel(*d, "com.openfaas.scale.max");
  if (!max_scale.ok()) return max_scale.status();
  if (*min_scale && *max_scale && **min_scale > **max_scale) {
    return absl::InvalidArgumentError(
        "label com.openfaas.scale.min must not exceed com.openfaas.scale.max");
  }
  if (d->labels)
    if (auto p = ParseScalePolicy(*d->labels); !p.ok()) return p.status();
  // Calls an instance takes at once: a thread-safe C++ function's
  // SILT_CONCURRENCY, lowered by this label (never raised).
  auto concurrency = ScaleLabel(*d, "com.silt.concurrency");
  if (!concurrency.ok()) return concurrency.status();
  if (*concurrency &&
      (**concurrency < 1 || **concurrency > SILT_MAX_CONCURRENCY))
    return absl::InvalidArgumentError(absl::StrCat(
        "label com.silt.concurrency=", **concurrency, " must be from 1 to ",
        SILT_MAX_CONCURRENCY, " (calls an instance takes at once)"));
  if (d->labels)
    if (auto gpu = ParseGpuLabels(*d->labels); !gpu.ok()) return gpu.status();
  for (const auto& secret : d->secrets) {
    auto s = store_->FindSecret(*ns, secret);
    if (absl::IsNotFound(s))
      return absl::InvalidArgumentError(
          absl::StrCat("unable to find secret: ", secret));
    if (!s.ok()) return s;
  }

  if (auto digest = proclets::BundleDigestOf(d->image); !digest.ok()) {
    // An OCI image: one imported into the nodes (silt image import).
    auto name = containerd::NormalizeImageName(d->image);
    if (!name.ok() || images_ == nullptr || !images_->Has(*name))
      return absl::InvalidArgumentError(absl::StrCat(
          "image \"", d->image,
          "\" is neither a Silt bundle nor an imported image: build and push "
          "a bundle with `silt up` (or `silt build` and `silt push`) and "
          "deploy NAME@sha256:<digest>, or import the image's archive with "
          "`silt image import FILE` (no registry is reachable)"));
  } else if (auto b = bundles_->Get(*digest); !b.ok()) {
    if (absl::IsNotFound(b.status())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "image \"", d->image, "\": bundle ", *digest,
          " is not in this gateway's bundle store: push it first (silt push)"));
    }
    return b.status();
  }

  std::lock_guard<std::mutex> lock(write_mu_);
  auto existing = store_->GetFunction(*ns, d->service);
  if (!existing.ok() && !absl::IsNotFound(existing.status()))
    return existing.status();
  store::FunctionRecord rec;
  if (update) {
    if (!existing.ok()) {
      return absl::NotFoundError(
          absl::StrCat("function: ", d->service, ".", *ns, " not found"));
    }
    rec = *std::move(existing);
    rec.generation++;
  } else {
    if (existing.ok()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "function ", d->service, " already exists in namespace ", *ns,
          ": update it with PUT /system/functions (silt deploy does)"));
    }
    rec.ns = *ns;
    rec.name = d->service;
    rec.created_at_unix_nanos = NowNanos();
    rec.generation = 1;
    rec.replicas = min_scale->value_or(1);
  }
  if (*min_scale && rec.replicas < **min_scale) rec.replicas = **min_scale;
  if (*max_scale && rec.replicas > **max_scale) rec.replicas = **max_scale;
  rec.spec = JsonText(ToJson(*d));
  store::WriteBatch batch;
  batch.PutFunction(rec);
  if (auto s = store_->Write(batch); !s.ok()) return s;
  nodes_->FunctionsChanged();
  return HttpResponse::Empty(200);
}

absl::StatusOr<HttpResponse> Api::DeleteFunction(const HttpRequest& req) {
  if (req.body.empty()) return absl::InvalidArgumentError("expected a body");
  auto f = ParseDeleteFunctionRequest(req.body);
  if (!f.ok()) return f.status();
  const std::string& name = f->name;
  const std::string& body_ns = f->ns;
  if (name.empty())
    return absl::InvalidArgumentError("functionName is required");
  auto ns = ResolveNamespace(body_ns, req);
  if (!ns.ok()) return ns.status();
  std::lock_guard<std::mutex> lock(write_mu_);
  auto rec = store_->GetFunction(*ns, name);
  if (absl::IsNotFound(rec.status()))
    return absl::NotFoundError(
        absl::StrCat("function ", name, ".", *ns, " not found"));
  if (!rec.ok()) return rec.status();
  store::WriteBatch batch;
  batch.DeleteFunction(*ns, name);
  if (auto s = store_->Write(batch); !s.ok()) return s;
  nodes_->FunctionsChanged();
  nodes_->gpu_directory()->DropFunction(*ns, name);
  return HttpResponse::Empty(200);
}

absl::StatusOr<HttpResponse> Api::GetFunction(const HttpRequest& req,
                                              absl::string_view name) {
  auto ns = ResolveNamespace("", req);
  if (!ns.ok()) return ns.status();
  auto rec = store_->GetFunction(*ns, name);
  if (absl::IsNotFound(rec.status())) return HttpResponse::Empty(404);
  if (!rec.ok()) return rec.status();
  auto d = LoadDeployment(*rec);
  if (!d.ok()) return d.status();
  return HttpResponse::Json(200, JsonText(StatusJson(*rec, *d)));
}

absl::StatusOr<HttpResponse> Api::ScaleFunction(const HttpRequest& req,
                                                absl::string_view path_name) {
  if (req.body.empty())
    return absl::InvalidArgumentError("Error reading request body");
  json j = json::parse(req.body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError("Error unmarshalling request body");
  std::string name(path_name);
  std::string body_ns;
  uint64_t replicas = 0;
  if (auto it = j.find("serviceName");
      it != j.end() && it->is_string() && !it->get<std::string>().empty()) {
    name = it->get<std::string>();
  }
  if (auto it = j.find("namespace"); it != j.end() && it->is_string())
    body_ns = it->get<std::string>();
  if (auto it = j.find("replicas"); it != j.end() && !it->is_null()) {
    if (!it->is_number_unsigned()) {
      return absl::InvalidArgumentError(
          "Error unmarshalling request body: replicas must be a non-negative "
          "integer");
    }
    replicas = it->get<uint64_t>();
  }
  auto ns = ResolveNamespace(body_ns, req);
  if (!ns.ok()) return ns.status();
  std::lock_guard<std::mutex> lock(write_mu_);
  auto rec = store_->GetFunction(*ns, name);
  if (absl::IsNotFound(rec.status()))
    return absl::NotFoundError(
        absl::StrCat("function ", name, ".", *ns, " not found"));
  if (!rec.ok()) return rec.status();
  auto d = LoadDeployment(*rec);
  if (!d.ok()) return d.status();
  auto max_scale = ScaleLabel(*d, "com.openfaas.scale.max");
  if (max_scale.ok() && *max_scale && replicas > **max_scale)
    replicas = **max_scale;
  rec->replicas = replicas;
  store::WriteBatch batch;
  batch.PutFunction(*rec);
  if (auto s = store_->Write(batch); !s.ok()) return s;
  nodes_->FunctionsChanged();
  return HttpResponse::Empty(200);
}

// ---- info, namespaces ----

absl::StatusOr<HttpResponse> Api::Info(Listener listener) {
  ordered_json version = {{"sha", silt::kGitSha}, {"release", silt::kVersion}};
  // A provider answers flat (faas-provider's ProviderInfo); the OpenFaaS
  // gateway nests it under "provider" in its own answer, as Silt's gateway
  // listener does.
  ordered_json provider = {
      {"provider", "silt"}, {"orchestration", "silt"}, {"version", version}};
  if (listener == Listener::kProvider)
    return HttpResponse::Json(200, JsonText(provider));
  ordered_json out = {
      {"provider", provider}, {"version", version}, {"arch", silt::kArch}};
  return HttpResponse::Json(200, JsonText(out));
}

absl::StatusOr<HttpResponse> Api::ListNamespaces() {
  auto recs = store_->ListNamespaces();
  if (!recs.ok()) return recs.status();
  json out = json::array({std::string(kDefaultNamespace)});
  for (const auto& r : *recs) {
    auto it = r.labels.find("openfaas");
    if (it != r.labels.end() && (it->second == "1" || it->second == "true"))
      out.push_back(r.name);
  }
  return HttpResponse::Json(200, JsonText(out));
}

absl::StatusOr<HttpResponse> Api::Namespace(const HttpRequest& req,
                                            absl::string_view path_ns) {
  const std::string& m = req.method;
  if (m == "GET") {
    if (path_ns.empty())
      return absl::InvalidArgumentError(
          "namespace name is required in the path");
    if (path_ns == kDefaultNamespace) {
      return HttpResponse::Json(
          200, JsonText(ordered_json({{"name", kDefaultNamespace},
                                      {"labels", {{"openfaas", "1"}}}})));
    }
    auto rec = store_->GetNamespace(path_ns);
    if (!rec.ok()) return rec.status();
    ordered_json out = {{"name", rec->name}, {"labels", rec->labels}};
    if (!rec->annotations.empty()) out["annotations"] = rec->annotations;
    return HttpResponse::Json(200, JsonText(out));
  }
  if (m == "POST" || m == "PUT") {
    if (req.body.empty()) return absl::InvalidArgumentError("expected a body");
    auto n = ParseFunctionNamespace(req.body);
    if (!n.ok()) return n.status();
    if (n->name.empty()) n->name = std::string(path_ns);
    if (!path_ns.empty() && n->name != path_ns) {
      return absl::InvalidArgumentError(
          absl::StrCat("namespace name in the body (", n->name,
                       ") must match the path (", path_ns, ")"));
    }
    if (HasTraversal(n->name))
      return absl::InvalidArgumentError("directory traversal found in name");
    if (auto s = ValidateName("namespace", n->name); !s.ok()) return s;
    auto it = n->labels.find("openfaas");
    if (it == n->labels.end() || (it->second != "1" && it->second != "true"))
      return absl::InvalidArgumentError(
          "request does not have openfaas=1 label");
    std::lock_guard<std::mutex> lock(write_mu_);
    bool exists =
        n->name == kDefaultNamespace || store_->GetNamespace(n->name).ok();
    if (m == "POST" && exists) {
      return absl::AlreadyExistsError(
          absl::StrCat("namespace ", n->name, " already exists"));
    }
    if (m == "PUT" && !exists)
      return absl::NotFoundError(
          absl::StrCat("namespace ", n->name, " not found"));
    if (n->name == kDefaultNamespace) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the default namespace ", kDefaultNamespace, " cannot be changed"));
    }
    store::WriteBatch batch;
    batch.PutNamespace({n->name, n->labels, n->annotations});
    if (auto s = store_->Write(batch); !s.ok()) return s;
    nodes_->FunctionsChanged();
    nodes_->FunctionsChanged();
    return HttpResponse::Empty(m == "POST" ? 201 : 202);
  }
  if (m == "DELETE") {
    std::string name(path_ns);
    if (name.empty() && !req.body.empty()) {
      auto n = ParseFunctionNamespace(req.body);
      if (!n.ok()) return n.status();
      name = n->name;
    }
    if (name.empty())
      return absl::InvalidArgumentError("namespace name is required");
    if (name == kDefaultNamespace) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the default namespace ", kDefaultNamespace, " cannot be removed"));
    }
    std::lock_guard<std::mutex> lock(write_mu_);
    auto rec = store_->GetNamespace(name);
    if (!rec.ok()) return rec.status();
    auto fns = store_->ListFunctions(name);
    if (!fns.ok()) return fns.status();
    auto secrets = store_->ListSecrets(name);
    if (!secrets.ok()) return secrets.status();
    if (!fns->empty() || !secrets->empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "namespace ", name, " still holds ", fns->size(), " function(s) and ",
          secrets->size(), " secret(s): remove them first"));
    }
    store::WriteBatch batch;
    batch.DeleteNamespace(name);
    if (auto s = store_->Write(batch); !s.ok()) return s;
    nodes_->directory()->DeleteNamespace(std::string(name));
    nodes_->gpu_directory()->DropFunction(std::string(name), "");
    nodes_->FunctionsChanged();
    nodes_->FunctionsChanged();
    return HttpResponse::Empty(202);
  }
  return MethodNotAllowed();
}

// ---- secrets ----

absl::StatusOr<HttpResponse> Api::ListSecrets(const HttpRequest& req) {
  auto ns = ResolveNamespace("", req);
  if (!ns.ok()) return ns.status();
  auto recs = store_->ListSecrets(*ns);
  if (!recs.ok()) return recs.status();
  ordered_json out = ordered_json::array();
  for (const auto& r : *recs)
    out.push_back({{"name", r.name}, {"namespace", r.ns}});
  return HttpResponse::Json(200, JsonText(out));
}

namespace {

// The Secret body of POST/PUT/DELETE /system/secrets, with faasd's name checks.
absl::StatusOr<Secret> ParseSecretRequest(const HttpRequest& req) {
  if (req.body.empty()) return absl::InvalidArgumentError("expected a body");
  auto secret = ParseSecret(req.body);
  if (!secret.ok()) return secret.status();
  if (secret->name.empty())
    return absl::InvalidArgumentError("non-empty name is required");
  if (HasTraversal(secret->name))
    return absl::InvalidArgumentError("directory traversal found in name");
  return secret;
}

}  // namespace

absl::StatusOr<HttpResponse> Api::WriteSecret(const HttpRequest& req,
                                              bool update) {
  auto secret = ParseSecretRequest(req);
  if (!secret.ok()) return secret.status();
  if (!IsRouteName(secret->name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid secret name \"", secret->name,
                     "\": use letters, digits, '-', '_' and '.'"));
  }
  auto ns = ResolveNamespace(secret->ns, req);
  if (!ns.ok()) return ns.status();
  std::lock_guard<std::mutex> lock(write_mu_);
  absl::Status existing = store_->FindSecret(*ns, secret->name);
  if (!existing.ok() && !absl::IsNotFound(existing)) return existing;
  if (update && !existing.ok()) return existing;
  if (!update && existing.ok()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "secret ", secret->name, " already exists in namespace ", *ns,
        ": update it with PUT /system/secrets (silt secret update)"));
  }
  store::WriteBatch batch;
  batch.PutSecret({*ns, secret->name, secret->value});
  if (update) {
    // Functions using the secret get a new generation in the same batch: their
    // instances are replaced by ones that see the new value.
    auto fns = store_->ListFunctions(*ns);
    if (!fns.ok()) return fns.status();
    for (auto& rec : *fns) {
      auto d = LoadDeployment(rec);
      if (!d.ok()) continue;
      if (std::find(d->secrets.begin(), d->secrets.end(), secret->name) ==
          d->secrets.end())
        continue;
      rec.generation++;
      batch.PutFunction(rec);
    }
  }
  if (auto s = store_->Write(batch); !s.ok()) return s;
  nodes_->FunctionsChanged();
  return HttpResponse::Empty(update ? 200 : 201);
}

absl::StatusOr<HttpResponse> Api::DeleteSecret(const HttpRequest& req) {
  auto secret = ParseSecretRequest(req);
  if (!secret.ok()) return secret.status();
  auto ns = ResolveNamespace(secret->ns, req);
  if (!ns.ok()) return ns.status();
  std::lock_guard<std::mutex> lock(write_mu_);
  if (auto existing = store_->FindSecret(*ns, secret->name); !existing.ok())
    return existing;
  store::WriteBatch batch;
  batch.DeleteSecret(*ns, secret->name);
  if (auto s = store_->Write(batch); !s.ok()) return s;
  nodes_->FunctionsChanged();
  return HttpResponse::Empty(200);
}

// ---- logs and invocation ----

absl::StatusOr<HttpResponse> Api::Logs(const HttpRequest& req) {
  std::string name = req.QueryParam("name");
  std::string tail = req.QueryParam("tail");
  std::string since = req.QueryParam("since");
  std::string follow = req.QueryParam("follow");
  int64_t tail_n = 0;
  absl::StatusOr<int64_t> since_ns = int64_t{0};
  if (!since.empty()) since_ns = ParseRfc3339(since);
  if ((!tail.empty() && !absl::SimpleAtoi(tail, &tail_n)) || !since_ns.ok() ||
      (!follow.empty() && follow != "true" && follow != "false" &&
       follow != "1" && follow != "0")) {
    return HttpResponse::Text(422, "could not parse the log request");
  }
  if (name.empty())
    return absl::InvalidArgumentError("name is required: ?name=FUNCTION");
  auto ns = ResolveNamespace("", req);
  if (!ns.ok()) return ns.status();
  auto rec = store_->GetFunction(*ns, name);
  if (!rec.ok()) return rec.status();
  bool follow_on = follow == "true" || follow == "1";
  HttpResponse r;
  r.status = 200;
  r.headers = {{"Content-Type", "application/x-ndjson"},
               {"Connection", "Keep-Alive"}};
  NodeRegistry* nodes = nodes_;
  std::string fn_ns = *ns;
  int64_t from = *since_ns;
  auto until = std::chrono::steady_clock::now() + options_.upstream_timeout;
  r.stream = [nodes, name, fn_ns, from, tail_n, follow_on,
              until](const std::function<bool(absl::string_view)>& write) {
    bool open = true;
    nodes->Logs(
        fn_ns, name, from, tail_n, follow_on,
        [&](const LogRecord& l) {
          ordered_json j = {
              {"name", l.name},
              {"namespace", l.ns},
              {"instance", l.instance},
              {"timestamp", FormatRfc3339Nano(l.timestamp_unix_nanos)},
              {"text", l.text}};
          open = write(JsonText(j) + "\n");
          return open;
        },
        [&] { return !open || std::chrono::steady_clock::now() > until; });
  };
  return r;
}

absl::StatusOr<HttpResponse> Api::PushBundle(const HttpRequest& req) {
  if (req.body.empty())
    return absl::InvalidArgumentError("expected a bundle in the body");
  std::string expected = req.QueryParam("digest");
  if (!expected.empty() && !proclets::IsDigest(expected)) {
    return absl::InvalidArgumentError(
        absl::StrCat("digest \"", expected, "\" must be sha256:<64 hex>"));
  }
  auto put = bundles_->Put(req.body, expected);
  if (!put.ok()) return put.status();
  ordered_json out = {{"digest", put->first.digest},
                      {"size", put->first.size},
                      {"kind", put->first.manifest.kind},
                      {"created", put->second}};
  return HttpResponse::Json(put->second ? 201 : 200, JsonText(out));
}

absl::StatusOr<HttpResponse> Api::ListBundles() {
  auto list = bundles_->List();
  if (!list.ok()) return list.status();
  ordered_json out = ordered_json::array();
  for (const auto& b : *list) {
    out.push_back({{"digest", b.digest},
                   {"size", b.size},
                   {"kind", b.manifest.kind},
                   {"name", b.manifest.name}});
  }
  return HttpResponse::Json(200, JsonText(out));
}

absl::StatusOr<HttpResponse> Api::ListSnapshots(const HttpRequest& req,
                                                absl::string_view name) {
  std::string ns;
  if (!name.empty() || !req.QueryParam("namespace").empty()) {
    auto resolved = ResolveNamespace("", req);
    if (!resolved.ok()) return resolved.status();
    ns = *resolved;
  }
  if (!name.empty()) {
    auto rec = store_->GetFunction(ns, name);
    if (absl::IsNotFound(rec.status()))
      return HttpResponse::Text(404,
                                absl::StrCat("function ", name, " not found"));
    if (!rec.ok()) return rec.status();
  }
  ordered_json out = ordered_json::array();
  for (const auto& v : nodes_->Snapshots(ns, std::string(name))) {
    out.push_back({{"id", v.id},
                   {"name", v.name},
                   {"namespace", v.ns},
                   {"generation", v.generation},
                   {"current", v.current},
                   {"bytes", v.bytes},
                   {"created", v.created_unix},
                   {"checkpointMs", v.checkpoint_ms},
                   {"nodes", v.nodes},
                   {"template", v.template_resident},
                   {"staged", v.restorer_staged},
                   {"residentBytes", v.resident_bytes}});
  }
  return HttpResponse::Json(200, JsonText(out));
}

absl::StatusOr<HttpResponse> Api::DeleteSnapshots(const HttpRequest& req,
                                                  absl::string_view name) {
  auto ns = ResolveNamespace("", req);
  if (!ns.ok()) return ns.status();
  auto rec = store_->GetFunction(*ns, name);
  if (absl::IsNotFound(rec.status()))
    return HttpResponse::Text(404,
                              absl::StrCat("function ", name, " not found"));
  if (!rec.ok()) return rec.status();
  size_t n = nodes_->DeleteSnapshots(*ns, std::string(name));
  ordered_json out = {{"deleted", n}};
  return HttpResponse::Json(200, JsonText(out));
}

absl::StatusOr<HttpResponse> Api::ListNodes() {
  ordered_json out = ordered_json::array();
  for (const auto& n : nodes_->Nodes()) {
    out.push_back(
        {{"name", n.name},
         {"address", n.address},
         {"dataAddress", n.data_address},
         {"cores", n.cores},
         {"cpuUsed", std::round(n.cpu_used * 100) / 100},
         {"cpuForeign", std::round(n.cpu_foreign * 100) / 100},
         {"hot", n.hot},
         {"gpus", n.gpus},
         {"memoryBytes", n.memory_bytes},
         {"memoryUsedBytes", n.memory_used_bytes},
         {"memoryFreeBytes", n.memory_bytes > n.memory_used_bytes
                                 ? n.memory_bytes - n.memory_used_bytes
                                 : 0},
         {"instances", n.instances},
         {"proclets", n.shards},
         {"procletBytes", n.shard_bytes},
         {"computeProclets", n.tasks}});
  }
  return HttpResponse::Json(200, JsonText(out));
}

// ---- metrics port ----

HttpResponse Api::HandleMetricsPort(const HttpRequest& req) {
  if (req.path == "/healthz") return HttpResponse::Text(200, "OK");
  if (req.path != "/metrics") return PageNotFound();
  if (req.method != "GET" && req.method != "HEAD") return MethodNotAllowed();
  std::map<std::string, uint64_t> replicas;
  if (auto recs = store_->ListFunctions(""); recs.ok()) {
    for (const auto& r : *recs)
      replicas[absl::StrCat(r.name, ".", r.ns)] =
          nodes_->DesiredReplicas(r.ns, r.name, r.replicas);
  }
  ProcletGauges proclets;
  for (const auto& n : nodes_->Nodes())
    proclets.nodes.push_back({n.name, n.shards, n.shard_bytes});
  for (const auto& v : nodes_->directory()->List(""))
    for (const auto& s : v.shards)
      ++proclets.shards_by_state[ShardStateName(s.state)];
  std::vector<ResidentGauge> resident;
  for (const auto& v : nodes_->Snapshots("", ""))
    for (const auto& [node, bytes] : v.resident_by_node)
      resident.push_back({absl::StrCat(v.name, ".", v.ns), node, bytes});
  HttpResponse r = HttpResponse::Empty(200);
  r.SetHeader("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  r.body = metrics_->Render(replicas, proclets, resident);
  r.body += GpuMetricsText(*nodes_->gpu_directory());
  if (async_ != nullptr) r.body += async_->RenderMetrics();
  return r;
}

}  // namespace silt::gateway
