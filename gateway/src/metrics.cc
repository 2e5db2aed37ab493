#include "metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace silt::gateway {
namespace {

std::string Escape(absl::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string Num(double v) { return absl::StrCat(v); }

}  // namespace

void Metrics::InvocationStarted(absl::string_view function) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = started_.find(function);
  if (it == started_.end())
    it = started_.emplace(std::string(function), 0).first;
  ++it->second;
}

void Metrics::InvocationDone(absl::string_view function, int code,
                             double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  Key k{std::string(function), std::to_string(code)};
  ++invocations_[k];
  function_seconds_[k].Observe(seconds);
}

void Metrics::HttpRequest(absl::string_view method, absl::string_view route,
                          int code, double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  std::array<std::string, 3> k{std::to_string(code), std::string(method),
                               std::string(route)};
  ++http_total_[k];
  http_seconds_[k].Observe(seconds);
}

void Metrics::Start(absl::string_view function, absl::string_view tier,
                    double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  start_seconds_[Key{std::string(function), std::string(tier)}].Observe(
      seconds);
}

void Metrics::InstanceFailure(absl::string_view function,
                              absl::string_view reason) {
  std::lock_guard<std::mutex> l(mu_);
  ++failures_[Key{std::string(function), std::string(reason)}];
}

void Metrics::MigrationDone(double seconds, double pause_seconds) {
  std::lock_guard<std::mutex> l(mu_);
  ++migrations_ok_;
  migration_seconds_.Observe(kMigrationBuckets, seconds);
  migration_pause_seconds_.Observe(kMigrationBuckets, pause_seconds);
}

void Metrics::MigrationAborted() {
  std::lock_guard<std::mutex> l(mu_);
  ++migrations_aborted_;
}

void Metrics::StateOps(absl::string_view node, uint64_t ops) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = state_ops_.find(node);
  if (it == state_ops_.end())
    it = state_ops_.emplace(std::string(node), 0).first;
  it->second += ops;
}

void Metrics::RebalanceMoves(absl::string_view kind, absl::string_view reason,
                             uint64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  rebalance_moves_[Key{std::string(kind), std::string(reason)}] += n;
}

void Metrics::LoadPulse(absl::string_view node) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pulses_.find(node);
  if (it == pulses_.end()) it = pulses_.emplace(std::string(node), 0).first;
  ++it->second;
}

void Metrics::ScaleEvent(absl::string_view function,
                         absl::string_view direction) {
  std::lock_guard<std::mutex> l(mu_);
  ++scale_events_[Key{std::string(function), std::string(direction)}];
}

void Metrics::AutoscalerState(std::map<std::string, ScaleGauge> state) {
  std::lock_guard<std::mutex> l(mu_);
  scale_gauges_ = std::move(state);
}

double Metrics::InvocationCount(absl::string_view function) const {
  std::lock_guard<std::mutex> l(mu_);
  double total = 0;
  for (auto it = invocations_.lower_bound(Key{std::string(function), ""});
       it != invocations_.end() && it->first.first == function; ++it) {
    total += static_cast<double>(it->second);
  }
  return total;
}

