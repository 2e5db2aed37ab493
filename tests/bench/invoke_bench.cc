// Warm invocation benchmark: throughput and p50/p99 latency of POST
// /function/hello through Silt (gateway -> sandboxed worker, on instances the
// invoker lends the gateway; and, as `silt-call-port`, a second `silt local`
// with --no-instance-leases: gateway -> invoker -> worker), against two
// baselines measured in the same run: a minimal HTTP server
// returning the same body (the physical limit on this machine) and one nginx
// reverse-proxy hop in front of it (the cost of a single hop).
//
//   sudo build/tests/bench/bench_invoke [--seconds 3] [--concurrency 1,32]
//
// Prints a table and ratio lines (silt / nginx), then where a call's cost
// goes: CPU time, context switches and (with perf installed) instructions per
// call in each process on the path, for Silt and for the nginx hop. Needs root
// (instances run sandboxed) and nginx (deploy/setup.sh installs nginx-light).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/http_load.h"
#include "common/process.h"

namespace {

using Clock = std::chrono::steady_clock;
using silt::testing::Load;
using silt::testing::LoadResult;
constexpr char kBody[] = "Hello, Silt!\n";

// ---- the baseline server: epoll, keep-alive, a fixed answer ----

int Listen(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  listen(fd, 1024);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

[[noreturn]] void Serve(int lfd) {
  std::string response =
      absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n",
                   "Content-Length: ", strlen(kBody), "\r\n\r\n", kBody);
  int ep = epoll_create1(0);
  fcntl(lfd, F_SETFL, O_NONBLOCK);
  epoll_event ev{EPOLLIN, {.fd = lfd}};
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  std::vector<std::string> bufs(65536);
  epoll_event events[256];
  while (true) {
    int n = epoll_wait(ep, events, 256, -1);
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == lfd) {
        int c;
        while ((c = accept4(lfd, nullptr, nullptr,
                            SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
          int one = 1;
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          epoll_event e{EPOLLIN, {.fd = c}};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
          bufs[c].clear();
        }
        continue;
      }
      char tmp[65536];
      ssize_t r = read(fd, tmp, sizeof(tmp));
      if (r <= 0) {
        close(fd);
        continue;
      }
      std::string& b = bufs[fd];
      b.append(tmp, static_cast<size_t>(r));
      while (true) {
        size_t end = b.find("\r\n\r\n");
        if (end == std::string::npos) break;
        size_t len = 0;
        std::string head = b.substr(0, end);
        for (absl::string_view line : absl::StrSplit(head, "\r\n")) {
          if (line.size() > 15 &&
              strncasecmp(line.data(), "content-length:", 15) == 0)
            (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(15)),
                                   &len);
        }
        if (b.size() < end + 4 + len) break;
        b.erase(0, end + 4 + len);
        (void)!write(fd, response.data(), response.size());
      }
    }
  }
}

// ---- where a call's cost goes ----

// Processes whose command name is in `comms` (or whose pid is in `pids`).
std::vector<pid_t> Pids(const std::set<std::string>& comms,
                        const std::set<pid_t>& pids = {}) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = std::atoi(e.path().filename().c_str());
    if (pid <= 0) continue;
    std::ifstream f(e.path() / "comm");
    std::string comm;
    std::getline(f, comm);
    if (comms.contains(comm) || pids.contains(pid)) out.push_back(pid);
  }
  return out;
}

struct Usage {
  double cpu_s = 0;       // user + system, all threads
  uint64_t switches = 0;  // voluntary + involuntary, all threads
};

