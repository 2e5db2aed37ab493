// The key that seals secret values in the store, and the file that keeps it.
//
// A key file holds exactly kSecretsKeyBytes raw bytes (`openssl rand -out FILE
// 32` makes one) and must be a regular file that neither group nor others may
// access (mode 0600 or stricter): both are checked on every read.
#ifndef SILT_STORE_SECRETS_KEY_H_
#define SILT_STORE_SECRETS_KEY_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace silt::store {

// AES-256: 32 bytes.
inline constexpr size_t kSecretsKeyBytes = 32;

// The key in `path`. NotFoundError when the file does not exist;
// FailedPreconditionError, naming the fix, when its size or mode is wrong.
absl::StatusOr<std::string> ReadSecretsKeyFile(const std::string& path);

// As ReadSecretsKeyFile, but when `path` does not exist it is created first
// (mode 0600, kSecretsKeyBytes from OpenSSL's RAND_bytes, fsynced) and
// *created is set.
absl::StatusOr<std::string> LoadOrCreateSecretsKeyFile(const std::string& path,
                                                       bool* created);

}  // namespace silt::store

#endif  // SILT_STORE_SECRETS_KEY_H_
