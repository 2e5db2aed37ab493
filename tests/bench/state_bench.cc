// State benchmark: map get/put throughput and p50/p99 latency as a function
// sees them (ctx.Map inside a sandboxed instance), with the shard on the
// instance's own node (local) and on another node (remote, over the veth
// between two network namespaces), against redis-server from Debian on
// loopback measured in the same run with the same value size, key space and
// concurrency.
//
//   sudo build/tests/bench/bench_state [--seconds 2] [--concurrency 1,32]
//                                      [--keys 10000] [--vsize 64]
//
// Redis is measured two ways and the better one is the baseline: with
// redis-benchmark (its own tool: one event loop driving C connections) and
// with C client threads that each wait for their reply, the shape Silt's
// clients (C instances, one call in flight each) have. Redis runs with
// persistence off (no RDB, no AOF): Silt's shards live in memory too.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/cluster.h"
#include "common/http_load.h"
#include "nlohmann/json.hpp"

namespace {

using silt::testing::Cluster;
using silt::testing::Connect;
using silt::testing::RunCommand;

struct Figures {
  double ops_per_s = 0, p50_us = 0, p99_us = 0;
};

Figures Summarize(std::vector<uint32_t>& ns, double seconds) {
  Figures f;
  if (ns.empty()) return f;
  std::sort(ns.begin(), ns.end());
  f.ops_per_s = static_cast<double>(ns.size()) / seconds;
  f.p50_us = ns[ns.size() / 2] / 1000.0;
  f.p99_us = ns[std::min(ns.size() - 1, ns.size() * 99 / 100)] / 1000.0;
  return f;
}

uint64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// ---- Silt: C concurrent calls of the bench function, each running ops in a
// loop over the same time window ----

Figures RunSilt(Cluster& c, const std::string& fn, const std::string& op,
                int clients, double seconds, int keys, int vsize,
                double lead_s = 0.5) {
  uint64_t start = RealtimeNs() + static_cast<uint64_t>(lead_s * 1e9);
  uint64_t end = start + static_cast<uint64_t>(seconds * 1e9);
  std::string path =
      absl::StrCat("/function/", fn, "/run?op=", op, "&keys=", keys,
                   "&vsize=", vsize, "&start=", start, "&end=", end);
  std::vector<std::vector<uint32_t>> lat(clients);
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      auto r = c.gateway().Call("POST", path, "", false);
      if (r.status != 200) {
        fprintf(stderr, "%s: %d %s\n", fn.c_str(), r.status,
                r.body.substr(0, 200).c_str());
        ++failed;
        return;
      }
      lat[i].resize(r.body.size() / 4);
      memcpy(lat[i].data(), r.body.data(), lat[i].size() * 4);
    });
  }
  for (auto& t : threads) t.join();
  if (failed) return {};
  std::vector<uint32_t> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  return Summarize(all, seconds);
}

// ---- Redis ----

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string Resp(const std::vector<std::string>& args) {
  std::string s = absl::StrCat("*", args.size(), "\r\n");
  for (const auto& a : args)
    absl::StrAppend(&s, "$", a.size(), "\r\n", a, "\r\n");
  return s;
}

// Reads one reply (+OK, $N bulk, $-1) into buf; false on a broken link.
bool ReadReply(int fd, std::string* buf) {
  buf->clear();
  char tmp[4096];
  size_t need = 0;
  while (true) {
    if (need == 0) {
      size_t crlf = buf->find("\r\n");
      if (crlf != std::string::npos) {
        if ((*buf)[0] != '$') return true;
        long n = std::atol(buf->c_str() + 1);
        need = crlf + 2 + (n < 0 ? 0 : static_cast<size_t>(n) + 2);
      }
    }
    if (need && buf->size() >= need) return true;
    ssize_t n = read(fd, tmp, sizeof(tmp));
    if (n <= 0) return false;
    buf->append(tmp, static_cast<size_t>(n));
  }
}