Usage UsageOf(const std::vector<pid_t>& pids) {
  Usage u;
  static const double tick = sysconf(_SC_CLK_TCK);
  for (pid_t pid : pids) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    std::getline(stat, line);
    size_t paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream in(line.substr(paren + 2));
    std::vector<std::string> f{std::istream_iterator<std::string>(in), {}};
    if (f.size() > 13)  // fields 14 and 15: utime, stime (0-based 11, 12)
      u.cpu_s += (std::atof(f[11].c_str()) + std::atof(f[12].c_str())) / tick;
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator(
             absl::StrCat("/proc/", pid, "/task"), ec)) {
      std::ifstream st(t.path() / "status");
      for (std::string l; std::getline(st, l);) {
        uint64_t n = 0;
        if ((absl::StartsWith(l, "voluntary_ctxt_switches:") ||
             absl::StartsWith(l, "nonvoluntary_ctxt_switches:")) &&
            absl::SimpleAtoi(
                absl::StripAsciiWhitespace(l.substr(l.find(':') + 1)), &n))
          u.switches += n;
      }
    }
  }
  return u;
}

Usage SelfUsage() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  Usage u;
  u.cpu_s = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
            (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  u.switches = ru.ru_nvcsw + ru.ru_nivcsw;
  return u;
}

// Instructions (user + kernel) the processes run in the next `seconds`, by
// perf stat; -1 without perf or without hardware counters (as in most VMs).
std::future<double> Instructions(const std::vector<pid_t>& pids,
                                 double seconds) {
  return std::async(std::launch::async, [pids, seconds]() -> double {
    if (pids.empty() || access("/usr/bin/perf", X_OK) != 0) return -1;
    std::vector<std::string> ids;
    for (pid_t p : pids) ids.push_back(std::to_string(p));
    auto r = silt::testing::RunCommand({"/usr/bin/perf", "stat", "-x,", "-e",
                                        "instructions", "-p",
                                        absl::StrJoin(ids, ","), "--", "sleep",
                                        absl::StrFormat("%.2f", seconds)});
    for (absl::string_view l : absl::StrSplit(r.err, '\n')) {
      double v;
      std::vector<absl::string_view> f = absl::StrSplit(l, ',');
      if (f.size() > 2 && absl::StartsWith(f[2], "instructions") &&
          absl::SimpleAtod(f[0], &v))
        return v;
    }
    return -1;
  });
}

// A process group on a call's path, measured over one load run.
struct Stage {
  std::string name;
  // The processes: these command names and pids (looked for again at the
  // end: instances may start during the run); none: this one (the client).
  std::set<std::string> comms;
  std::set<pid_t> pids;
  std::map<pid_t, Usage> before;
  std::future<double> instructions;

  bool Self() const { return comms.empty() && pids.empty(); }
  std::map<pid_t, Usage> Now() const {
    std::map<pid_t, Usage> m;
    if (Self()) {
      m[0] = SelfUsage();
    } else {
      for (pid_t p : Pids(comms, pids)) m[p] = UsageOf({p});
    }
    return m;
  }
};

struct Breakdown {
  std::vector<Stage> stages;
  void Begin(double seconds) {
    for (auto& s : stages) {
      s.before = s.Now();
      if (!s.Self())
        s.instructions = Instructions(Pids(s.comms, s.pids), seconds);
    }
  }
  // A row per stage (per call: CPU us, switches, instructions) into *rows,
  // and its name=value line into *lines. perf counts over a window as long
  // as the load run's, so its count is divided by the run's calls too.
  void End(const std::string& target, int conns, double calls,
           std::vector<std::string>* rows, std::vector<std::string>* lines) {
    for (auto& s : stages) {
      Usage used;  // since Begin, over the processes there at the end
      for (const auto& [pid, u] : s.Now()) {
        auto it = s.before.find(pid);
        Usage b = it == s.before.end() ? Usage() : it->second;
        used.cpu_s += u.cpu_s - b.cpu_s;
        used.switches += u.switches - b.switches;
      }
      double instr = s.instructions.valid() ? s.instructions.get() : -1;
      double cpu_us = used.cpu_s * 1e6 / calls;
      double sw = static_cast<double>(used.switches) / calls;
      std::string instr_per_call =
          instr < 0 ? "n/a" : absl::StrFormat("%.0f", instr / calls);
      rows->push_back(absl::StrFormat("%-6d %-15s %-10s %10.1f %10.2f %14s\n",
                                      conns, target, s.name, cpu_us, sw,
                                      instr_per_call));
      lines->push_back(absl::StrFormat("cpu_us_per_call_%s_%s_c%d=%.1f", target,
                                       s.name, conns, cpu_us));
    }
  }
};

