#include "async_record.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "proclets/json_integer.h"

namespace silt::gateway {
namespace {

using nlohmann::json;

json HeadersJson(const HeaderList& h) {
  json a = json::array();
  for (const auto& [k, v] : h) a.push_back({k, v});
  return a;
}

json Binary(const std::string& s) {
  return json::binary(std::vector<uint8_t>(s.begin(), s.end()));
}

}  // namespace

std::string EncodeAsyncRecord(const AsyncRecord& r) {
  json j = {{"id", r.call.call_id},
            {"ns", r.call.ns},
            {"name", r.call.name},
            {"path", r.call.path},
            {"query", r.call.query},
            {"headers", HeadersJson(r.call.headers)},
            {"body", Binary(r.call.body)},
            {"callback", r.call.callback_url},
            {"state", static_cast<int>(r.state)},
            {"seq", r.seq},
            {"enqueued", r.enqueued_ms},
            {"next", r.next_ms},
            {"attempts", r.attempts},
            {"callback_attempts", r.callback_attempts},
            {"last_status", r.last_status},
            {"last_error", r.last_error}};
  if (r.has_result) {
    j["result"] = {{"failed", r.failed},
                   {"status", r.result_status},
                   {"headers", HeadersJson(r.result_headers)},
                   {"body", Binary(r.result_body)},
                   {"duration", r.duration_s}};
  }
  std::vector<uint8_t> v = json::to_cbor(j);
  return std::string(v.begin(), v.end());
}

absl::StatusOr<AsyncRecord> DecodeAsyncRecord(absl::string_view key,
                                              absl::string_view bytes) {
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("async call ", key, ": corrupt record (", why, ")"));
  };
  try {
    // Inside the try: with exceptions off, the parser still throws for an
    // array or map whose announced size is absurd (found by fuzzing).
    json j = json::from_cbor(bytes.begin(), bytes.end(), true, false);
    if (j.is_discarded() || !j.is_object()) return corrupt("not a map");
    auto str = [](const json& b) {
      const auto& v = b.get_binary();
      return std::string(v.begin(), v.end());
    };
    auto headers = [](const json& a) {
      HeaderList h;
      for (const auto& kv : a)
        h.emplace_back(kv.at(0).get<std::string>(),
                       kv.at(1).get<std::string>());
      return h;
    };
    AsyncRecord r;
    r.call.call_id = j.at("id").get<std::string>();
    r.call.ns = j.at("ns").get<std::string>();
    r.call.name = j.at("name").get<std::string>();
    r.call.path = j.at("path").get<std::string>();
    r.call.query = j.at("query").get<std::string>();
    r.call.headers = headers(j.at("headers"));
    r.call.body = str(j.at("body"));
    r.call.callback_url = j.at("callback").get<std::string>();
    int state = proclets::JsonIntegerAt<int>(j, "state");
    if (state < 1 || state > 3) return corrupt("unknown state");
    r.state = static_cast<AsyncState>(state);
    r.seq = proclets::JsonIntegerAt<uint64_t>(j, "seq");
    r.enqueued_ms = proclets::JsonIntegerAt<int64_t>(j, "enqueued");
    r.next_ms = proclets::JsonIntegerAt<int64_t>(j, "next");
    r.attempts = proclets::JsonIntegerAt<uint32_t>(j, "attempts");
    r.callback_attempts =
        proclets::JsonIntegerAt<uint32_t>(j, "callback_attempts");
    r.last_status = proclets::JsonIntegerAt<int>(j, "last_status");
    r.last_error = j.at("last_error").get<std::string>();
    if (auto it = j.find("result"); it != j.end()) {
      r.has_result = true;
      r.failed = it->at("failed").get<bool>();
      r.result_status = proclets::JsonIntegerAt<int>(*it, "status");
      r.result_headers = headers(it->at("headers"));
      r.result_body = str(it->at("body"));
      r.duration_s = it->at("duration").get<double>();
    }
    if (r.call.call_id != key) return corrupt("key and id differ");
    return r;
  } catch (const json::exception& e) {
    return corrupt(e.what());
  }
}

}  // namespace silt::gateway
