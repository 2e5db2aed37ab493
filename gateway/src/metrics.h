// Prometheus metrics with the OpenFaaS gateway's names, written in the text
// exposition format by hand (Debian ships no prometheus-cpp).
#ifndef SILT_GATEWAY_METRICS_H_
#define SILT_GATEWAY_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace silt::gateway {

// Memory proclets as they are when the metrics are scraped (gauges).
struct ProcletGauges {
  struct Node {
    std::string name;
    uint64_t proclets = 0;  // shards held, as last reported
    uint64_t bytes = 0;
  };
  std::vector<Node> nodes;
  std::map<std::string, uint64_t> shards_by_state;  // active, migrating, lost
};

// What a function's staged restorer and fork template hold resident on a
// node, as the node last reported it.
struct ResidentGauge {
  std::string function;  // name.namespace
  std::string node;
  uint64_t bytes = 0;
};

// One function as the autoscaler last saw it.
struct ScaleGauge {
  uint64_t target_replicas = 0;
  double load = 0;   // in the unit of its scale type
  std::string type;  // rps, capacity, cpu
};

// Thread-safe; counters only grow for the life of the gateway.
class Metrics {
 public:
  // `function` is "name.namespace", as OpenFaaS labels it.
  void InvocationStarted(absl::string_view function);
  void InvocationDone(absl::string_view function, int code, double seconds);
  void HttpRequest(absl::string_view method, absl::string_view route, int code,
                   double seconds);
  double InvocationCount(absl::string_view function) const;
  // How an instance came to serve a call (warm, boot; fork, restore with
  // snapshots) and what that start cost; instances that died serving a call
  // (oom, seccomp, crash).
  void Start(absl::string_view function, absl::string_view tier,
             double seconds);
  void InstanceFailure(absl::string_view function, absl::string_view reason);

  // A call went to a node: straight to an instance leased from it
  // (`leased`, instance_leases.h) or through its call port.
  void CallPath(bool leased) {
    (leased ? leased_calls_ : port_calls_)
        .fetch_add(1, std::memory_order_relaxed);
  }

  // A live proclet migration committed after `seconds`, holding writes for
  // `pause_seconds` of them; or one that was abandoned (the proclet stayed
  // where it was).
  void MigrationDone(double seconds, double pause_seconds);
  void MigrationAborted();
  // `ops` more state operations were served by proclets on `node`.
  void StateOps(absl::string_view node, uint64_t ops);

  // The rebalancer moved `n` pieces of `kind` (memory, compute, instance)
  // because of `reason` (cpu-high, memory-high).
  void RebalanceMoves(absl::string_view kind, absl::string_view reason,
                      uint64_t n);
  // A node's load pulse arrived (between full reports).
  void LoadPulse(absl::string_view node);

  // The autoscaler changed a function's replicas (direction up, down, zero).
  void ScaleEvent(absl::string_view function, absl::string_view direction);
  // The autoscaled functions at its last round, by "name.namespace".
  void AutoscalerState(std::map<std::string, ScaleGauge> state);

  // The exposition text. `replicas` fills gateway_service_count, `proclets`
  // the proclet gauges, `resident` silt_snapshot_resident_bytes.
  std::string Render(const std::map<std::string, uint64_t>& replicas,
                     const ProcletGauges& proclets = {},
                     const std::vector<ResidentGauge>& resident = {}) const;

 private:
  static constexpr std::array<double, 11> kBuckets = {
      0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  // Migrations take milliseconds and hold writes for less.
  static constexpr std::array<double, 14> kMigrationBuckets = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,  0.05,    0.1,    0.25,  0.5,    1,     5};
  template <size_t N>
  struct BasicHistogram {
    std::array<uint64_t, N> buckets{};
    uint64_t count = 0;
    double sum = 0;
    void Observe(const std::array<double, N>& bounds, double v) {
      for (size_t i = 0; i < N; ++i)
        if (v <= bounds[i]) ++buckets[i];
      ++count;
      sum += v;
    }
  };
  struct Histogram : BasicHistogram<kBuckets.size()> {
    void Observe(double v) { BasicHistogram::Observe(kBuckets, v); }
  };
  using MigrationHistogram = BasicHistogram<kMigrationBuckets.size()>;
  using Key = std::pair<std::string, std::string>;

  std::atomic<uint64_t> leased_calls_{0}, port_calls_{0};
  mutable std::mutex mu_;
  std::map<std::string, uint64_t, std::less<>> started_;
  std::map<Key, uint64_t> invocations_;        // (function, code)
  std::map<Key, Histogram> function_seconds_;  // (function, code)
  std::map<std::array<std::string, 3>, uint64_t>
      http_total_;  // code, method, path
  std::map<std::array<std::string, 3>, Histogram> http_seconds_;
  std::map<Key, Histogram> start_seconds_;  // (function, tier)
  std::map<Key, uint64_t> failures_;        // (function, reason)
  uint64_t migrations_ok_ = 0, migrations_aborted_ = 0;
  MigrationHistogram migration_seconds_, migration_pause_seconds_;
  std::map<std::string, uint64_t, std::less<>> state_ops_;  // by node
  std::map<Key, uint64_t> rebalance_moves_;                 // (kind, reason)
  std::map<std::string, uint64_t, std::less<>> pulses_;     // by node
  std::map<Key, uint64_t> scale_events_;  // (function, direction)
  std::map<std::string, ScaleGauge> scale_gauges_;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_METRICS_H_
