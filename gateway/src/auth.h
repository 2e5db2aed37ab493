// OpenFaaS basic auth: credentials in
// DATA_DIR/secrets/basic-auth-{user,password}.
#ifndef SILT_GATEWAY_AUTH_H_
#define SILT_GATEWAY_AUTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::gateway {

struct Credentials {
  std::string user;
  std::string password;
  std::string password_file;
  bool generated = false;  // true when this start created them
};

// Reads the credentials from `secrets_dir`, creating them (user "admin", a
// random 32-character password, files mode 0600) when they do not exist yet.
absl::StatusOr<Credentials> LoadOrCreateCredentials(
    const std::string& secrets_dir);

// Checks an Authorization header value against the credentials: user compared
// exactly, password in constant time.
bool CheckBasicAuth(const Credentials& creds, absl::string_view authorization);

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_AUTH_H_
