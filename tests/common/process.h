// Child processes for integration tests: start real binaries, read their output
// with a deadline, stop them.
#ifndef SILT_TESTS_COMMON_PROCESS_H_
#define SILT_TESTS_COMMON_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::testing {

class Process {
 public:
  // Starts `argv` with `env` added to this process's environment; stdout is
  // piped to the test, stderr goes to the test's stderr.
  static absl::StatusOr<Process> Start(
      const std::vector<std::string>& argv,
      const std::vector<std::pair<std::string, std::string>>& env = {});
  Process() = default;
  Process(Process&& o) noexcept { *this = std::move(o); }
  Process& operator=(Process&& o) noexcept;
  ~Process();

  // Reads stdout lines until one starts with `prefix`; returns that line.
  absl::StatusOr<std::string> WaitForLine(absl::string_view prefix,
                                          std::chrono::milliseconds timeout);
  // Sends `sig` and waits for the exit; returns the wait status.
  int Stop(int sig);
  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string output_;  // everything read so far
  size_t consumed_ = 0;
};

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs a command to completion with `input` on stdin.
RunResult RunCommand(
    const std::vector<std::string>& argv, const std::string& input = "",
    const std::vector<std::pair<std::string, std::string>>& env = {});

std::string MakeTempDir(const std::string& prefix);

// Builds the probe function (tests/functions/probe) with the CLI in a new
// temporary directory named after `prefix`: its stack.yml is `dir`/stack.yml,
// ready for `silt push -f`. The result of `silt build` (exit code, output)
// says whether it worked; *dir is set either way.
RunResult BuildProbe(const std::string& prefix, std::string* dir);

// Polls `cond` every 10 ms until it holds or `timeout` passes; the final
// answer of `cond`. The only waiting tests do: on state the daemons change in
// the background (load reports, idle reaping, snapshots).
bool Eventually(const std::function<bool()>& cond,
                std::chrono::milliseconds timeout = std::chrono::seconds(20));

}  // namespace silt::testing

#endif  // SILT_TESTS_COMMON_PROCESS_H_
