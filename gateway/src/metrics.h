// Prometheus metrics with the OpenFaaS gateway's names, written in the text
// exposition format by hand (Debian ships no prometheus-cpp).
#ifndef SILT_GATEWAY_METRICS_H_
#define SILT_GATEWAY_METRICS_H_

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace silt::gateway {

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

  // The exposition text. `replicas` fills gateway_service_count.
  std::string Render(const std::map<std::string, uint64_t>& replicas) const;

 private:
  static constexpr std::array<double, 11> kBuckets = {
      0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> buckets{};
    uint64_t count = 0;
    double sum = 0;
    void Observe(double v);
  };
  using Key = std::pair<std::string, std::string>;

  mutable std::mutex mu_;
  std::map<std::string, uint64_t, std::less<>> started_;
  std::map<Key, uint64_t> invocations_;        // (function, code)
  std::map<Key, Histogram> function_seconds_;  // (function, code)
  std::map<std::array<std::string, 3>, uint64_t>
      http_total_;  // code, method, path
  std::map<std::array<std::string, 3>, Histogram> http_seconds_;
  std::map<Key, Histogram> start_seconds_;  // (function, tier)
  std::map<Key, uint64_t> failures_;        // (function, reason)
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_METRICS_H_