int FreePort() {
  int port = 0;
  int fd = Listen(&port);
  close(fd);
  return port;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  std::vector<int> levels = {1, 32};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    if (flag == "--concurrency") {
      levels.clear();
      for (absl::string_view v : absl::StrSplit(argv[i + 1], ','))
        levels.push_back(std::atoi(std::string(v).c_str()));
    }
  }
  if (geteuid() != 0) {
    fprintf(stderr,
            "bench_invoke: run as root (Silt's instances run sandboxed)\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  namespace fs = std::filesystem;
  std::string dir = silt::testing::MakeTempDir("silt-bench-invoke");

  // 1. The baseline server, in its own process.
  int base_port = 0;
  int lfd = Listen(&base_port);
  pid_t base = fork();
  if (base == 0) Serve(lfd);
  close(lfd);

  // 2. nginx, one proxy hop with keep-alive to the baseline.
  int nginx_port = FreePort();
  fs::create_directories(dir + "/nginx/logs");
  std::ofstream(dir + "/nginx/nginx.conf")
      << "worker_processes 1;\ndaemon off;\nerror_log " << dir
      << "/nginx/logs/error.log;\n"
      << "pid " << dir
      << "/nginx/nginx.pid;\nevents { worker_connections 1024; }\n"
      << "http {\n  access_log off;\n  keepalive_requests 100000000;\n  "
         "upstream base { server 127.0.0.1:"
      << base_port
      << "; keepalive 64; }\n  server {\n    listen 127.0.0.1:" << nginx_port
      << ";\n"
      << "    location / { proxy_pass http://base; proxy_http_version 1.1;\n"
      << "      proxy_set_header Connection \"\"; }\n  }\n}\n";
  auto nginx =
      silt::testing::Process::Start({"/usr/sbin/nginx", "-p", dir + "/nginx",
                                     "-c", dir + "/nginx/nginx.conf"});
  if (!nginx.ok()) {
    fprintf(stderr, "cannot start nginx: %s\n",
            std::string(nginx.status().message()).c_str());
    return 2;
  }

  // 3. Silt: `silt local` with the hello example deployed by `silt up`;
  // and a second one whose calls all go through the invoker's call port
  // (--no-instance-leases), for the call path without leases.
  fs::copy(std::string(SILT_SOURCE_DIR) + "/examples/hello", dir + "/hello",
           fs::copy_options::recursive);
  std::vector<silt::testing::Process> silts;
  auto start_silt = [&](const std::string& name,
                        std::vector<std::string> extra) -> int {
    std::vector<std::string> args = {
        SILT_CLI_BIN, "local",       "--data-dir", dir + "/" + name,
        "--listen",   "127.0.0.1:0", "--no-auth"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = silt::testing::Process::Start(args);
    if (!p.ok()) return 0;
    auto line = p->WaitForLine("listening on ", std::chrono::seconds(60));
    if (!line.ok()) return 0;
    silts.push_back(*std::move(p));
    std::string addr = line->substr(13);
    auto up = silt::testing::RunCommand(
        {SILT_CLI_BIN, "up", "-f", dir + "/hello/stack.yml"}, "",
        {{"OPENFAAS_URL", "http://" + addr},
         {"OPENFAAS_CONFIG", dir + "/cfg-" + name}});
    if (up.exit_code != 0) {
      fprintf(stderr, "silt up failed:\n%s%s\n", up.out.c_str(),
              up.err.c_str());
      return 0;
    }
    return std::atoi(addr.substr(addr.rfind(':') + 1).c_str());
  };
  int silt_port = start_silt("silt", {});
  int port_only = start_silt("silt-port", {"--no-instance-leases"});
  if (silt_port == 0 || port_only == 0) {
    fprintf(stderr, "silt local did not start\n");
    return 2;
  }
  // The first call boots the instance; from then on every call is warm.
  Load(silt_port, "/function/hello", 1, 0.3);
  Load(port_only, "/function/hello", 1, 0.3);
  // Each target warms up for a moment before it is measured.
  for (int port : {base_port, nginx_port}) Load(port, "/", 1, 0.3);

  printf("warm invoke, %.1f s per run, body \"Silt\" -> \"%s\"\n\n", seconds,
         "Hello, Silt!\\n");
  printf("%-6s %-14s %12s %10s %10s %8s\n", "conns", "target", "req/s",
         "p50 us", "p99 us", "errors");
  std::vector<std::string> ratios, costs;
  std::vector<std::string> breakdown;
  auto stages = [&](bool silt_path) {
    Breakdown b;
    b.stages.push_back({.name = "client"});
    if (silt_path) {
      b.stages.push_back({.name = "gateway", .comms = {"silt-gateway"}});
      b.stages.push_back({.name = "invoker", .comms = {"silt-invoker"}});
      b.stages.push_back(
          {.name = "instance", .comms = {"silt-worker", "silt-restorer"}});
    } else {
      b.stages.push_back({.name = "nginx", .comms = {"nginx"}});
      b.stages.push_back({.name = "upstream", .pids = {base}});
    }
    return b;
  };
  for (int c : levels) {
    LoadResult base_r = Load(base_port, "/", c, seconds);
    Breakdown nb = stages(false);
    nb.Begin(seconds);
    LoadResult nginx_r = Load(nginx_port, "/", c, seconds);
    Breakdown sb = stages(true);
    sb.Begin(seconds);
    LoadResult silt_r = Load(silt_port, "/function/hello", c, seconds);
    nb.End("nginx", c, nginx_r.rps * seconds, &breakdown, &costs);
    sb.End("silt", c, silt_r.rps * seconds, &breakdown, &costs);
    // Measured as the silt row is (perf attached to the same processes).
    Breakdown pb = stages(true);
    pb.Begin(seconds);
    LoadResult port_r = Load(port_only, "/function/hello", c, seconds);
    pb.End("silt_call_port", c, port_r.rps * seconds, &breakdown, &costs);
    for (auto& [name, r] : std::vector<std::pair<const char*, LoadResult>>{
             {"direct", base_r},
             {"nginx-1-hop", nginx_r},
             {"silt", silt_r},
             {"silt-call-port", port_r}}) {
      printf("%-6d %-14s %12.0f %10.0f %10.0f %8lu\n", c, name, r.rps, r.p50_us,
             r.p99_us, static_cast<unsigned long>(r.errors));
    }
    ratios.push_back(
        absl::StrCat("throughput_silt_vs_nginx_c", c, "=",
                     absl::StrFormat("%.2f", silt_r.rps / nginx_r.rps)));
    ratios.push_back(
        absl::StrCat("p50_nginx_over_silt_c", c, "=",
                     absl::StrFormat("%.2f", nginx_r.p50_us / silt_r.p50_us)));
    ratios.push_back(
        absl::StrCat("p99_nginx_over_silt_c", c, "=",
                     absl::StrFormat("%.2f", nginx_r.p99_us / silt_r.p99_us)));
    ratios.push_back(
        absl::StrCat("throughput_silt_vs_direct_c", c, "=",
                     absl::StrFormat("%.2f", silt_r.rps / base_r.rps)));
    ratios.push_back(
        absl::StrCat("throughput_leases_vs_call_port_c", c, "=",
                     absl::StrFormat("%.2f", silt_r.rps / port_r.rps)));
  }
  printf("\nper call: CPU time, context switches, instructions (perf)\n");
  printf("%-6s %-15s %-10s %10s %10s %14s\n", "conns", "target", "process",
         "cpu us", "switches", "instructions");
  for (const auto& l : breakdown) printf("%s", l.c_str());
  printf("\n");
  for (const auto& r : ratios) printf("%s\n", r.c_str());
  for (const auto& r : costs) printf("%s\n", r.c_str());

  for (auto& p : silts) p.Stop(SIGTERM);
  nginx->Stop(SIGTERM);
  kill(base, SIGKILL);
  waitpid(base, nullptr, 0);
  fs::remove_all(dir);
  return 0;
}
