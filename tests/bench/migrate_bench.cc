// Migration benchmark: one map shard of 10 and of 64 MiB moved live between
// two nodes (invokers in their own network namespaces, joined by veth pairs
// on a bridge), idle and under concurrent writers, against sending the same
// number of bytes over a plain TCP connection between the same two
// namespaces in the same run (the physical limit of the copy).
//
//   sudo build/tests/bench/bench_migrate [--sizes 10,64] [--writers 4]
//                                        [--runs 5]
//
// Total: the `POST /system/proclets/ID/migrate` call as a user makes it
// (directory commit included), the median of --runs moves back and forth.
// Under writers, the same number of moves while the writers keep writing
// (their instances started beforehand). Pause: the longest time the source
// held writes (its final round) over those moves, and the longest single
// write any writer saw meanwhile (throttling and redirects included).
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
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/cluster.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using silt::testing::Cluster;

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

uint64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- the baseline: a plain TCP copy, run inside the nodes' namespaces ----

// --tcp-sink IP: listens on IP:0, prints the port, reads one connection to
// its end, answers one byte.
int TcpSink(const char* ip) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip, &a.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(fd, 1) != 0)
    return 1;
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  printf("port %d\n", ntohs(a.sin_port));
  fflush(stdout);
  int c = accept(fd, nullptr, nullptr);
  std::vector<char> buf(1 << 20);
  while (read(c, buf.data(), buf.size()) > 0) {
  }
  char ack = 1;
  (void)!write(c, &ack, 1);
  close(c);
  return 0;
}

// --tcp-send IP:PORT BYTES: sends BYTES (from memory) and waits for the
// ack; prints the milliseconds from connect to ack.
int TcpSend(const char* addr, const char* bytes_text) {
  std::string a(addr);
  size_t colon = a.rfind(':');
  uint64_t bytes = std::strtoull(bytes_text, nullptr, 10);
  std::vector<char> data(bytes, 'x');  // touched: in memory, like an arena
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::atoi(a.c_str() + colon + 1)));
  inet_pton(AF_INET, a.substr(0, colon).c_str(), &sa.sin_addr);
  auto t0 = Clock::now();
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return 1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off,
                      std::min<size_t>(data.size() - off, 1 << 20));
    if (n <= 0) return 1;
    off += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  char ack;
  if (read(fd, &ack, 1) != 1) return 1;
  printf("ms %.3f\n", Ms(Clock::now() - t0));
  return 0;
}

std::string SelfPath() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

// One plain copy of `bytes` from node `from` to node `to`, in ms.
double PlainCopyMs(Cluster& c, const std::string& from, const std::string& to,
                   uint64_t bytes) {
  auto sink = silt::testing::Process::Start(
      c.InNode(to, {SelfPath(), "--tcp-sink", c.address(to)}));
  if (!sink.ok()) return 0;
  auto port = sink->WaitForLine("port ", std::chrono::seconds(10));
  if (!port.ok()) return 0;
  auto r = silt::testing::RunCommand(
      c.InNode(from, {SelfPath(), "--tcp-send",
                      absl::StrCat(c.address(to), ":", port->substr(5)),
                      std::to_string(bytes)}));
  sink->Stop(SIGTERM);
  double ms = 0;
  if (r.out.rfind("ms ", 0) == 0)
    (void)absl::SimpleAtod(r.out.substr(3, r.out.find('\n') - 3), &ms);
  return ms;
}

// ---- Silt ----

struct Shard {
  uint64_t id = 0, bytes = 0;
  std::string node;
};

Shard FindShard(Cluster& c, const std::string& structure) {
  auto procs = json::parse(c.gateway().Call("GET", "/system/proclets").body,
                           nullptr, false);
  Shard s;
  for (const auto& p : procs) {
    if (p.value("structure", "") != structure) continue;
    s.id = p.value("id", uint64_t{0});
    s.bytes = p.value("bytes", uint64_t{0});
    s.node = p.value("node", "");
  }
  return s;
}

struct Move {
  double wall_ms = 0, total_ms = 0, pause_ms = 0;
  uint64_t bytes = 0;
  int rounds = 0;
  bool ok = false;
};

