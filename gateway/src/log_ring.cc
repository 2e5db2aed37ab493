#include "log_ring.h"

#include "absl/time/clock.h"

namespace silt::gateway {

void LogRing::Append(const std::string& ns, const std::string& name,
                     const std::string& text) {
  absl::MutexLock l(&mu_);
  lines_.push_back({next_seq_++, ns, name, text, absl::GetCurrentTimeNanos()});
  while (lines_.size() > capacity_) lines_.pop_front();
}

std::vector<LogRing::Line> LogRing::Read(const std::string& ns,
                                         const std::string& name,
                                         uint64_t after, int64_t since) const {
  absl::MutexLock l(&mu_);
  std::vector<Line> out;
  for (const Line& line : lines_) {
    if (line.seq <= after || line.timestamp_unix_nanos < since) continue;
    if (line.ns == ns && line.name == name) out.push_back(line);
  }
  return out;
}

}  // namespace silt::gateway
