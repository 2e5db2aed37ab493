// /system/state, /system/proclets and node drain: the HTTP face of the
// proclet directory (directory.h).
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "api.h"
#include "directory.h"
#include "gpu_directory.h"
#include "silt/state_wire.h"

namespace silt::gateway {

nlohmann::ordered_json GpuProcletJson(const GpuProcletView& g);  // api_gpu.cc

namespace {

using nlohmann::ordered_json;

ordered_json ShardJson(const ShardView& s) {
  return {{"id", s.id},
          {"kind", KindName(s.kind)},
          {"namespace", s.ns},
          {"structure", s.structure},
          {"node", s.node},
          {"bytes", s.bytes},
          {"count", s.count},
          {"epoch", s.epoch},
          {"state", ShardStateName(s.state)},
          {"lo", s.lo},
          {"hi", s.hi}};
}

ordered_json StructureJson(const StructureView& v, bool with_shards) {
  ordered_json j = {{"name", v.name},
                    {"namespace", v.ns},
                    {"kind", KindName(v.kind)},
                    {"shards", v.shards.size()},
                    {"bytes", v.bytes()},
                    {"count", v.count()},
                    {"maxShardBytes", v.max_shard_bytes},
                    {"functions", v.functions}};
  uint32_t lost = 0;
  for (const auto& s : v.shards) lost += s.state == ShardState::kLost;
  j["lostShards"] = lost;
  if (with_shards) {
    ordered_json shards = ordered_json::array();
    for (const auto& s : v.shards) shards.push_back(ShardJson(s));
    j["proclets"] = std::move(shards);
  }
  return j;
}

ordered_json MigrationJson(const MigrationResult& r) {
  return {{"id", r.id},
          {"from", r.from},
          {"to", r.to},
          {"epoch", r.epoch},
          {"bytes", r.bytes},
          {"totalMs", r.total_ms},
          {"pauseMs", r.pause_ms},
          {"rounds", r.rounds}};
}

}  // namespace

absl::StatusOr<HttpResponse> Api::ListProclets(const HttpRequest& req) {
  std::string ns;
  if (!req.QueryParam("namespace").empty()) {
    auto resolved = ResolveNamespace("", req);
    if (!resolved.ok()) return resolved.status();
    ns = *resolved;
  }
  std::string function = req.QueryParam("function");
  ordered_json out = ordered_json::array();
  for (const auto& v : nodes_->directory()->List(ns)) {
    if (!function.empty() && std::find(v.functions.begin(), v.functions.end(),
                                       function) == v.functions.end())
      continue;
    for (const auto& s : v.shards) out.push_back(ShardJson(s));
  }
  for (const auto& g : nodes_->gpu_directory()->List(ns))
    if (function.empty() || g.function == function)
      out.push_back(GpuProcletJson(g));
  return HttpResponse::Json(200, JsonText(out));
}

absl::StatusOr<HttpResponse> Api::MigrateProclet(const HttpRequest& req,
                                                 absl::string_view id_text) {
  if (GpuDirectory::IsGpuId(std::string(id_text)))
    return MigrateGpuProclet(req, id_text);
  uint64_t id;
  if (!absl::SimpleAtoi(id_text, &id))
    return absl::InvalidArgumentError(
        absl::StrCat("\"", id_text,
                     "\" is not a proclet id (a number; see silt proclets "
                     "list)"));
  auto body = ordered_json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("node") ||
      !body["node"].is_string() || body["node"].get<std::string>().empty())
    return absl::InvalidArgumentError(
        "want a JSON body {\"node\": \"NAME\"} naming the target node");
  auto r = nodes_->directory()->Migrate(id, body["node"].get<std::string>());
  if (!r.ok()) return r.status();
  return HttpResponse::Json(200, JsonText(MigrationJson(*r)));
}

absl::StatusOr<HttpResponse> Api::GetState(const HttpRequest& req,
                                           absl::string_view name) {
  if (name.empty()) {
    std::string ns;
    if (!req.QueryParam("namespace").empty()) {
      auto resolved = ResolveNamespace("", req);
      if (!resolved.ok()) return resolved.status();
      ns = *resolved;
    }
    ordered_json out = ordered_json::array();
    for (const auto& v : nodes_->directory()->List(ns))
      out.push_back(StructureJson(v, false));
    return HttpResponse::Json(200, JsonText(out));
  }
  auto ns = ResolveNamespace("", req);
  if (!ns.ok()) return ns.status();
  auto v = nodes_->directory()->Get(*ns, std::string(name));
  if (!v.ok()) return v.status();
  return HttpResponse::Json(200, JsonText(StructureJson(*v, true)));
}

absl::StatusOr<HttpResponse> Api::DeleteState(const HttpRequest& req,
                                              absl::string_view name) {
  auto ns = ResolveNamespace("", req);
  if (!ns.ok()) return ns.status();
  if (auto s = nodes_->directory()->Delete(*ns, std::string(name)); !s.ok())
    return s;
  return HttpResponse::Empty(202);
}

absl::StatusOr<HttpResponse> Api::DrainNode(absl::string_view node) {
  auto drained = nodes_->directory()->Drain(std::string(node));
  if (!drained.ok()) return drained.status();
  if (!drained->left.empty()) {
    // The error says what did move, so that a retry is an informed one.
    const absl::Status& why = drained->reason;
    return absl::Status(
        why.code(),
        absl::StrCat("drained ", node, " partly: ", drained->moved.size(),
                     " proclet(s) moved, ", drained->left.size(), " left (",
                     drained->left_bytes, " bytes): ", why.message()));
  }
  ordered_json out = {{"node", node}, {"moved", ordered_json::array()}};
  for (const auto& r : drained->moved) out["moved"].push_back(MigrationJson(r));
  return HttpResponse::Json(200, JsonText(out));
}

}  // namespace silt::gateway
