// An async queue record as the gateway reads it back from its store (a disk
// that may hold anything): a record or DataLoss, never a crash; and a record
// that decodes encodes to one that decodes the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "async_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in(reinterpret_cast<const char*>(data), size);
  // The first byte picks how much of the input is the key.
  size_t key_len = size == 0 ? 0 : data[0] % 16;
  if (key_len + 1 > size) return 0;
  absl::string_view key = in.substr(1, key_len);
  auto r = silt::gateway::DecodeAsyncRecord(key, in.substr(1 + key_len));
  if (!r.ok()) return 0;
  std::string again = silt::gateway::EncodeAsyncRecord(*r);
  auto back = silt::gateway::DecodeAsyncRecord(key, again);
  if (!back.ok() || silt::gateway::EncodeAsyncRecord(*back) != again) abort();
  return 0;
}
