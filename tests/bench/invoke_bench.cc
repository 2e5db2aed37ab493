// Warm invocation benchmark: throughput and p50/p99 latency of POST
// /function/hello through Silt (gateway -> invoker -> sandboxed worker),
// against two baselines measured in the same run: a minimal HTTP server
// returning the same body (the physical limit on this machine) and one nginx
// reverse-proxy hop in front of it (the cost of a single hop).
//
//   sudo build/tests/bench/bench_invoke [--seconds 3] [--concurrency 1,32]
//
// Prints a table and ratio lines (silt / nginx). Needs root (instances run
// sandboxed) and nginx (deploy/setup.sh installs nginx-light).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
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
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/process.h"

namespace {

using Clock = std::chrono::steady_clock;
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

// ---- the load generator: N keep-alive connections, one thread each ----

struct Result {
  double rps = 0, p50_us = 0, p99_us = 0;
  uint64_t errors = 0;
};

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// One request/response on a keep-alive connection; false on any error or
// non-200.
bool RoundTrip(int fd, const std::string& request, std::string& buf) {
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size()))
    return false;
  buf.clear();
  size_t need = std::string::npos;
  char tmp[16384];
  while (true) {
    ssize_t r = read(fd, tmp, sizeof(tmp));
    if (r <= 0) return false;
    buf.append(tmp, static_cast<size_t>(r));
    if (need == std::string::npos) {
      size_t end = buf.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      size_t len = 0;
      for (absl::string_view line :
           absl::StrSplit(buf.substr(0, end), "\r\n")) {
        if (line.size() > 15 &&
            strncasecmp(line.data(), "content-length:", 15) == 0)
          (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(15)),
                                 &len);
      }
      need = end + 4 + len;
    }
    if (buf.size() >= need) return buf.compare(9, 3, "200") == 0;
  }
}

Result Load(int port, const std::string& path, int concurrency,
            double seconds) {
  std::string request =
      absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                   "Content-Type: text/plain\r\nContent-Length: 4\r\n\r\nSilt");
  // Warm up: every connection once, and a short burst.
  std::vector<std::vector<uint32_t>> lat(concurrency);
  std::atomic<uint64_t> errors{0};
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&, c] {
      int fd = Connect(port);
      std::string buf;
      if (fd < 0 || !RoundTrip(fd, request, buf)) ++errors;
      while (!go) std::this_thread::yield();
      while (!stop) {
        auto t0 = Clock::now();
        if (fd < 0 || !RoundTrip(fd, request, buf)) {
          ++errors;
          if (fd >= 0) close(fd);
          fd = Connect(port);
          continue;
        }
        lat[c].push_back(static_cast<uint32_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() -
                                                                  t0)
                .count()));
      }
      if (fd >= 0) close(fd);
    });
  }
  go = true;
  auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<uint32_t> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  Result r;
  r.errors = errors;
  if (all.empty()) return r;
  r.rps = static_cast<double>(all.size()) / elapsed;
  r.p50_us = all[all.size() / 2];
  r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return r;
}

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

  // 3. Silt: `silt local` with the hello example deployed by `silt up`.
  auto silt = silt::testing::Process::Start(
      {SILT_CLI_BIN, "local", "--data-dir", dir + "/silt", "--listen",
       "127.0.0.1:0", "--no-auth"});
  auto line = silt->WaitForLine("listening on ", std::chrono::seconds(60));
  if (!line.ok()) {
    fprintf(stderr, "silt local did not start\n");
    return 2;
  }
  std::string silt_addr = line->substr(13);
  int silt_port = std::atoi(silt_addr.substr(silt_addr.rfind(':') + 1).c_str());
  fs::copy(std::string(SILT_SOURCE_DIR) + "/examples/hello", dir + "/hello",
           fs::copy_options::recursive);
  auto up = silt::testing::RunCommand(
      {SILT_CLI_BIN, "up", "-f", dir + "/hello/stack.yml"}, "",
      {{"OPENFAAS_URL", "http://" + silt_addr},
       {"OPENFAAS_CONFIG", dir + "/cfg"}});
  if (up.exit_code != 0) {
    fprintf(stderr, "silt up failed:\n%s%s\n", up.out.c_str(), up.err.c_str());
    return 2;
  }
  // The first call boots the instance; from then on every call is warm.
  Load(silt_port, "/function/hello", 1, 0.3);
  // Each target warms up for a moment before it is measured.
  for (int port : {base_port, nginx_port}) Load(port, "/", 1, 0.3);

  printf("warm invoke, %.1f s per run, body \"Silt\" -> \"%s\"\n\n", seconds,
         "Hello, Silt!\\n");
  printf("%-6s %-14s %12s %10s %10s %8s\n", "conns", "target", "req/s",
         "p50 us", "p99 us", "errors");
  std::vector<std::string> ratios;
  for (int c : levels) {
    Result base_r = Load(base_port, "/", c, seconds);
    Result nginx_r = Load(nginx_port, "/", c, seconds);
    Result silt_r = Load(silt_port, "/function/hello", c, seconds);
    for (auto& [name, r] : std::vector<std::pair<const char*, Result>>{
             {"direct", base_r}, {"nginx-1-hop", nginx_r}, {"silt", silt_r}}) {
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
        absl::StrCat("throughput_silt_vs_direct_c", c, "=",
                     absl::StrFormat("%.2f", silt_r.rps / base_r.rps)));
  }
  printf("\n");
  for (const auto& r : ratios) printf("%s\n", r.c_str());

  silt->Stop(SIGTERM);
  nginx->Stop(SIGTERM);
  kill(base, SIGKILL);
  waitpid(base, nullptr, 0);
  fs::remove_all(dir);
  return 0;
}
