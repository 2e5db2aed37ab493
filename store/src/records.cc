#include "store/records.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace silt::store {
namespace {

using nlohmann::json;

// Records are CBOR maps: compact, schema-free (new fields need no migration)
// and able to carry raw bytes, which secret values are.
std::string ToBytes(const json& j) {
  std::vector<uint8_t> v = json::to_cbor(j);
  return std::string(v.begin(), v.end());
}

absl::StatusOr<json> FromBytes(absl::string_view bytes,
                               absl::string_view what) {
  json j;
  try {
    // Even with exceptions off, the parser throws for an array or map whose
    // announced size is absurd (found by fuzzing the async queue's records).
    j = json::from_cbor(bytes.begin(), bytes.end(), /*strict=*/true,
                        /*allow_exceptions=*/false);
  } catch (const json::exception&) {
    j = json(json::value_t::discarded);
  }
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(
        absl::StrCat("corrupt ", what, " record (", bytes.size(), " bytes)"));
  }
  return j;
}

template <typename T>
absl::Status Field(const json& j, const char* key, T& out,
                   absl::string_view what) {
  auto it = j.find(key);
  if (it == j.end()) return absl::OkStatus();
  try {
    it->get_to(out);
  } catch (const json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("corrupt ", what, " record: field ", key, ": ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string Encode(const FunctionRecord& r) {
  return ToBytes({{"ns", r.ns},
                  {"name", r.name},
                  {"spec", r.spec},
                  {"created", r.created_at_unix_nanos},
                  {"replicas", r.replicas},
                  {"generation", r.generation}});
}

std::string Encode(const SecretRecord& r) {
  return ToBytes({{"ns", r.ns},
                  {"name", r.name},
                  {"value", json::binary(std::vector<uint8_t>(
                                r.value.begin(), r.value.end()))}});
}

std::string Encode(const NamespaceRecord& r) {
  return ToBytes(
      {{"name", r.name}, {"labels", r.labels}, {"annotations", r.annotations}});
}

absl::StatusOr<FunctionRecord> DecodeFunction(absl::string_view bytes) {
  auto j = FromBytes(bytes, "function");
  if (!j.ok()) return j.status();
  FunctionRecord r;
  for (absl::Status s :
       {Field(*j, "ns", r.ns, "function"),
        Field(*j, "name", r.name, "function"),
        Field(*j, "spec", r.spec, "function"),
        Field(*j, "created", r.created_at_unix_nanos, "function"),
        Field(*j, "replicas", r.replicas, "function"),
        Field(*j, "generation", r.generation, "function")}) {
    if (!s.ok()) return s;
  }
  return r;
}

absl::StatusOr<SecretRecord> DecodeSecret(absl::string_view bytes) {
  auto j = FromBytes(bytes, "secret");
  if (!j.ok()) return j.status();
  SecretRecord r;
  for (absl::Status s :
       {Field(*j, "ns", r.ns, "secret"), Field(*j, "name", r.name, "secret")}) {
    if (!s.ok()) return s;
  }
  auto it = j->find("value");
  if (it == j->end() || !it->is_binary()) {
    return absl::DataLossError("corrupt secret record: value is not bytes");
  }
  const auto& bin = it->get_binary();
  r.value.assign(bin.begin(), bin.end());
  return r;
}

absl::StatusOr<NamespaceRecord> DecodeNamespace(absl::string_view bytes) {
  auto j = FromBytes(bytes, "namespace");
  if (!j.ok()) return j.status();
  NamespaceRecord r;
  for (absl::Status s :
       {Field(*j, "name", r.name, "namespace"),
        Field(*j, "labels", r.labels, "namespace"),
        Field(*j, "annotations", r.annotations, "namespace")}) {
    if (!s.ok()) return s;
  }
  return r;
}

}  // namespace silt::store