// C threads, one blocking connection each, one command in flight.
Figures RunRedisThreads(int port, const std::string& op, int clients,
                        double seconds, int keys, int vsize) {
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::vector<uint32_t>> lat(clients);
  std::vector<std::thread> threads;
  std::string value(vsize, 'v');
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      int fd = Connect(port);
      std::mt19937_64 rng(i + 1);
      std::string reply;
      lat[i].reserve(1 << 20);
      while (!go) std::this_thread::yield();
      while (!stop) {
        std::string key = "k" + std::to_string(rng() % keys);
        std::string cmd =
            op == "put" ? Resp({"SET", key, value}) : Resp({"GET", key});
        auto t0 = std::chrono::steady_clock::now();
        if (write(fd, cmd.data(), cmd.size()) < 0 || !ReadReply(fd, &reply))
          break;
        lat[i].push_back(static_cast<uint32_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now() - t0)
                .count()));
      }
      close(fd);
    });
  }
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  std::vector<uint32_t> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  return Summarize(all, seconds);
}

// redis-benchmark -t get|set: its CSV has rps and latency percentiles (ms).
Figures RunRedisBenchmark(int port, const std::string& op, int clients,
                          double seconds, int keys, int vsize,
                          double expected_rps) {
  long requests =
      std::max<long>(10000, static_cast<long>(expected_rps * seconds));
  auto r =
      RunCommand({"/usr/bin/redis-benchmark", "-p", std::to_string(port), "-t",
                  op == "put" ? "set" : "get", "-c", std::to_string(clients),
                  "-n", std::to_string(requests), "-d", std::to_string(vsize),
                  "-r", std::to_string(keys), "-P", "1", "--csv"});
  Figures f;
  for (absl::string_view line : absl::StrSplit(r.out, '\n')) {
    std::vector<std::string> cols;
    for (absl::string_view c : absl::StrSplit(line, ','))
      cols.emplace_back(absl::StripAsciiWhitespace(c));
    if (cols.size() < 7 || cols[0] == "\"test\"") continue;
    auto num = [&](size_t i) {
      double v = 0;
      std::string s = cols[i];
      s.erase(std::remove(s.begin(), s.end(), '"'), s.end());
      (void)absl::SimpleAtod(s, &v);
      return v;
    };
    f.ops_per_s = num(1);
    f.p50_us = num(4) * 1000;
    f.p99_us = num(6) * 1000;
  }
  return f;
}

