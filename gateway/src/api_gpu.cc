// /system/gpu and GPU proclet moves: the HTTP face of the GPU directory
// (gpu_directory.h).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "api.h"
#include "gpu_directory.h"
#include "nodes.h"

namespace silt::gateway {

using nlohmann::ordered_json;

ordered_json GpuProcletJson(const GpuProcletView& g) {
  return {{"id", g.id},
          {"kind", "gpu"},
          {"namespace", g.ns},
          {"function", g.function},
          {"structure", g.name},
          {"node", g.node},
          {"backend", g.backend},
          {"device", g.device},
          {"bytes", g.memory_used},
          {"memoryLimit", g.memory_limit},
          {"launches", g.launches},
          {"busyMs", g.busy_ns / 1e6},
          {"utilization", g.utilization},
          {"moves", g.moves},
          {"lastPauseMs", g.last_pause_ms},
          {"state", "serving"}};
}

namespace {

// How busy `node`'s GPU was: its proclets' shares, at most all of it.
double GpuUtilization(const std::vector<GpuProcletView>& proclets,
                      const std::string& node) {
  double busy = 0;
  for (const auto& p : proclets)
    if (p.node == node && p.backend == "cuda") busy += p.utilization;
  return std::min(1.0, busy);
}

ordered_json GpuMoveJson(const GpuMove& m) {
  return {{"id", m.id},
          {"kind", "gpu"},
          {"from", m.from},
          {"to", m.to},
          {"fromBackend", m.from_backend},
          {"toBackend", m.to_backend},
          {"toDevice", m.to_device},
          {"bytes", m.bytes},
          {"precopyBytes", m.precopy_bytes},
          {"pausedBytes", m.paused_bytes},
          {"precopyMs", m.precopy_ms},
          {"pauseMs", m.pause_ms},
          {"extractMs", m.extract_ms},
          {"injectMs", m.inject_ms},
          {"totalMs", m.total_ms}};
}

}  // namespace

absl::StatusOr<HttpResponse> Api::MigrateGpuProclet(const HttpRequest& req,
                                                    absl::string_view id) {
  auto body = ordered_json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("node") ||
      !body["node"].is_string() || body["node"].get<std::string>().empty() ||
      (body.contains("backend") && !body["backend"].is_string()))
    return absl::InvalidArgumentError(
        "want a JSON body {\"node\": \"NAME\"} naming the target node, and "
        "optionally \"backend\": \"cuda\" or \"host\" (its CPU cores)");
  auto m = nodes_->gpu_directory()->Migrate(
      std::string(id), body["node"].get<std::string>(),
      body.value("backend", std::string()));
  if (!m.ok()) return m.status();
  return HttpResponse::Json(200, JsonText(GpuMoveJson(*m)));
}

absl::StatusOr<HttpResponse> Api::ResizeGpuProclet(const HttpRequest& req,
                                                   absl::string_view id) {
  if (!GpuDirectory::IsGpuId(std::string(id)))
    return absl::InvalidArgumentError(
        absl::StrCat("proclet ", id,
                     " is not a GPU proclet (g<N>): only those are resized"));
  auto body = ordered_json::parse(req.body, nullptr, false);
  uint64_t bytes = 0;
  if (!body.is_discarded() && body.is_object() && body.contains("memory")) {
    const auto& m = body["memory"];
    if (m.is_number_unsigned()) {
      bytes = m.get<uint64_t>();
    } else if (m.is_string()) {
      if (auto q = ParseMemoryQuantity(m.get<std::string>()); q.ok())
        bytes = *q;
    }
  }
  if (bytes == 0)
    return absl::InvalidArgumentError(
        "want a JSON body {\"memory\": \"512Mi\"} (or a number of bytes): "
        "the GPU proclet's new allocation");
  GpuDirectory* d = nodes_->gpu_directory();
  GpuProcletView view;
  for (const auto& g : d->List(""))
    if (g.id == id) view = g;
  if (view.id.empty())
    return absl::NotFoundError(
        absl::StrCat("no GPU proclet ", id, " (see silt proclets list)"));
  // Within what its function declared.
  auto rec = store_->GetFunction(view.ns, view.function);
  if (!rec.ok()) return rec.status();
  auto deployment = LoadDeployment(*rec);
  if (!deployment.ok()) return deployment.status();
  GpuNeeds needs;
  if (deployment->labels) {
    auto parsed = ParseGpuLabels(*deployment->labels);
    if (!parsed.ok()) return parsed.status();
    needs = *parsed;
  }
  if (needs.min > 0 && bytes < needs.min)
    return absl::InvalidArgumentError(
        absl::StrCat(bytes, " bytes is below function ", view.function,
                     "'s com.silt.gpu.min-memory (", needs.min, " bytes)"));
  if (needs.max > 0 && bytes > needs.max)
    return absl::InvalidArgumentError(
        absl::StrCat(bytes, " bytes is above function ", view.function,
                     "'s com.silt.gpu.max-memory (", needs.max, " bytes)"));
  auto resized = d->Resize(std::string(id), bytes, absl::Seconds(5));
  if (!resized.ok()) return resized.status();
  return HttpResponse::Json(200, JsonText(GpuProcletJson(*resized)));
}

