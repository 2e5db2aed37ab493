#include "openfaas_types.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace silt::gateway {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

absl::Status TypeError(absl::string_view field, absl::string_view want,
                       const json& got) {
  return absl::InvalidArgumentError(
      absl::StrCat("json: cannot unmarshal ", got.type_name(), " into field ",
                   field, " of type ", want));
}

// Each Get* leaves `out` untouched when the key is absent or null (Go
// semantics).
absl::Status GetString(const json& j, const char* key, std::string& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return TypeError(key, "string", *it);
  out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status GetBool(const json& j, const char* key, bool& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return TypeError(key, "bool", *it);
  out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status GetStringMap(const json& j, const char* key,
                          std::optional<StringMap>& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return TypeError(key, "map[string]string", *it);
  StringMap m;
  for (auto& [k, v] : it->items()) {
    if (v.is_null()) {
      m[k] = "";
      continue;
    }
    if (!v.is_string())
      return TypeError(absl::StrCat(key, ".", k), "string", v);
    m[k] = v.get<std::string>();
  }
  out = std::move(m);
  return absl::OkStatus();
}

absl::Status GetStringList(const json& j, const char* key,
                           std::vector<std::string>& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return TypeError(key, "[]string", *it);
  out.clear();
  for (const auto& v : *it) {
    if (!v.is_string()) return TypeError(key, "string", v);
    out.push_back(v.get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status GetResources(const json& j, const char* key,
                          std::optional<FunctionResources>& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return TypeError(key, "FunctionResources", *it);
  FunctionResources r;
  for (absl::Status s :
       {GetString(*it, "memory", r.memory), GetString(*it, "cpu", r.cpu),
        GetString(*it, "nvidia.com/gpu", r.nvidia_gpu),
        GetString(*it, "amd.com/gpu", r.amd_gpu),
        GetString(*it, "intel.com/gpu", r.intel_gpu)}) {
    if (!s.ok()) return s;
  }
  out = std::move(r);
  return absl::OkStatus();
}

ordered_json ResourcesJson(const FunctionResources& r) {
  ordered_json o = ordered_json::object();
  if (!r.memory.empty()) o["memory"] = r.memory;
  if (!r.cpu.empty()) o["cpu"] = r.cpu;
  if (!r.nvidia_gpu.empty()) o["nvidia.com/gpu"] = r.nvidia_gpu;
  if (!r.amd_gpu.empty()) o["amd.com/gpu"] = r.amd_gpu;
  if (!r.intel_gpu.empty()) o["intel.com/gpu"] = r.intel_gpu;
  return o;
}

ordered_json MapJson(const StringMap& m) {
  ordered_json o = ordered_json::object();
  for (const auto& [k, v] : m) o[k] = v;
  return o;
}

// Fields shared by FunctionDeployment and FunctionStatus, after the name.
void AppendCommon(const FunctionDeployment& d, ordered_json& o,
                  bool maps_always) {
  o["image"] = d.image;
  if (!d.ns.empty()) o["namespace"] = d.ns;
  if (!d.env_process.empty()) o["envProcess"] = d.env_process;
  if (!d.env_vars.empty()) o["envVars"] = MapJson(d.env_vars);
  if (!d.constraints.empty()) o["constraints"] = d.constraints;
  if (!d.secrets.empty()) o["secrets"] = d.secrets;
  if (d.labels || maps_always)
    o["labels"] = MapJson(d.labels.value_or(StringMap{}));
  if (d.annotations || maps_always)
    o["annotations"] = MapJson(d.annotations.value_or(StringMap{}));
  if (d.limits) o["limits"] = ResourcesJson(*d.limits);
  if (d.requests) o["requests"] = ResourcesJson(*d.requests);
  if (d.read_only_root_filesystem) o["readOnlyRootFilesystem"] = true;
}

}  // namespace

absl::StatusOr<json> ParseJsonObject(absl::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        "invalid JSON in request body: it must be a single JSON object");
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "json: cannot unmarshal ", j.type_name(), " into a JSON object"));
  }
  return j;
}