void Row(const char* name, const Figures& f) {
  printf("%-34s %12.0f %10.1f %10.1f\n", name, f.ops_per_s, f.p50_us, f.p99_us);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2;
  std::vector<int> levels = {1, 32};
  int keys = 10000, vsize = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    if (flag == "--keys") keys = std::atoi(argv[i + 1]);
    if (flag == "--vsize") vsize = std::atoi(argv[i + 1]);
    if (flag == "--concurrency") {
      levels.clear();
      for (absl::string_view v : absl::StrSplit(argv[i + 1], ','))
        levels.push_back(std::atoi(std::string(v).c_str()));
    }
  }
  if (geteuid() != 0) {
    fprintf(stderr,
            "bench_state: run as root (instances run sandboxed, "
            "nodes in network namespaces)\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  int max_clients = *std::max_element(levels.begin(), levels.end());
  namespace fs = std::filesystem;
  std::string dir = silt::testing::MakeTempDir("silt-bench-state");

  // 1. Redis on loopback, persistence off.
  int redis_port = FreePort();
  auto redis = silt::testing::Process::Start(
      {"/usr/bin/redis-server", "--port", std::to_string(redis_port), "--bind",
       "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
       "--protected-mode", "no", "--maxclients", "10000"});
  if (!redis.ok()) {
    fprintf(stderr, "cannot start redis-server: %s\n",
            std::string(redis.status().message()).c_str());
    return 2;
  }
  int fd = -1;
  if (!silt::testing::Eventually(
          [&] { return (fd = Connect(redis_port)) >= 0; },
          std::chrono::seconds(5))) {
    fprintf(stderr, "redis-server did not come up\n");
    return 2;
  }
  {  // the same keys and values Silt's map holds
    std::string value(vsize, 'v'), batch, reply;
    for (int k = 0; k < keys; ++k) {
      std::string cmd = Resp({"SET", "k" + std::to_string(k), value});
      if (write(fd, cmd.data(), cmd.size()) < 0 || !ReadReply(fd, &reply))
        break;
    }
    close(fd);
  }

  // 2. Silt: two nodes in their own network namespaces. node-b offers far
  // more memory, so the map's shards go there; `sb-local` runs on node-b next
  // to them, `sb-remote` on node-a.
  auto cluster = Cluster::Start(dir);
  if (!cluster.ok()) {
    fprintf(stderr, "cluster: %s\n",
            std::string(cluster.status().message()).c_str());
    return 2;
  }
  Cluster& c = **cluster;
  std::string max = std::to_string(max_clients);
  for (auto [name, mib] : {std::pair{"node-a", 2048}, {"node-b", 1 << 20}}) {
    auto s = c.AddNode({.name = name,
                        .memory_mib = static_cast<uint64_t>(mib),
                        .extra = {"--max-instances", max, "--max-queue", max}});
    if (!s.ok()) {
      fprintf(stderr, "%s: %s\n", name, std::string(s.message()).c_str());
      return 2;
    }
  }
  if (auto s = c.WaitNodes(2); !s.ok()) {
    fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  auto image = c.BuildAndPush(
      "statebench", std::string(SILT_SOURCE_DIR) + "/tests/bench/statebench");
  if (!image.ok()) {
    fprintf(stderr, "%s\n", std::string(image.status().message()).c_str());
    return 2;
  }
  for (auto [fn, node] :
       {std::pair{"sb-local", "node-b"}, {"sb-remote", "node-a"}}) {
    nlohmann::json d = {{"service", fn},
                        {"image", *image},
                        {"constraints", {std::string("node.name==") + node}}};
    auto r = c.gateway().Call("POST", "/system/functions", d.dump());
    if (r.status != 200) {
      fprintf(stderr, "deploy %s: %d %s\n", fn, r.status, r.body.c_str());
      return 2;
    }
  }
  auto fill = c.gateway().Call(
      "POST",
      absl::StrCat("/function/sb-local/fill?keys=", keys, "&vsize=", vsize), "",
      false);
  if (fill.status != 200) {
    fprintf(stderr, "fill: %d %s\n", fill.status, fill.body.c_str());
    return 2;
  }
  auto procs = nlohmann::json::parse(
      c.gateway().Call("GET", "/system/proclets").body, nullptr, false);
  int shards = 0;
  for (const auto& p : procs) {
    if (p.value("structure", "") != "bench") continue;
    ++shards;
    if (p.value("node", "") != "node-b") {
      fprintf(stderr, "shard %s is on %s, not node-b\n",
              p.value("id", nlohmann::json()).dump().c_str(),
              p.value("node", "").c_str());
      return 2;
    }
  }
  // Every instance the runs need, started before the clock runs.
  for (const char* fn : {"sb-local", "sb-remote"})
    RunSilt(c, fn, "get", max_clients, 0.2, keys, vsize, 3.0);

  printf(
      "\nmap of %d keys, %d-byte values, %d shard(s) on node-b; %.1f s per "
      "row\n",
      keys, vsize, shards, seconds);
  printf("%-34s %12s %10s %10s\n", "", "ops/s", "p50 us", "p99 us");
  std::vector<std::string> ratios;
  for (const char* op : {"get", "put"}) {
    for (int clients : levels) {
      auto local = RunSilt(c, "sb-local", op, clients, seconds, keys, vsize);
      auto remote = RunSilt(c, "sb-remote", op, clients, seconds, keys, vsize);
      auto threads =
          RunRedisThreads(redis_port, op, clients, seconds, keys, vsize);
      auto tool = RunRedisBenchmark(redis_port, op, clients, seconds, keys,
                                    vsize, threads.ops_per_s);
      const Figures& best = tool.ops_per_s > threads.ops_per_s ? tool : threads;
      printf("-- %s, %d client(s)\n", op, clients);
      Row("silt local shard", local);
      Row("silt remote shard (other node)", remote);
      Row("redis, client threads", threads);
      Row("redis, redis-benchmark", tool);
      auto ratio = [&](const char* what, const Figures& f) {
        ratios.push_back(absl::StrFormat(
            "state_%s%s_vs_redis_c%d=%.2f", what, op, clients,
            best.ops_per_s > 0 ? f.ops_per_s / best.ops_per_s : 0));
        ratios.push_back(absl::StrFormat("state_%s%s_p99_us_c%d=%.1f", what, op,
                                         clients, f.p99_us));
      };
      ratio("", remote);
      ratio("local_", local);
      ratios.push_back(absl::StrFormat("redis_%s_p99_us_c%d=%.1f", op, clients,
                                       best.p99_us));
    }
  }
  printf("\n");
  for (const auto& r : ratios) printf("%s\n", r.c_str());
  redis->Stop(SIGTERM);
  cluster->reset();
  fs::remove_all(dir);
  return 0;
}