absl::StatusOr<HttpResponse> Api::ListGpus() {
  GpuDirectory* d = nodes_->gpu_directory();
  const auto proclets = d->List("");
  ordered_json nodes = ordered_json::array();
  for (const auto& n : d->Nodes()) {
    uint64_t used = 0, limits = 0;
    uint32_t on_gpu = 0, on_cpu = 0;
    for (const auto& p : proclets) {
      if (p.node != n.name) continue;
      if (p.backend == "cuda") {
        used += p.memory_used;
        limits += p.memory_limit;
        ++on_gpu;
      } else {
        ++on_cpu;
      }
    }
    nodes.push_back({{"node", n.name},
                     {"gpus", n.gpus},
                     {"model", n.gpu_model},
                     {"memory", n.gpu_memory},
                     {"memoryUsed", used},
                     {"memoryPromised", limits},
                     {"utilization", GpuUtilization(proclets, n.name)},
                     {"reclaimed", d->Reclaimed(n.name)},
                     {"proclets", on_gpu},
                     {"hostProclets", on_cpu}});
  }
  ordered_json all = ordered_json::array();
  for (const auto& p : proclets) all.push_back(GpuProcletJson(p));
  return HttpResponse::Json(
      200, JsonText(ordered_json{{"nodes", nodes}, {"proclets", all}}));
}

absl::StatusOr<HttpResponse> Api::ReclaimGpu(absl::string_view node) {
  auto moves = nodes_->gpu_directory()->Reclaim(std::string(node));
  if (!moves.ok()) return moves.status();
  ordered_json out = ordered_json::array();
  for (const auto& m : *moves) out.push_back(GpuMoveJson(m));
  return HttpResponse::Json(200, JsonText(ordered_json{{"moved", out}}));
}

absl::StatusOr<HttpResponse> Api::ReleaseGpu(absl::string_view node) {
  if (auto st = nodes_->gpu_directory()->Release(std::string(node)); !st.ok())
    return st;
  return HttpResponse::Json(
      200, JsonText(ordered_json{{"node", node}, {"reclaimed", false}}));
}

std::string GpuMetricsText(GpuDirectory& d) {
  auto esc = [](const std::string& v) {
    std::string o;
    for (char c : v) {
      if (c == '\\' || c == '"') o += '\\';
      if (c == '\n') {
        o += "\\n";
        continue;
      }
      o += c;
    }
    return o;
  };
  std::string out =
      "# HELP silt_gpu_memory_bytes A node's GPU memory (its first GPU's)\n"
      "# TYPE silt_gpu_memory_bytes gauge\n";
  for (const auto& n : d.Nodes())
    if (n.gpus > 0)
      absl::StrAppend(&out, "silt_gpu_memory_bytes{node=\"", esc(n.name),
                      "\",model=\"", esc(n.gpu_model), "\"} ", n.gpu_memory,
                      "\n");
  const auto proclets = d.List("");
  out +=
      "# HELP silt_gpu_proclet_memory_bytes Device memory a function's GPU "
      "proclet holds, as its node last reported\n"
      "# TYPE silt_gpu_proclet_memory_bytes gauge\n";
  auto labels = [&](const GpuProcletView& p) {
    return absl::StrCat("{function_name=\"", esc(p.function), ".", esc(p.ns),
                        "\",proclet=\"", esc(p.name), "\",node=\"", esc(p.node),
                        "\",backend=\"", esc(p.backend), "\"}");
  };
  for (const auto& p : proclets)
    absl::StrAppend(&out, "silt_gpu_proclet_memory_bytes", labels(p), " ",
                    p.memory_used, "\n");
  out +=
      "# HELP silt_gpu_proclet_launches Kernel launches a GPU proclet ran\n"
      "# TYPE silt_gpu_proclet_launches gauge\n";
  for (const auto& p : proclets)
    absl::StrAppend(&out, "silt_gpu_proclet_launches", labels(p), " ",
                    p.launches, "\n");
  out +=
      "# HELP silt_gpu_proclet_busy_seconds_total Time a GPU proclet's device "
      "ran its launches (a move starts a new count)\n"
      "# TYPE silt_gpu_proclet_busy_seconds_total counter\n";
  for (const auto& p : proclets)
    absl::StrAppend(&out, "silt_gpu_proclet_busy_seconds_total", labels(p), " ",
                    p.busy_ns / 1e9, "\n");
  out +=
      "# HELP silt_gpu_proclet_utilization Share of its device's time a GPU "
      "proclet's launches ran, between its node's last two reports\n"
      "# TYPE silt_gpu_proclet_utilization gauge\n";
  for (const auto& p : proclets)
    absl::StrAppend(&out, "silt_gpu_proclet_utilization", labels(p), " ",
                    p.utilization, "\n");
  out +=
      "# HELP silt_gpu_utilization Share of a node's GPU's time its proclets' "
      "launches ran\n"
      "# TYPE silt_gpu_utilization gauge\n";
  for (const auto& n : d.Nodes()) {
    if (n.gpus == 0) continue;
    absl::StrAppend(&out, "silt_gpu_utilization{node=\"", esc(n.name),
                    "\",model=\"", esc(n.gpu_model), "\"} ",
                    GpuUtilization(proclets, n.name), "\n");
  }
  out +=
      "# HELP silt_gpu_proclet_moves Moves of a GPU proclet since the "
      "gateway started\n"
      "# TYPE silt_gpu_proclet_moves gauge\n";
  for (const auto& p : proclets)
    absl::StrAppend(&out, "silt_gpu_proclet_moves", labels(p), " ", p.moves,
                    "\n");
  out +=
      "# HELP silt_gpu_proclet_last_pause_seconds How long a GPU proclet's "
      "launches were held by its last move\n"
      "# TYPE silt_gpu_proclet_last_pause_seconds gauge\n";
  for (const auto& p : proclets)
    if (p.moves > 0)
      absl::StrAppend(&out, "silt_gpu_proclet_last_pause_seconds", labels(p),
                      " ", p.last_pause_ms / 1000.0, "\n");
  return out;
}

}  // namespace silt::gateway
