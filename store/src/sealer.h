// Sealing of secret values at rest: AES-256-GCM over OpenSSL's EVP API.
//
// A sealed value is
//
//   byte 0        format version, kSealedV1 (0x01)
//   bytes 1..12   nonce, 96 random bits, new for every value
//   bytes 13..    ciphertext, as long as the value
//   last 16       GCM tag
//
// and authenticates, besides the value, the version byte and the associated
// data the caller gives (the record's key: namespace, NUL, name), so a sealed
// value moved to another record, or to another format, does not open.
#ifndef SILT_STORE_SEALER_H_
#define SILT_STORE_SEALER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::store {

inline constexpr uint8_t kSealedV1 = 0x01;
inline constexpr size_t kNonceBytes = 12;
inline constexpr size_t kTagBytes = 16;

class Sealer {
 public:
  // `key` must be kSecretsKeyBytes long (Store::Open checks it).
  explicit Sealer(absl::string_view key);
  ~Sealer();  // wipes the key
  Sealer(const Sealer&) = delete;
  Sealer& operator=(const Sealer&) = delete;

  absl::StatusOr<std::string> Seal(absl::string_view aad,
                                   absl::string_view plaintext) const;
  // The plaintext; DataLossError when `sealed` is not a kSealedV1 value that
  // this key sealed with this `aad`.
  absl::StatusOr<std::string> Open(absl::string_view aad,
                                   absl::string_view sealed) const;

 private:
  unsigned char key_[32];
};

}  // namespace silt::store

#endif  // SILT_STORE_SEALER_H_
