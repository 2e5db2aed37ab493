// The fast half of a node's load reporting: sampled every few milliseconds,
// sent to the gateway (between full reports) only when a figure moved enough
// to matter to placement, so an idle or steady node costs nearly nothing and
// a load shift reaches the rebalancer within one sampling tick.
#ifndef SILT_INVOKER_LOAD_PULSE_H_
#define SILT_INVOKER_LOAD_PULSE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>

#include "gateway/proto/control.pb.h"

namespace silt::invoker {

namespace control = ::silt::control::v1;

class LoadPulse {
 public:
  using Clock = std::chrono::steady_clock;

  struct Sample {
    Clock::time_point at;
    uint64_t cpu_nanos = 0;            // the node cgroup's cumulative CPU time
    uint64_t instances_cpu_nanos = 0;  // of which its instances' cgroups
    uint64_t memory_used = 0;          // bytes
    uint64_t memory = 0;               // capacity, bytes
    uint32_t cores = 0;
    uint32_t tasks = 0, busy = 0;
  };

  // `change`: the fraction of capacity (cores, memory) a figure must move by
  // before it is worth a pulse; 0 sends every sample. CPU use is averaged
  // over `window` (a few sampling ticks: one tick alone is mostly noise).
  LoadPulse(double change, std::chrono::milliseconds window)
      : change_(change), window_(window) {}

  // The pulse to send for this sample, if any (with `force`, whenever there
  // are two samples to compare: after each full report, so that the gateway
  // holds the current figures, not the report's averages).
  std::optional<control::Pulse> Next(const Sample& s, bool force = false);

 private:
  double change_;
  std::chrono::milliseconds window_;
  std::deque<Sample> samples_;
  std::optional<control::Pulse> last_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_LOAD_PULSE_H_
