// The autoscaler: a function's replicas (the warm instances the nodes keep)
// follow its load between com.openfaas.scale.min and .max, the way OpenFaaS
// Pro's autoscaler does, and go to zero after com.openfaas.scale.zero-duration
// without calls when com.openfaas.scale.zero=true.
//
// Every interval it samples each function's load (calls started, calls in
// flight, CPU of its instances), averages it over a window and wants
//   ceil(load / (target * target-proportion))
// replicas, never fewer than the user's own count (the min label at deploy,
// or what /system/scale-function last set) and never more than max. More
// replicas are asked for at once; fewer only once the load has stayed low for
// the scale-down delay (the highest count wanted over that delay wins). Each
// change is a line in the function's logs, a metric and a key in the store
// (so a restarted gateway keeps the replicas it had).
//
// Only functions that carry a scaling label (type, target, target-proportion,
// max, zero or zero-duration) are scaled; others keep the user's count.
#ifndef SILT_GATEWAY_AUTOSCALER_H_
#define SILT_GATEWAY_AUTOSCALER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "metrics.h"
#include "nodes.h"
#include "store/store.h"

namespace silt::gateway {

// com.openfaas.scale.type: what "load" means.
enum class ScaleType {
  kRps,       // calls started per second
  kCapacity,  // calls in flight
  kCpu,       // CPU of the function's instances, in millicores
};
absl::string_view ScaleTypeName(ScaleType t);

// A function's scaling labels, with OpenFaaS Pro's defaults.
struct ScalePolicy {
  bool autoscaled = false;  // some scaling label is set (min alone is not)
  ScaleType type = ScaleType::kRps;
  double target = 50;        // load one replica takes (per second, in flight,
                             // or millicores)
  double proportion = 0.90;  // scale once load passes this share of target
  uint64_t min = 1;
  uint64_t max = 20;
  bool zero = false;
  absl::Duration zero_duration = absl::Minutes(15);
};

// Reads the com.openfaas.scale.* labels. InvalidArgument names the label whose
// value is malformed (a type other than rps, capacity or cpu, a target that is
// not a positive number, a proportion outside (0, 1], a zero-duration that is
// not a Go duration such as "90s" or "15m").
absl::StatusOr<ScalePolicy> ParseScalePolicy(
    const std::map<std::string, std::string>& labels);

// Replicas that take `load` (summed over the function's replicas):
// ceil(load / (target * proportion)), capped at max; 0 without load.
uint64_t ReplicasFor(const ScalePolicy& p, double load);

struct AutoscalerOptions {
  // How often load is sampled and decisions are made. Zero: no thread of its
  // own; the owner calls Tick().
  absl::Duration interval = absl::Seconds(1);
  // Load is averaged over this long.
  absl::Duration window = absl::Seconds(10);
  // Replicas go down only after the load has wanted fewer for this long.
  absl::Duration scale_down_delay = absl::Minutes(1);
  // The clock; absl::Now when empty (tests drive their own).
  std::function<absl::Time()> now;

  // InvalidArgument for a negative interval or delay, or a window that is not
  // positive.
  absl::Status Validate() const;
};

// Thread-safe. Owns its decision state and its thread (joined by the
// destructor); the store and metrics outlive it.
class Autoscaler {
 public:
  struct Hooks {
    // Every deployed function with its load counters (NodeRegistry).
    std::function<std::vector<FunctionLoad>()> loads;
    // The replicas the nodes keep for the function from now on; nullopt: the
    // user's count again.
    std::function<void(const std::string& ns, const std::string& name,
                       std::optional<uint64_t> replicas)>
        set_desired;
    // A line in the function's logs.
    std::function<void(const std::string& ns, const std::string& name,
                       const std::string& text)>
        log;
  };

  // Restores the decisions kept in `store` (handing each to set_desired) and
  // starts ticking. InvalidArgument for bad options; a store error if the
  // kept decisions cannot be read.
  static absl::StatusOr<std::unique_ptr<Autoscaler>> Start(
      const AutoscalerOptions& options, Hooks hooks, store::Store* store,
      Metrics* metrics);
  ~Autoscaler();

  // One round now: sample, decide, apply. Called by the thread every
  // interval; tests with interval zero call it themselves.
  void Tick();
  // The replicas it has decided for the function, if it scales it.
  std::optional<uint64_t> Desired(const std::string& ns,
                                  const std::string& name) const;

 private:
  struct Impl;
  explicit Autoscaler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_AUTOSCALER_H_
