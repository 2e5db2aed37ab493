// GET /system/events: what the rebalancer decided (rebalancer.h), oldest
// first. ?after=SEQ returns only later events (poll with the last seq seen).
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "api.h"
#include "rebalancer.h"

namespace silt::gateway {

absl::StatusOr<HttpResponse> Api::ListEvents(const HttpRequest& req) {
  uint64_t after = 0;
  std::string a = req.QueryParam("after");
  if (!a.empty() && !absl::SimpleAtoi(a, &after))
    return absl::InvalidArgumentError(absl::StrCat(
        "after must be an event sequence number, not \"", a, "\""));
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& e : nodes_->Events(after, std::chrono::milliseconds(0))) {
    nlohmann::ordered_json j = {
        {"seq", e.seq},
        {"time",
         absl::FormatTime(absl::RFC3339_full, absl::FromUnixNanos(e.unix_nanos),
                          absl::UTCTimeZone())},
        {"type", EventTypeName(e.type)},
        {"reason", MoveReasonName(e.reason)},
        {"node", e.node}};
    if (e.type == RebalanceEvent::Type::kMove) {
      j["kind"] = MoveKindName(e.kind);
      j["to"] = e.to;
      j["subject"] = e.subject;
      j["amount"] = e.amount;
    }
    if (e.type == RebalanceEvent::Type::kMove ||
        e.type == RebalanceEvent::Type::kEquilibrium)
      j["ms"] = std::round(e.ms * 1000) / 1000;
    j["detail"] = e.detail;
    out.push_back(std::move(j));
  }
  return HttpResponse::Json(200, JsonText(out));
}

}  // namespace silt::gateway