absl::StatusOr<FunctionDeployment> ParseFunctionDeployment(
    absl::string_view body) {
  auto j = ParseJsonObject(body);
  if (!j.ok()) return j.status();
  FunctionDeployment d;
  std::optional<StringMap> env;
  for (absl::Status s :
       {GetString(*j, "service", d.service), GetString(*j, "image", d.image),
        GetString(*j, "namespace", d.ns),
        GetString(*j, "envProcess", d.env_process),
        GetStringMap(*j, "envVars", env),
        GetStringList(*j, "constraints", d.constraints),
        GetStringList(*j, "secrets", d.secrets),
        GetStringMap(*j, "labels", d.labels),
        GetStringMap(*j, "annotations", d.annotations),
        GetResources(*j, "limits", d.limits),
        GetResources(*j, "requests", d.requests),
        GetBool(*j, "readOnlyRootFilesystem", d.read_only_root_filesystem)}) {
    if (!s.ok()) return s;
  }
  if (env) d.env_vars = std::move(*env);
  return d;
}

absl::StatusOr<Secret> ParseSecret(absl::string_view body) {
  auto j = ParseJsonObject(body);
  if (!j.ok()) return j.status();
  Secret s;
  std::string raw;
  for (absl::Status st :
       {GetString(*j, "name", s.name), GetString(*j, "namespace", s.ns),
        GetString(*j, "value", s.value), GetString(*j, "rawValue", raw)}) {
    if (!st.ok()) return st;
  }
  if (s.value.empty() && !raw.empty()) {
    if (!absl::Base64Unescape(raw, &s.value)) {
      return absl::InvalidArgumentError(
          "rawValue is not valid standard base64");
    }
  }
  return s;
}

absl::StatusOr<FunctionRef> ParseDeleteFunctionRequest(absl::string_view body) {
  auto j = ParseJsonObject(body);
  if (!j.ok()) return j.status();
  FunctionRef f;
  for (absl::Status st : {GetString(*j, "functionName", f.name),
                          GetString(*j, "namespace", f.ns)}) {
    if (!st.ok()) return st;
  }
  return f;
}

std::string JsonText(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string JsonText(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

absl::StatusOr<FunctionNamespace> ParseFunctionNamespace(
    absl::string_view body) {
  auto j = ParseJsonObject(body);
  if (!j.ok()) return j.status();
  FunctionNamespace n;
  std::optional<StringMap> labels, annotations;
  for (absl::Status s :
       {GetString(*j, "name", n.name), GetStringMap(*j, "labels", labels),
        GetStringMap(*j, "annotations", annotations)}) {
    if (!s.ok()) return s;
  }
  if (labels) n.labels = std::move(*labels);
  if (annotations) n.annotations = std::move(*annotations);
  return n;
}

ordered_json ToJson(const FunctionDeployment& d) {
  ordered_json o = ordered_json::object();
  o["service"] = d.service;
  AppendCommon(d, o, /*maps_always=*/false);
  return o;
}

ordered_json ToStatusJson(const FunctionDeployment& d,
                          const FunctionStatusExtra& extra) {
  ordered_json o = ordered_json::object();
  o["name"] = d.service;
  AppendCommon(d, o, /*maps_always=*/true);
  // As OpenFaaS providers label what they run (dashboards group by it).
  if (!o["labels"].contains("faas_function"))
    o["labels"]["faas_function"] = d.service;
  if (extra.invocation_count != 0)
    o["invocationCount"] = extra.invocation_count;
  // Desired is never below what runs (a function scaled from zero by a call).
  uint64_t replicas = std::max(extra.replicas, extra.available_replicas);
  if (replicas != 0) o["replicas"] = replicas;
  if (extra.available_replicas != 0)
    o["availableReplicas"] = extra.available_replicas;
  o["createdAt"] = FormatRfc3339Nano(extra.created_at_unix_nanos);
  return o;
}

std::string FormatRfc3339Nano(int64_t unix_nanos) {
  if (unix_nanos == 0) return "0001-01-01T00:00:00Z";
  time_t secs = static_cast<time_t>(unix_nanos / 1000000000);
  int64_t nanos = unix_nanos % 1000000000;
  if (nanos < 0) {
    nanos += 1000000000;
    --secs;
  }
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[64];
  size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  std::string out(buf, n);
  if (nanos != 0) {
    char frac[16];
    snprintf(frac, sizeof(frac), ".%09lld", static_cast<long long>(nanos));
    std::string f(frac);
    while (f.back() == '0') f.pop_back();
    out += f;
  }
  out += "Z";
  return out;
}

absl::StatusOr<int64_t> ParseRfc3339(absl::string_view s) {
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, std::string(s), &t, &err)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an RFC 3339 time: ", s, " (", err, ")"));
  }
  return absl::ToUnixNanos(t);
}

}  // namespace silt::gateway
