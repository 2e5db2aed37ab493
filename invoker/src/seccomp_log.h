// The kernel's record of processes killed by a seccomp filter (audit records
// of type 1326 in /dev/kmsg), for deaths whose wait status the invoker never
// sees: clones forked by a template or restored by a restorer are children
// of a process inside their sandbox, so all the invoker learns is that they
// are gone. With this it can still say "forbidden system call" instead of
// "killed".
//
// Thread safety: thread-safe. Owns a reader thread and the records it keeps
// (the last kMaxRecords).
#ifndef SILT_INVOKER_SECCOMP_LOG_H_
#define SILT_INVOKER_SECCOMP_LOG_H_

#include <sys/types.h>

#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace silt::invoker {

class SeccompLog {
 public:
  // Starts reading /dev/kmsg from its end. Unavailable without access to it.
  static absl::StatusOr<std::unique_ptr<SeccompLog>> Start();
  ~SeccompLog();
  SeccompLog(const SeccompLog&) = delete;
  SeccompLog& operator=(const SeccompLog&) = delete;

  // The system call that got process `pid` (a host pid) killed, if the
  // kernel logs it within `wait` (its record may trail the death a little).
  std::optional<int> KilledBy(pid_t pid, absl::Duration wait);

 private:
  static constexpr size_t kMaxRecords = 256;
  SeccompLog(int kmsg, int wake);
  void ReadLoop();

  const int kmsg_, wake_;
  std::thread reader_;
  absl::Mutex mu_;
  std::deque<std::pair<pid_t, int>> kills_ ABSL_GUARDED_BY(mu_);  // pid, nr
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_SECCOMP_LOG_H_
