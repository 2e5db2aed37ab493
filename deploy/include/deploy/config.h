// faas-cli's credentials file (~/.openfaas/config.yml), read and written
// compatibly so that `silt login` and `faas-cli login` share it.
#ifndef SILT_DEPLOY_CONFIG_H_
#define SILT_DEPLOY_CONFIG_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace silt::deploy {

struct AuthEntry {
  std::string gateway;
  std::string auth;   // "basic" or "oauth2"
  std::string token;  // base64("user:password") for basic
};

// $OPENFAAS_CONFIG, else ./.openfaas when CI=true, else ~/.openfaas.
std::string ConfigDir();
std::string ConfigPath();

absl::StatusOr<std::vector<AuthEntry>> ReadAuthEntries();
// Adds or replaces the entry for entry.gateway; writes the file with mode 0600.
absl::Status SaveAuth(const AuthEntry& entry);
absl::Status RemoveAuth(const std::string& gateway);

// The Authorization header value for a gateway, if credentials are saved for
// it.
std::optional<std::string> AuthorizationFor(const std::string& gateway);

std::string BasicToken(const std::string& user, const std::string& password);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_CONFIG_H_
