#include "common/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace silt::testing {
namespace {

std::vector<char*> CArgs(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

void ReadAllFd(int fd, std::string* out) {
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) out->append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

absl::StatusOr<Process> Process::Start(
    const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& env) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  auto args = CArgs(argv);
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execv(args[0], args.data());
    fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  Process p;
  p.pid_ = pid;
  p.out_fd_ = fds[0];
  return p;
}

Process& Process::operator=(Process&& o) noexcept {
  std::swap(pid_, o.pid_);
  std::swap(out_fd_, o.out_fd_);
  std::swap(output_, o.output_);
  std::swap(consumed_, o.consumed_);
  return *this;
}

Process::~Process() {
  if (pid_ > 0) Stop(SIGKILL);
  if (out_fd_ >= 0) close(out_fd_);
}

absl::StatusOr<std::string> Process::WaitForLine(
    absl::string_view prefix, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    size_t nl;
    while ((nl = output_.find('\n', consumed_)) != std::string::npos) {
      std::string line = output_.substr(consumed_, nl - consumed_);
      consumed_ = nl + 1;
      if (absl::StartsWith(line, prefix)) return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return absl::DeadlineExceededError(
          absl::StrCat("no line \"", prefix, "\" in: ", output_));
    pollfd pfd{out_fd_, POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n <= 0)
      return absl::UnavailableError(
          absl::StrCat("process exited; output: ", output_));
    output_.append(buf, static_cast<size_t>(n));
  }
}

int Process::Stop(int sig) {
  if (pid_ <= 0) return -1;
  kill(pid_, sig);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return status;
}

RunResult RunCommand(
    const std::vector<std::string>& argv, const std::string& input,
    const std::vector<std::pair<std::string, std::string>>& env) {
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC))
    return {};
  auto args = CArgs(argv);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  std::thread writer([&] {
    size_t off = 0;
    while (off < input.size()) {
      ssize_t n = write(in[1], input.data() + off, input.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    close(in[1]);
  });
  RunResult r;
  std::thread err_reader([&] { ReadAllFd(err[0], &r.err); });
  ReadAllFd(out[0], &r.out);
  err_reader.join();
  writer.join();
  close(out[0]);
  close(err[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  char* d = mkdtemp(tmpl.data());
  return d != nullptr ? std::string(d) : std::string();
}

RunResult BuildProbe(const std::string& prefix, std::string* dir) {
  *dir = MakeTempDir(prefix);
  std::ofstream(*dir + "/stack.yml")
      << "version: 1.0\nprovider:\n  name: openfaas\n"
      << "functions:\n  probe:\n    lang: cpp\n"
      << "    handler: " << SILT_SOURCE_DIR
      << "/tests/functions/probe\n    image: probe\n";
  return RunCommand({SILT_CLI_BIN, "build", "-f", *dir + "/stack.yml"});
}

bool Eventually(const std::function<bool()>& cond,
                std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

}  // namespace silt::testing
