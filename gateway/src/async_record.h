// The async queue's record of one call, as the store keeps it (CBOR): the
// request as accepted, where it stands, and once it ran the answer its
// callback carries. Records come back from disk, so decoding checks every
// field.
#ifndef SILT_GATEWAY_ASYNC_RECORD_H_
#define SILT_GATEWAY_ASYNC_RECORD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "async_queue.h"
#include "http_types.h"

namespace silt::gateway {

struct AsyncRecord {
  AsyncCall call;
  AsyncState state = AsyncState::kQueued;
  uint64_t seq = 0;  // acceptance order
  int64_t enqueued_ms = 0, next_ms = 0;
  uint32_t attempts = 0, callback_attempts = 0;
  int last_status = 0;
  std::string last_error;
  // Set once the call is final: what the callback delivers.
  bool has_result = false;
  bool failed = false;  // final but unsuccessful: dead after the callback
  int result_status = 0;
  HeaderList result_headers;
  std::string result_body;
  double duration_s = 0;
};

std::string EncodeAsyncRecord(const AsyncRecord& r);
// DataLoss for bytes that are not a record, or a record of another key.
absl::StatusOr<AsyncRecord> DecodeAsyncRecord(absl::string_view key,
                                              absl::string_view bytes);

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_ASYNC_RECORD_H_
