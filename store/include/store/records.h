// The typed records Silt persists. Encoding is private to the store.
#ifndef SILT_STORE_RECORDS_H_
#define SILT_STORE_RECORDS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::store {

struct FunctionRecord {
  std::string ns;
  std::string name;
  // The deployment exactly as the gateway normalised it (OpenFaaS
  // FunctionDeployment JSON).
  std::string spec;
  int64_t created_at_unix_nanos = 0;
  // Replicas the user asked for (scale-function or the min-scale label); 0 =
  // scaled to zero.
  uint64_t replicas = 0;
  // Bumped on every update, so that instances and snapshots of an older spec
  // are recognisable.
  uint64_t generation = 0;
};

struct SecretRecord {
  std::string ns;
  std::string name;
  std::string value;  // raw bytes
};

struct NamespaceRecord {
  std::string name;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
};

std::string Encode(const FunctionRecord& r);
std::string Encode(const SecretRecord& r);
std::string Encode(const NamespaceRecord& r);
absl::StatusOr<FunctionRecord> DecodeFunction(absl::string_view bytes);
absl::StatusOr<SecretRecord> DecodeSecret(absl::string_view bytes);
absl::StatusOr<NamespaceRecord> DecodeNamespace(absl::string_view bytes);

}  // namespace silt::store

#endif  // SILT_STORE_RECORDS_H_