std::string Metrics::Render(const std::map<std::string, uint64_t>& replicas,
                            const ProcletGauges& proclets,
                            const std::vector<ResidentGauge>& resident) const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out;
  absl::StrAppend(
      &out,
      "# HELP silt_gateway_calls_total Calls sent to a node, by path: "
      "\"lease\" (straight to an instance a node on this machine lent) or "
      "\"call_port\" (through the node's invoker).\n"
      "# TYPE silt_gateway_calls_total counter\n",
      "silt_gateway_calls_total{path=\"lease\"} ",
      leased_calls_.load(std::memory_order_relaxed), "\n",
      "silt_gateway_calls_total{path=\"call_port\"} ",
      port_calls_.load(std::memory_order_relaxed), "\n");
  // `labels` may be empty (a histogram without labels).
  auto any_histogram = [&out](absl::string_view name, absl::string_view labels,
                              const auto& bounds, const auto& h) {
    std::string sep = labels.empty() ? "" : ",";
    for (size_t i = 0; i < bounds.size(); ++i) {
      absl::StrAppend(&out, name, "_bucket{", labels, sep, "le=\"",
                      Num(bounds[i]), "\"} ", h.buckets[i], "\n");
    }
    std::string braces = labels.empty() ? "" : absl::StrCat("{", labels, "}");
    absl::StrAppend(&out, name, "_bucket{", labels, sep, "le=\"+Inf\"} ",
                    h.count, "\n", name, "_sum", braces, " ", Num(h.sum), "\n",
                    name, "_count", braces, " ", h.count, "\n");
  };
  auto histogram = [&](absl::string_view name, absl::string_view labels,
                       const Histogram& h) {
    any_histogram(name, labels, kBuckets, h);
  };

  out += "# HELP gateway_function_invocation_total Function metrics\n";
  out += "# TYPE gateway_function_invocation_total counter\n";
  for (const auto& [k, v] : invocations_) {
    absl::StrAppend(&out, "gateway_function_invocation_total{code=\"", k.second,
                    "\",function_name=\"", Escape(k.first), "\"} ", v, "\n");
  }
  out += "# HELP gateway_functions_seconds Function time taken\n";
  out += "# TYPE gateway_functions_seconds histogram\n";
  for (const auto& [k, h] : function_seconds_) {
    histogram("gateway_functions_seconds",
              absl::StrCat("code=\"", k.second, "\",function_name=\"",
                           Escape(k.first), "\""),
              h);
  }
  out +=
      "# HELP gateway_function_invocation_started Function invocation "
      "started\n";
  out += "# TYPE gateway_function_invocation_started counter\n";
  for (const auto& [f, v] : started_) {
    absl::StrAppend(&out,
                    "gateway_function_invocation_started{function_name=\"",
                    Escape(f), "\"} ", v, "\n");
  }
  out +=
      "# HELP gateway_service_count Current count of replicas for function\n";
  out += "# TYPE gateway_service_count gauge\n";
  for (const auto& [f, v] : replicas) {
    absl::StrAppend(&out, "gateway_service_count{function_name=\"", Escape(f),
                    "\"} ", v, "\n");
  }
  out +=
      "# HELP gateway_service_target_replicas Replicas the autoscaler wants "
      "for function\n";
  out += "# TYPE gateway_service_target_replicas gauge\n";
  for (const auto& [f, g] : scale_gauges_)
    absl::StrAppend(&out, "gateway_service_target_replicas{function_name=\"",
                    Escape(f), "\"} ", g.target_replicas, "\n");
  out +=
      "# HELP gateway_service_load Load the autoscaler measured for function "
      "(calls/s, calls in flight or millicores, by scale type)\n";
  out += "# TYPE gateway_service_load gauge\n";
  for (const auto& [f, g] : scale_gauges_)
    absl::StrAppend(&out, "gateway_service_load{function_name=\"", Escape(f),
                    "\",scale_type=\"", g.type, "\"} ", Num(g.load), "\n");
  out +=
      "# HELP gateway_service_scale_events_total Autoscaler changes of "
      "function replicas, by direction (up, down, zero)\n";
  out += "# TYPE gateway_service_scale_events_total counter\n";
  for (const auto& [k, v] : scale_events_)
    absl::StrAppend(&out, "gateway_service_scale_events_total{direction=\"",
                    k.second, "\",function_name=\"", Escape(k.first), "\"} ", v,
                    "\n");
  out +=
      "# HELP silt_function_start_seconds Start cost of the instance that "
      "served a call, by tier\n";
  out += "# TYPE silt_function_start_seconds histogram\n";
  for (const auto& [k, h] : start_seconds_) {
    histogram("silt_function_start_seconds",
              absl::StrCat("function_name=\"", Escape(k.first), "\",tier=\"",
                           k.second, "\""),
              h);
  }
  out +=
      "# HELP silt_instance_failures_total Instances that died serving a call, "
      "by reason\n";
  out += "# TYPE silt_instance_failures_total counter\n";
  for (const auto& [k, v] : failures_) {
    absl::StrAppend(&out, "silt_instance_failures_total{function_name=\"",
                    Escape(k.first), "\",reason=\"", k.second, "\"} ", v, "\n");
  }
  out +=
      "# HELP silt_snapshot_resident_bytes Memory a function's staged "
      "restorer and fork template hold on a node ahead of cold starts\n"
      "# TYPE silt_snapshot_resident_bytes gauge\n";
  for (const auto& g : resident)
    absl::StrAppend(&out, "silt_snapshot_resident_bytes{function_name=\"",
                    Escape(g.function), "\",node=\"", Escape(g.node), "\"} ",
                    g.bytes, "\n");
  // ---- memory proclets ----
  out += "# HELP silt_proclets Memory proclets (shards) held by a node\n";
  out += "# TYPE silt_proclets gauge\n";
  for (const auto& n : proclets.nodes)
    absl::StrAppend(&out, "silt_proclets{node=\"", Escape(n.name), "\"} ",
                    n.proclets, "\n");
  out +=
      "# HELP silt_proclet_bytes Arena bytes of the memory proclets a node "
      "holds\n";
  out += "# TYPE silt_proclet_bytes gauge\n";
  for (const auto& n : proclets.nodes)
    absl::StrAppend(&out, "silt_proclet_bytes{node=\"", Escape(n.name), "\"} ",
                    n.bytes, "\n");
  out +=
      "# HELP silt_proclet_shards Shards in the proclet directory, by "
      "state\n";
  out += "# TYPE silt_proclet_shards gauge\n";
  for (const char* state : {"active", "migrating", "lost"}) {
    auto it = proclets.shards_by_state.find(state);
    absl::StrAppend(&out, "silt_proclet_shards{state=\"", state, "\"} ",
                    it == proclets.shards_by_state.end() ? 0 : it->second,
                    "\n");
  }
  out +=
      "# HELP silt_proclet_migrations_total Live proclet migrations, by "
      "outcome (aborted: the proclet stayed where it was)\n";
  out += "# TYPE silt_proclet_migrations_total counter\n";
  absl::StrAppend(&out, "silt_proclet_migrations_total{outcome=\"ok\"} ",
                  migrations_ok_, "\n",
                  "silt_proclet_migrations_total{outcome=\"aborted\"} ",
                  migrations_aborted_, "\n");
  out +=
      "# HELP silt_proclet_migration_seconds Time a committed proclet "
      "migration took, pre-copy included\n";
  out += "# TYPE silt_proclet_migration_seconds histogram\n";
  any_histogram("silt_proclet_migration_seconds", "", kMigrationBuckets,
                migration_seconds_);
  out +=
      "# HELP silt_proclet_migration_pause_seconds Time a committed proclet "
      "migration held writes\n";
  out += "# TYPE silt_proclet_migration_pause_seconds histogram\n";
  any_histogram("silt_proclet_migration_pause_seconds", "", kMigrationBuckets,
                migration_pause_seconds_);
  out +=
      "# HELP silt_proclet_ops_total State operations served by the proclets "
      "of a node\n";
  out += "# TYPE silt_proclet_ops_total counter\n";
  for (const auto& [node, v] : state_ops_)
    absl::StrAppend(&out, "silt_proclet_ops_total{node=\"", Escape(node),
                    "\"} ", v, "\n");
  out +=
      "# HELP silt_rebalance_moves_total Pieces the rebalancer moved, by kind "
      "(memory, compute, instance, gpu) and reason (cpu-high, memory-high, "
      "gpu-room, gpu-wanted)\n";
  out += "# TYPE silt_rebalance_moves_total counter\n";
  for (const auto& [k, v] : rebalance_moves_)
    absl::StrAppend(&out, "silt_rebalance_moves_total{kind=\"", Escape(k.first),
                    "\",reason=\"", Escape(k.second), "\"} ", v, "\n");
  out +=
      "# HELP silt_load_pulses_total Compact load reports received from a "
      "node between its full reports\n";
  out += "# TYPE silt_load_pulses_total counter\n";
  for (const auto& [node, v] : pulses_)
    absl::StrAppend(&out, "silt_load_pulses_total{node=\"", Escape(node),
                    "\"} ", v, "\n");
  out += "# HELP provider_http_requests_total Total HTTP requests processed\n";
  out += "# TYPE provider_http_requests_total counter\n";
  for (const auto& [k, v] : http_total_) {
    absl::StrAppend(&out, "provider_http_requests_total{code=\"", k[0],
                    "\",method=\"", k[1], "\",path=\"", Escape(k[2]), "\"} ", v,
                    "\n");
  }
  out +=
      "# HELP provider_http_request_duration_seconds Seconds spent serving "
      "HTTP requests\n";
  out += "# TYPE provider_http_request_duration_seconds histogram\n";
  for (const auto& [k, h] : http_seconds_) {
    histogram("provider_http_request_duration_seconds",
              absl::StrCat("code=\"", k[0], "\",method=\"", k[1], "\",path=\"",
                           Escape(k[2]), "\""),
              h);
  }
  return out;
}

}  // namespace silt::gateway
