#include "load_pulse.h"

#include <algorithm>
#include <cmath>

namespace silt::invoker {

std::optional<control::Pulse> LoadPulse::Next(const Sample& s, bool force) {
  // An instance cgroup went away and took its CPU time with it: the split
  // between ours and foreign is unknown across that; start a new window.
  if (!samples_.empty() &&
      s.instances_cpu_nanos < samples_.back().instances_cpu_nanos)
    samples_.clear();
  samples_.push_back(s);
  while (samples_.size() > 2 && s.at - samples_[1].at >= window_)
    samples_.pop_front();
  const Sample& first = samples_.front();
  double secs = std::chrono::duration<double>(s.at - first.at).count();
  // Never over less than a window (after a new one started above, the first
  // samples are too close together to say anything).
  if (samples_.size() < 2 || s.at - first.at < window_) return std::nullopt;
  control::Pulse p;
  uint64_t total = s.cpu_nanos - std::min(s.cpu_nanos, first.cpu_nanos);
  uint64_t ours = s.instances_cpu_nanos -
                  std::min(s.instances_cpu_nanos, first.instances_cpu_nanos);
  p.set_cpu_used(total / 1e9 / secs);
  p.set_cpu_foreign(total > ours ? (total - ours) / 1e9 / secs : 0);
  p.set_memory_used(s.memory_used);
  p.set_tasks(s.tasks);
  p.set_busy(s.busy);
  p.set_cores(s.cores);
  if (last_ && !force && change_ > 0) {
    bool moved =
        p.tasks() != last_->tasks() || p.busy() != last_->busy() ||
        p.cores() != last_->cores() ||
        std::abs(p.cpu_used() - last_->cpu_used()) > change_ * s.cores ||
        std::abs(p.cpu_foreign() - last_->cpu_foreign()) > change_ * s.cores ||
        std::abs(static_cast<double>(p.memory_used()) -
                 static_cast<double>(last_->memory_used())) >
            change_ * static_cast<double>(s.memory);
    if (!moved) return std::nullopt;
  }
  last_ = p;
  return p;
}

}  // namespace silt::invoker
