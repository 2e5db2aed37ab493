// The OpenFaaS wire types (faas-provider types/*.go), parsed with Go
// encoding/json semantics and written back with Go's omitempty rules, so
// clients see faasd's JSON.
#ifndef SILT_GATEWAY_OPENFAAS_TYPES_H_
#define SILT_GATEWAY_OPENFAAS_TYPES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace silt::gateway {

using StringMap = std::map<std::string, std::string>;

struct FunctionResources {
  std::string memory;
  std::string cpu;
  std::string nvidia_gpu;  // "nvidia.com/gpu"
  std::string amd_gpu;     // "amd.com/gpu"
  std::string intel_gpu;   // "intel.com/gpu"
};

struct FunctionDeployment {
  std::string service;
  std::string image;
  std::string ns;  // "namespace"
  std::string env_process;
  StringMap env_vars;
  std::vector<std::string> constraints;
  std::vector<std::string> secrets;
  std::optional<StringMap> labels;
  std::optional<StringMap> annotations;
  std::optional<FunctionResources> limits;
  std::optional<FunctionResources> requests;
  bool read_only_root_filesystem = false;
};

struct FunctionStatusExtra {
  double invocation_count = 0;
  uint64_t replicas = 0;
  uint64_t available_replicas = 0;
  int64_t created_at_unix_nanos = 0;
};

struct Secret {
  std::string name;
  std::string ns;
  std::string value;  // value, or the decoded rawValue
};

// DeleteFunctionRequest.
struct FunctionRef {
  std::string name;  // functionName
  std::string ns;    // namespace
};

struct FunctionNamespace {
  std::string name;
  StringMap labels;
  StringMap annotations;
};

// Parsing follows encoding/json: unknown keys are ignored, null means "not
// given", and a value of the wrong type is an InvalidArgument error naming the
// field.
absl::StatusOr<nlohmann::json> ParseJsonObject(absl::string_view body);
absl::StatusOr<FunctionDeployment> ParseFunctionDeployment(
    absl::string_view body);
absl::StatusOr<Secret> ParseSecret(absl::string_view body);
absl::StatusOr<FunctionRef> ParseDeleteFunctionRequest(absl::string_view body);
absl::StatusOr<FunctionNamespace> ParseFunctionNamespace(
    absl::string_view body);

// The normalised deployment as stored (FunctionDeployment JSON, omitempty
// applied).
nlohmann::ordered_json ToJson(const FunctionDeployment& d);
// FunctionStatus JSON: labels/annotations always objects, omitempty elsewhere.
nlohmann::ordered_json ToStatusJson(const FunctionDeployment& d,
                                    const FunctionStatusExtra& extra);

// JSON text of `j`, never throwing: bytes that are not UTF-8 (a function's
// log line, say) become U+FFFD.
std::string JsonText(const nlohmann::json& j);
std::string JsonText(const nlohmann::ordered_json& j);

// Go's time.Time JSON form (RFC 3339 with trailing-zero-trimmed nanoseconds,
// UTC).
std::string FormatRfc3339Nano(int64_t unix_nanos);
// RFC 3339 with optional fraction and zone; for `since=` query values.
absl::StatusOr<int64_t> ParseRfc3339(absl::string_view s);

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_OPENFAAS_TYPES_H_
