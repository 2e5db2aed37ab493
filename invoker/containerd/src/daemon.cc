#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "containerd/containerd.h"

namespace silt::containerd {
namespace {

constexpr char kBinary[] = "/usr/bin/containerd";

// Whether `pid` runs containerd (a pid file can outlive its process, and the
// pid be taken by another).
bool IsContainerd(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/comm"));
  std::string comm;
  std::getline(in, comm);
  return comm == "containerd";
}

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > 800 ? s.substr(s.size() - 800) : s;
}

}  // namespace

Daemon::Daemon(std::string dir, std::string socket, pid_t pid)
    : dir_(std::move(dir)), socket_(std::move(socket)), pid_(pid) {}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const std::string& dir) {
  if (access(kBinary, X_OK) != 0)
    return absl::NotFoundError(absl::StrCat("containerd is not installed (",
                                            kBinary, "): run deploy/setup.sh"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::string socket = dir + "/containerd.sock";
  std::string pid_file = dir + "/containerd.pid";
  // One already serving here (an invoker that restarted) is adopted.
  {
    std::ifstream in(pid_file);
    std::string line;
    pid_t old = 0;
    if (std::getline(in, line) && absl::SimpleAtoi(line, &old) && old > 0 &&
        IsContainerd(old) &&
        Client::Connect(socket, "silt", std::chrono::seconds(2)).ok())
      return std::unique_ptr<Daemon>(new Daemon(dir, socket, old));
  }
  std::ofstream(dir + "/config.toml")
      << "version = 2\n"
      << "root = \"" << dir << "/root\"\n"
      << "state = \"" << dir << "/state\"\n"
      << "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"
      << "[grpc]\n  address = \"" << socket << "\"\n"
      << "[ttrpc]\n  address = \"" << socket << ".ttrpc\"\n";
  std::string log = dir + "/containerd.log";
  int log_fd =
      open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd < 0) return absl::InternalError("cannot open " + log);
  std::string config = dir + "/config.toml";
  pid_t pid = fork();
  if (pid == 0) {
    setsid();  // its own session: the invoker's terminal signals are not its
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    execl(kBinary, kBinary, "--config", config.c_str(), nullptr);
    _exit(127);
  }
  close(log_fd);
  if (pid < 0) return absl::InternalError("cannot fork containerd");
  std::ofstream(pid_file) << pid << "\n";
  auto daemon = std::unique_ptr<Daemon>(new Daemon(dir, socket, pid));
  // Ready once it answers; a containerd that exits first says why in its
  // log.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    auto c = Client::Connect(socket, "silt", std::chrono::milliseconds(200));
    if (c.ok() && (*c)->Version().ok()) return daemon;
    if (!daemon->Alive())
      return absl::UnavailableError(
          absl::StrCat("containerd exited at start: ", Tail(log)));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("containerd did not answer within 30 s: ", Tail(log)));
}

bool Daemon::Alive() const {
  int status;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) return false;                              // our child, exited
  if (r < 0 && errno == ECHILD) return IsContainerd(pid_);  // adopted
  return r == 0;
}

Daemon::~Daemon() {
  if (!Alive()) return;
  kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Alive() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (Alive()) kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  unlink((dir_ + "/containerd.pid").c_str());
}

}  // namespace silt::containerd
