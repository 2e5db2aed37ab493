#include "sealer.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace silt::store {
namespace {

constexpr size_t kHeaderBytes = 1 + kNonceBytes;

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using Ctx = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;

const unsigned char* Bytes(absl::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

// The OpenSSL error queue as a Status (only for failures that are not a value
// failing to authenticate: those say so themselves).
absl::Status OpenSslError(absl::string_view op) {
  char buf[256] = "unknown error";
  if (unsigned long e = ERR_get_error(); e != 0)
    ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat("store: ", op, ": OpenSSL ", buf));
}

}  // namespace

Sealer::Sealer(absl::string_view key) {
  memset(key_, 0, sizeof(key_));
  memcpy(key_, key.data(), std::min(key.size(), sizeof(key_)));
}

Sealer::~Sealer() { OPENSSL_cleanse(key_, sizeof(key_)); }

absl::StatusOr<std::string> Sealer::Seal(absl::string_view aad,
                                         absl::string_view plaintext) const {
  if (plaintext.size() > INT_MAX / 2 || aad.size() > INT_MAX / 2)
    return absl::InvalidArgumentError("store: secret value too large to seal");
  std::string out(kHeaderBytes + plaintext.size() + kTagBytes, '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  p[0] = kSealedV1;
  if (RAND_bytes(p + 1, kNonceBytes) != 1) return OpenSslError("RAND_bytes");
  Ctx ctx(EVP_CIPHER_CTX_new());
  unsigned char* ct = p + kHeaderBytes;
  int n = 0, last = 0;
  if (!ctx ||
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key_, p + 1) !=
          1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &n, p, 1) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &n, Bytes(aad),
                        static_cast<int>(aad.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), ct, &n, Bytes(plaintext),
                        static_cast<int>(plaintext.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), ct + n, &last) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes,
                          ct + plaintext.size()) != 1) {
    return OpenSslError("sealing a secret");
  }
  return out;
}

absl::StatusOr<std::string> Sealer::Open(absl::string_view aad,
                                         absl::string_view sealed) const {
  if (sealed.size() < kHeaderBytes + kTagBytes || aad.size() > INT_MAX / 2 ||
      sealed.size() > INT_MAX / 2) {
    return absl::DataLossError(absl::StrCat("sealed secret of ", sealed.size(),
                                            " bytes is not a valid record"));
  }
  if (static_cast<uint8_t>(sealed[0]) != kSealedV1) {
    return absl::DataLossError(
        absl::StrCat("sealed secret has unknown format version ",
                     static_cast<int>(static_cast<uint8_t>(sealed[0]))));
  }
  const unsigned char* p = Bytes(sealed);
  size_t ct_size = sealed.size() - kHeaderBytes - kTagBytes;
  unsigned char tag[kTagBytes];
  memcpy(tag, p + kHeaderBytes + ct_size, kTagBytes);
  std::string out(ct_size, '\0');
  auto* pt = reinterpret_cast<unsigned char*>(out.data());
  Ctx ctx(EVP_CIPHER_CTX_new());
  int n = 0, last = 0;
  if (!ctx ||
      EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key_, p + 1) !=
          1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &n, p, 1) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &n, Bytes(aad),
                        static_cast<int>(aad.size())) != 1 ||
      EVP_DecryptUpdate(ctx.get(), pt, &n, p + kHeaderBytes,
                        static_cast<int>(ct_size)) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) !=
          1) {
    return OpenSslError("opening a secret");
  }
  if (EVP_DecryptFinal_ex(ctx.get(), pt + n, &last) != 1) {
    ERR_clear_error();
    OPENSSL_cleanse(out.data(), out.size());
    return absl::DataLossError(
        "sealed secret does not authenticate: sealed with another key, or "
        "altered on disk");
  }
  return out;
}

}  // namespace silt::store