Move Migrate(Cluster& c, uint64_t id, const std::string& to) {
  Move m;
  auto t0 = Clock::now();
  auto r = c.gateway().Call("POST",
                            absl::StrCat("/system/proclets/", id, "/migrate"),
                            json{{"node", to}}.dump());
  m.wall_ms = Ms(Clock::now() - t0);
  if (r.status != 200) {
    fprintf(stderr, "migrate %llu to %s: %d %s\n",
            static_cast<unsigned long long>(id), to.c_str(), r.status,
            r.body.c_str());
    return m;
  }
  auto j = json::parse(r.body);
  m.total_ms = j.value("totalMs", 0.0);
  m.pause_ms = j.value("pauseMs", 0.0);
  m.bytes = j.value("bytes", uint64_t{0});
  m.rounds = j.value("rounds", 0);
  m.ok = true;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--tcp-sink")
    return TcpSink(argv[2]);
  if (argc >= 4 && std::string(argv[1]) == "--tcp-send")
    return TcpSend(argv[2], argv[3]);
  std::vector<int> sizes = {10, 64};
  int writers = 4, runs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--writers") writers = std::atoi(argv[i + 1]);
    if (flag == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
    if (flag == "--sizes") {
      sizes.clear();
      for (absl::string_view v : absl::StrSplit(argv[i + 1], ','))
        sizes.push_back(std::atoi(std::string(v).c_str()));
    }
  }
  if (geteuid() != 0) {
    fprintf(stderr,
            "bench_migrate: run as root (instances run sandboxed, "
            "nodes in network namespaces)\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  std::string dir = silt::testing::MakeTempDir("silt-bench-migrate");
  auto cluster = Cluster::Start(dir);
  if (!cluster.ok()) {
    fprintf(stderr, "cluster: %s\n",
            std::string(cluster.status().message()).c_str());
    return 2;
  }
  Cluster& c = **cluster;
  std::string max = std::to_string(writers + 1);
  // node-a offers more memory: new shards start there.
  for (auto [name, mib] : {std::pair{"node-a", 1 << 20}, {"node-b", 4096}}) {
    auto s = c.AddNode({.name = name,
                        .memory_mib = static_cast<uint64_t>(mib),
                        .extra = {"--max-instances", max}});
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
  json d = {{"service", "sb"},
            {"image", *image},
            {"constraints", {"node.name==node-b"}}};
  if (auto r = c.gateway().Call("POST", "/system/functions", d.dump());
      r.status != 200) {
    fprintf(stderr, "deploy: %d %s\n", r.status, r.body.c_str());
    return 2;
  }

  constexpr int kValue = 1000;
  std::vector<std::string> ratios;
  printf("\n%-28s %9s %9s %9s %9s %7s %12s\n", "", "bytes", "total ms",
         "tcp ms", "pause ms", "rounds", "max write ms");
  for (int mib : sizes) {
    std::string name = absl::StrCat("m", mib);
    // ~1 KB per entry: enough entries to make the arena `mib` MiB.
    int keys = mib * 1000;
    auto fill = c.gateway().Call(
        "POST",
        absl::StrCat("/function/sb/fill?name=", name, "&keys=", keys,
                     "&vsize=", kValue, "&shards=1&max_mib=1024"),
        "", false);
    if (fill.status != 200) {
      fprintf(stderr, "fill: %d %s\n", fill.status, fill.body.c_str());
      return 2;
    }
    Shard shard = FindShard(c, name);

    // Idle: back and forth.
    std::vector<double> wall, total, tcp;
    Move last;
    for (int r = 0; r < runs; ++r) {
      std::string from = FindShard(c, name).node;
      std::string to = from == "node-a" ? "node-b" : "node-a";
      last = Migrate(c, shard.id, to);
      if (!last.ok) return 1;
      wall.push_back(last.wall_ms);
      total.push_back(last.total_ms);
      tcp.push_back(PlainCopyMs(c, from, to, last.bytes));
    }
    double tcp_ms = Median(tcp);
    printf("%-28s %9llu %9.2f %9.2f %9.3f %7d %12s\n",
           absl::StrCat(mib, " MiB shard, idle").c_str(),
           static_cast<unsigned long long>(last.bytes), Median(wall), tcp_ms,
           last.pause_ms, last.rounds, "-");
    printf("%-28s %9s %9.2f\n", "  (source's own total)", "", Median(total));
    ratios.push_back(absl::StrFormat("migrate_%dMiB_vs_tcp=%.2f", mib,
                                     tcp_ms > 0 ? Median(wall) / tcp_ms : 0));

    // Under writers: `writers` calls write random keys of the shard for a
    // while; the shard moves back and forth `runs` times meanwhile.
    auto write = [&](double seconds, std::vector<std::vector<uint32_t>>* lat,
                     std::atomic<int>* failed) {
      uint64_t start = RealtimeNs() + 300000000;
      uint64_t end = start + static_cast<uint64_t>(seconds * 1e9);
      std::string path =
          absl::StrCat("/function/sb/run?op=put&name=", name, "&keys=", keys,
                       "&vsize=", kValue, "&start=", start, "&end=", end);
      lat->assign(writers, {});
      std::vector<std::thread> threads;
      for (int w = 0; w < writers; ++w) {
        threads.emplace_back([&c, lat, failed, w, path] {
          auto r = c.gateway().Call("POST", path, "", false);
          if (r.status != 200) {
            fprintf(stderr, "writer: %d %s\n", r.status,
                    r.body.substr(0, 200).c_str());
            ++*failed;
            return;
          }
          (*lat)[w].resize(r.body.size() / 4);
          memcpy((*lat)[w].data(), r.body.data(), (*lat)[w].size() * 4);
        });
      }
      return std::make_pair(start, std::move(threads));
    };
    std::vector<std::vector<uint32_t>> lat;
    std::atomic<int> failed{0};
    {  // warm: one instance per writer, so that no cold start overlaps a move
      auto [at, threads] = write(0.1, &lat, &failed);
      for (auto& t : threads) t.join();
    }
    const double gap_s = 0.1;
    double window_s = 0.5 + runs * (Median(wall) * 3 / 1000 + gap_s);
    auto [start, threads] = write(window_s, &lat, &failed);
    std::vector<double> busy_wall;
    double busy_pause = 0;
    uint64_t busy_bytes = 0;
    int busy_rounds = 0;
    bool moved = true;
    for (int r = 0; r < runs && moved; ++r) {
      // Each move starts once the writers have had gap_s to themselves.
      uint64_t at = start + static_cast<uint64_t>((0.25 + r * gap_s) * 1e9);
      while (RealtimeNs() < at)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::string from = FindShard(c, name).node;
      Move busy = Migrate(c, shard.id, from == "node-a" ? "node-b" : "node-a");
      moved = busy.ok;
      busy_wall.push_back(busy.wall_ms);
      busy_pause = std::max(busy_pause, busy.pause_ms);
      busy_bytes = std::max(busy_bytes, busy.bytes);
      busy_rounds = std::max(busy_rounds, busy.rounds);
      start = RealtimeNs() - static_cast<uint64_t>((0.25 + r * gap_s) * 1e9);
    }
    for (auto& t : threads) t.join();
    if (!moved) return 1;
    uint32_t max_ns = 0;
    size_t writes = 0;
    std::vector<uint32_t> all;
    for (auto& v : lat) {
      writes += v.size();
      for (uint32_t x : v) max_ns = std::max(max_ns, x);
      all.insert(all.end(), v.begin(), v.end());
    }
    std::sort(all.begin(), all.end());
    printf("%-28s %9llu %9.2f %9.2f %9.3f %7d %12.3f\n",
           absl::StrCat(mib, " MiB, ", writers, " writers").c_str(),
           static_cast<unsigned long long>(busy_bytes), Median(busy_wall),
           tcp_ms, busy_pause, busy_rounds, max_ns / 1e6);
    auto pct = [&](double q) {
      return all.empty() ? 0.0
                         : all[static_cast<size_t>(q * (all.size() - 1))] / 1e6;
    };
    printf(
        "%-28s %zu moves, %zu writes (p50 %.3f, p99 %.3f, p99.9 %.3f ms), "
        "%d writer call(s) failed\n",
        "", busy_wall.size(), writes, pct(0.5), pct(0.99), pct(0.999),
        failed.load());
    ratios.push_back(
        absl::StrFormat("migrate_pause_ms_%dMiB=%.3f", mib, busy_pause));
    ratios.push_back(
        absl::StrFormat("migrate_busy_%dMiB_vs_tcp=%.2f", mib,
                        tcp_ms > 0 ? Median(busy_wall) / tcp_ms : 0));
    ratios.push_back(
        absl::StrFormat("migrate_max_write_ms_%dMiB=%.3f", mib, max_ns / 1e6));
  }
  printf("\n");
  for (const auto& r : ratios) printf("%s\n", r.c_str());
  cluster->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
