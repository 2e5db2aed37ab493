#include "local_cmd.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli_common.h"
#include "deploy/config.h"

namespace silt::deploy {
namespace {

using nlohmann::json;

// A daemon binary installed beside this one, or in the build tree.
std::string FindDaemon(const char* name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  fs::path bindir = self.parent_path();
  for (fs::path p : {bindir / name, bindir.parent_path() / "gateway" / name,
                     bindir.parent_path() / "invoker" / name}) {
    if (fs::exists(p)) return p.string();
  }
  Fail(absl::StrCat("cannot find ", name, " next to ", self.string()));
}

struct Child {
  pid_t pid = -1;
  int out = -1;  // its stdout
};

// Starts `args` with `blocked` unblocked again and its stdout on a pipe.
Child Spawn(std::vector<std::string> args, const sigset_t& blocked) {
  int p[2];
  if (pipe(p) != 0) Fail("pipe failed");
  pid_t pid = fork();
  if (pid == 0) {
    sigprocmask(SIG_UNBLOCK, &blocked, nullptr);
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    std::vector<char*> a;
    for (auto& s : args) a.push_back(s.data());
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  close(p[1]);
  return Child{pid, p[0]};
}

// Reads `fd` until a line starting with `prefix` and returns the rest of it;
// echoes every other line. Empty if the child closed its stdout first.
std::string WaitLine(int fd, const std::string& prefix) {
  std::string buf;
  char c;
  while (read(fd, &c, 1) == 1) {
    if (c != '\n') {
      buf.push_back(c);
      continue;
    }
    if (absl::StartsWith(buf, prefix)) return buf.substr(prefix.size());
    std::cout << buf << std::endl;
    buf.clear();
  }
  return "";
}

void StopChildren(std::initializer_list<pid_t> children) {
  for (pid_t pid : children) kill(pid, SIGTERM);
  for (pid_t pid : children) waitpid(pid, nullptr, 0);
}

// Polls the gateway until a node is registered (at most ~5 s).
void WaitRegistered(const LocalOptions& o, const std::string& http_addr) {
  for (int i = 0; i < 500; ++i) {
    HttpCall call;
    call.url = "http://" + http_addr + "/system/nodes";
    if (!o.no_auth) {
      std::ifstream in(o.data_dir + "/gateway/secrets/basic-auth-password");
      call.headers.emplace_back(
          "Authorization",
          "Basic " + BasicToken("admin", Trimmed(ReadAll(in))));
    }
    auto r = Send(call);
    if (r.ok() && r->status == 200 && r->body != "[]") return;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
}

}  // namespace

// `silt local`: a gateway and one invoker on this machine, as child processes.
// The invoker learns the gateway's gRPC address from the gateway's output, so
// every port but --listen's may be 0.
int Local(LocalOptions o) {
  std::string gateway_bin = FindDaemon("silt-gateway"),
              invoker_bin = FindDaemon("silt-invoker");
  std::string host = o.listen.substr(0, o.listen.rfind(':'));
  if (o.grpc_listen.empty()) o.grpc_listen = host + ":0";
  if (o.metrics_listen.empty()) o.metrics_listen = host + ":0";

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGCHLD);
  sigprocmask(SIG_BLOCK, &stop, nullptr);

  std::vector<std::string> gw_args = {
      gateway_bin,        "--listen",       o.listen,
      "--metrics-listen", o.metrics_listen, "--grpc-listen",
      o.grpc_listen,      "--data-dir",     o.data_dir + "/gateway"};
  if (o.no_auth) gw_args.push_back("--no-auth");
  if (o.no_instance_leases) gw_args.push_back("--no-instance-leases");
  if (!o.provider_listen.empty())
    gw_args.insert(gw_args.end(), {"--provider-listen", o.provider_listen});
  Child gw = Spawn(gw_args, stop);
  std::string grpc_addr = WaitLine(gw.out, "invokers connect to ");
  std::string provider_addr = grpc_addr.empty() || o.provider_listen.empty()
                                  ? ""
                                  : WaitLine(gw.out, "faas-provider API on ");
  std::string http_addr =
      grpc_addr.empty() ? "" : WaitLine(gw.out, "listening on ");
  if (http_addr.empty()) {
    StopChildren({gw.pid});
    Fail("silt-gateway did not start (see its messages above)");
  }
  Child inv =
      Spawn({invoker_bin, "--gateway", grpc_addr, "--listen", host + ":0",
             "--data-dir", o.data_dir + "/invoker", "--node-name", "local"},
            stop);
  std::string inv_addr = WaitLine(inv.out, "listening on ");
  if (inv_addr.empty()) {
    StopChildren({gw.pid, inv.pid});
    Fail("silt-invoker did not start (see its messages above)");
  }
  WaitRegistered(o, http_addr);
  if (!provider_addr.empty())
    std::cout << "faas-provider API on " << provider_addr << "\n";
  std::cout << "invoker " << inv_addr << " registered\nlistening on "
            << http_addr << std::endl;
  int sig = 0;
  sigwait(&stop, &sig);
  StopChildren({inv.pid, gw.pid});
  std::cout << "stopped" << std::endl;
  return sig == SIGCHLD ? 1 : 0;
}

}  // namespace silt::deploy
