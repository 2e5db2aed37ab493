// Lines the gateway itself writes into functions' logs (the autoscaler's
// decisions): kept in memory, merged by NodeRegistry::Logs with the lines
// the nodes hold, so `silt logs NAME` shows them beside the function's own.
#ifndef SILT_GATEWAY_LOG_RING_H_
#define SILT_GATEWAY_LOG_RING_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace silt::gateway {

// Thread-safe. Holds the last `capacity` lines of all functions together.
class LogRing {
 public:
  struct Line {
    uint64_t seq = 0;  // increasing from 1, for followers
    std::string ns, name, text;
    int64_t timestamp_unix_nanos = 0;
  };

  explicit LogRing(size_t capacity = 4096) : capacity_(capacity) {}

  // Appends a line for the function, stamped now.
  void Append(const std::string& ns, const std::string& name,
              const std::string& text);
  // The function's lines with seq > `after` and a timestamp at or after
  // `since` (unix nanos), oldest first.
  std::vector<Line> Read(const std::string& ns, const std::string& name,
                         uint64_t after, int64_t since) const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<Line> lines_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_LOG_RING_H_
