// Quicksand's imbalanced-cluster experiment with the pipeline example
// (examples/pipeline, `op=run`: produce N records into a sharded vector,
// transform each with a CPU-heavy Map on compute proclets, reduce).
//
//   sudo build/tests/bench/bench_imbalanced [--n 1048576] [--rounds 16]
//       [--runs 5] [--passes 2] [--a-mib 48] [--b-mib 1024]
//
// Two setups, same function, same N and rounds, run one after the other in
// this process (each cluster is stopped before the next starts):
//   imbalanced  two nodes (invokers in their own network namespaces, veth
//               pairs on a bridge): node-a with most of the CPU and little
//               memory (--cpus 2, --memory a-mib), node-b the reverse
//               (--cpus 1, --memory b-mib). The records vector is larger
//               than node-a's memory; the directory places shards by free
//               memory, so they land on node-b, while the Map's compute
//               proclets go where CPU is free, mostly node-a. The function is
//               deployed on both nodes, unpinned (a compute proclet runs in
//               an instance of its function, so a node without the function
//               takes no share). The gateway sends a call to the node with
//               the most idle instances of the function, else to the one
//               with the most CPU to spare; the bench prints where the calls
//               went (imbalanced_calls_to_node_a/_b), and with them the
//               entry instance (produce, the Map's coordinator, reduce).
//   balanced    one node with both: --cpus 2, --memory a-mib + b-mib.
// Both setups share the same 2 physical cores of this machine: --cpus only
// sets each node's cgroup quota and the cores it reports (its compute
// proclet slots), so the imbalanced cluster's 2 + 1 "cores" are the same 2
// physical cores as the balanced node's 2. The figure is therefore what the
// split of memory and compute over two nodes costs (remote reads of every
// record, remote digest writes, coordination), not a gain from more
// hardware.
//
// Throughput is records per second of the whole `op=run` call (wall time
// around the HTTP call, taken here); the handler's per-stage times are
// printed too. Each cluster gets one warm-up call, then --runs timed calls;
// the setups alternate --passes times (balanced, imbalanced, balanced, ...)
// to spread machine noise over both, and the figures are medians over all
// timed calls of a setup. Every call uses fresh vectors (its own tag) that
// are deleted after it, and the next call starts once the nodes report
// their CPU idle again, so each call finds the same state. For the
// imbalanced setup the bench checks where the records' shards were
// (GET /system/proclets, right after each call) and where the Map ran (the
// handler's placement).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using silt::testing::Cluster;
using Clock = std::chrono::steady_clock;

struct Config {
  uint64_t n = 1 << 20;  // 64 MiB of 64-byte records
  uint64_t rounds = 16;
  int runs = 5;
  int passes = 2;
  uint64_t a_mib = 48;
  uint64_t b_mib = 1024;
};

// j[key] as a number; `fallback` when absent or not a number (null).
double Num(const json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2]
                      : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// One timed call's figures.
struct Sample {
  double wall_ms = 0, produce_ms = 0, transform_ms = 0, reduce_ms = 0;
  double transform_on_a = 0;  // fraction of the Map's elements on node-a
  // The node with the most ready instances of the function before the call
  // ("tie" if none had more): where the gateway sends the call.
  std::string entry;
  uint64_t shards = 0, shards_on_b = 0;
  uint64_t bytes = 0, bytes_on_b = 0;
  std::string sum;
};

struct Setup {
  std::string name;
  std::vector<Sample> samples;
  std::string memory;  // nodes' memory use after the warm-up
};

// Polls until every node reports its CPU idle and no compute proclets (the
// previous call's reports have passed), at most 10 s.
void WaitIdle(Cluster& c) {
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    auto nodes = json::parse(c.gateway().Call("GET", "/system/nodes").body,
                             nullptr, false);
    bool idle = nodes.is_array() && !nodes.empty();
    for (const auto& n : nodes)
      idle = idle && Num(n, "cpuUsed", 1.0) < 0.2 &&
             Num(n, "computeProclets", 1) == 0;
    if (idle) return;
    usleep(50 * 1000);  // polling only: nothing timed runs meanwhile
  }
}

std::string MemoryUse(Cluster& c) {
  auto nodes = json::parse(c.gateway().Call("GET", "/system/nodes").body,
                           nullptr, false);
  std::string out;
  for (const auto& n : nodes)
    out += absl::StrCat(out.empty() ? "" : ",", n.value("name", ""), ":",
                        static_cast<uint64_t>(Num(n, "memoryUsedBytes")) >> 20,
                        "/", static_cast<uint64_t>(Num(n, "memoryBytes")) >> 20,
                        "MiB:", static_cast<int>(Num(n, "instances")),
                        "instances");
  return out;
}

void DeleteState(Cluster& c, const std::string& name) {
  auto r = c.gateway().Call("DELETE", "/system/state/" + name);
  if (r.status != 202 && r.status != 200)
    fprintf(stderr, "delete %s: %d %s\n", name.c_str(), r.status,
            r.body.c_str());
}

// One op=run call with its own vectors; false if it failed.
bool Run(Cluster& c, const Config& cfg, const std::string& tag, Sample* s) {
  std::string query =
      absl::StrCat("op=run&n=", cfg.n, "&rounds=", cfg.rounds, "&tag=", tag);
  {
    auto nodes = json::parse(c.gateway().Call("GET", "/system/nodes").body,
                             nullptr, false);
    double most = -1;
    if (nodes.is_array())
      for (const auto& n : nodes) {
        double ready = Num(n, "instances");
        if (ready == most) s->entry = "tie";
        if (ready > most) most = ready, s->entry = n.value("name", "");
      }
  }
  auto start = Clock::now();
  auto r = c.gateway().Call("POST", "/function/pipeline?" + query, "",
                            /*with_auth=*/false);
  s->wall_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  json j = json::parse(r.body, nullptr, false);
  bool ok = r.status == 200 && j.is_object() && j.contains("records") &&
            j["records"].is_number_unsigned() &&
            j["records"].get<uint64_t>() == cfg.n;
  if (!ok)
    fprintf(stderr, "pipeline %s: %d %s\n", query.c_str(), r.status,
            r.body.c_str());
  if (ok) {
    s->produce_ms = Num(j, "produce_ms");
    s->transform_ms = Num(j, "transform_ms");
    s->reduce_ms = Num(j, "reduce_ms");
    if (j["sum"].is_string()) s->sum = j["sum"];
    double all = 0, on_a = 0;
    json placement = j.value("placement", json::object());
    for (const auto& [node, elements] : placement.items()) {
      double e = elements.is_number() ? elements.get<double>() : 0;
      all += e;
      if (node == "node-a") on_a += e;
    }
    s->transform_on_a = all > 0 ? on_a / all : 0;
    // Where the records were, before they go.
    auto all_shards = json::parse(
        c.gateway().Call("GET", "/system/proclets").body, nullptr, false);
    if (!all_shards.is_array()) all_shards = json::array();
    for (const auto& p : all_shards) {
      if (!p.is_object() || p.value("structure", "") != "records-" + tag)
        continue;
      bool on_b = p.value("node", "") == "node-b";
      uint64_t bytes = static_cast<uint64_t>(Num(p, "bytes"));
      s->shards += 1;
      s->shards_on_b += on_b;
      s->bytes += bytes;
      s->bytes_on_b += on_b ? bytes : 0;
    }
  }
  fprintf(stderr,
          "bench_imbalanced: %s %.0f ms (produce %.0f, transform %.0f, reduce "
          "%.0f), map on node-a %.2f, records %llu/%llu shards on node-b, "
          "entry on %s\n",
          tag.c_str(), s->wall_ms, s->produce_ms, s->transform_ms, s->reduce_ms,
          s->transform_on_a, static_cast<unsigned long long>(s->shards_on_b),
          static_cast<unsigned long long>(s->shards), s->entry.c_str());
  DeleteState(c, "records-" + tag);
  DeleteState(c, "digests-" + tag);
  WaitIdle(c);
  return ok;
}

// Starts a cluster for `setup`, deploys the pipeline, warms it up and takes
// cfg.runs timed calls into setup->samples; false if anything failed.
bool Measure(const Config& cfg, bool imbalanced, int pass, Setup* setup) {
  std::string dir = silt::testing::MakeTempDir("silt-bench-imbalanced");
  bool ok = false;
  {
    auto cluster = Cluster::Start(dir);
    if (!cluster.ok()) {
      fprintf(stderr, "cluster: %s\n",
              std::string(cluster.status().message()).c_str());
      return false;
    }
    Cluster& c = **cluster;
    std::vector<silt::testing::NodeOptions> nodes;
    if (imbalanced)
      nodes = {{.name = "node-a", .cpus = 2, .memory_mib = cfg.a_mib},
               {.name = "node-b", .cpus = 1, .memory_mib = cfg.b_mib}};
    else
      nodes = {
          {.name = "node-a", .cpus = 2, .memory_mib = cfg.a_mib + cfg.b_mib}};
    for (const auto& node : nodes) {
      if (auto s = c.AddNode(node); !s.ok()) {
        fprintf(stderr, "%s: %s\n", node.name.c_str(),
                std::string(s.message()).c_str());
        return false;
      }
    }
    if (auto s = c.WaitNodes(nodes.size()); !s.ok()) {
      fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return false;
    }
    auto image = c.BuildAndPush("pipeline", std::string(SILT_SOURCE_DIR) +
                                                "/examples/pipeline/pipeline");
    if (!image.ok()) {
      fprintf(stderr, "%s\n", std::string(image.status().message()).c_str());
      return false;
    }
    json d = {{"service", "pipeline"},
              {"image", *image},
              {"envVars", {{"exec_timeout", "120s"}}}};
    if (auto r = c.gateway().Call("POST", "/system/functions", d.dump());
        r.status != 200 && r.status != 202) {
      fprintf(stderr, "deploy: %d %s\n", r.status, r.body.c_str());
      return false;
    }
    Sample warm;
    if (!Run(c, cfg, absl::StrCat(setup->name, "-p", pass, "-warm"), &warm))
      return false;
    setup->memory = MemoryUse(c);
    ok = true;
    for (int i = 0; i < cfg.runs && ok; ++i) {
      Sample s;
      ok = Run(c, cfg, absl::StrCat(setup->name, "-p", pass, "-r", i), &s);
      if (ok) setup->samples.push_back(s);
    }
    fprintf(stderr, "bench_imbalanced: pass %d %s done (memory %s)\n", pass,
            setup->name.c_str(), setup->memory.c_str());
  }  // the cluster stops here
  std::filesystem::remove_all(dir);
  return ok;
}

template <typename F>
double MedianOf(const Setup& s, F f) {
  std::vector<double> v;
  for (const auto& x : s.samples) v.push_back(f(x));
  return Median(v);
}

void Print(const Config& cfg, const Setup& s) {
  const std::string& p = s.name;
  double wall = MedianOf(s, [](const Sample& x) { return x.wall_ms; });
  printf("%s_runs=%zu\n", p.c_str(), s.samples.size());
  printf("%s_run_ms=%.1f\n", p.c_str(), wall);
  printf("%s_produce_ms=%.1f\n", p.c_str(),
         MedianOf(s, [](const Sample& x) { return x.produce_ms; }));
  printf("%s_transform_ms=%.1f\n", p.c_str(),
         MedianOf(s, [](const Sample& x) { return x.transform_ms; }));
  printf("%s_reduce_ms=%.1f\n", p.c_str(),
         MedianOf(s, [](const Sample& x) { return x.reduce_ms; }));
  printf("%s_transform_on_node_a=%.2f\n", p.c_str(),
         MedianOf(s, [](const Sample& x) { return x.transform_on_a; }));
  uint64_t shards = 0, on_b = 0, bytes = 0, bytes_b = 0;
  for (const auto& x : s.samples) {
    shards += x.shards;
    on_b += x.shards_on_b;
    bytes += x.bytes;
    bytes_b += x.bytes_on_b;
  }
  printf("%s_records_shards=%.1f\n", p.c_str(),
         s.samples.empty() ? 0.0 : double(shards) / s.samples.size());
  printf("%s_records_arena_mib=%.1f\n", p.c_str(),
         s.samples.empty() ? 0.0 : bytes / 1048576.0 / s.samples.size());
  if (p == "imbalanced") {
    printf("imbalanced_shards_on_b=%.2f\n",
           shards ? double(on_b) / shards : 0.0);
    double to_a = 0, to_b = 0;
    for (const auto& x : s.samples) {
      to_a += x.entry == "node-a";
      to_b += x.entry == "node-b";
    }
    printf("imbalanced_calls_to_node_a=%.2f\n",
           s.samples.empty() ? 0.0 : to_a / s.samples.size());
    printf("imbalanced_calls_to_node_b=%.2f\n",
           s.samples.empty() ? 0.0 : to_b / s.samples.size());
    printf("imbalanced_bytes_on_b=%.2f\n",
           bytes ? double(bytes_b) / bytes : 0.0);
  }
  printf("%s_memory_after_warmup=%s\n", p.c_str(), s.memory.c_str());
  printf("%s_records_per_s=%.0f\n", p.c_str(),
         wall > 0 ? cfg.n / (wall / 1000) : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    uint64_t v = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--n") cfg.n = std::max<uint64_t>(1, v);
    if (flag == "--rounds") cfg.rounds = v;
    if (flag == "--runs") cfg.runs = std::max(1, static_cast<int>(v));
    if (flag == "--passes") cfg.passes = std::max(1, static_cast<int>(v));
    if (flag == "--a-mib") cfg.a_mib = std::max<uint64_t>(1, v);
    if (flag == "--b-mib") cfg.b_mib = std::max<uint64_t>(1, v);
  }
  if (geteuid() != 0) {
    fprintf(stderr,
            "bench_imbalanced: run as root (instances run sandboxed, nodes in "
            "network namespaces)\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  Setup balanced{.name = "balanced"}, imbalanced{.name = "imbalanced"};
  for (int pass = 0; pass < cfg.passes; ++pass) {
    if (!Measure(cfg, /*imbalanced=*/false, pass, &balanced)) return 1;
    if (!Measure(cfg, /*imbalanced=*/true, pass, &imbalanced)) return 1;
  }
  std::string sum = balanced.samples.front().sum;
  for (const Setup* s : {&balanced, &imbalanced})
    for (const auto& x : s->samples)
      if (x.sum != sum) {
        fprintf(stderr, "sums disagree: %s vs %s\n", x.sum.c_str(),
                sum.c_str());
        return 1;
      }
  double records_mib = cfg.n * 64 / 1048576.0;
  printf("records=%llu\n", static_cast<unsigned long long>(cfg.n));
  printf("rounds=%llu\n", static_cast<unsigned long long>(cfg.rounds));
  printf("records_mib=%.1f\n", records_mib);
  printf("node_a=cpus:2,memory_mib:%llu\n",
         static_cast<unsigned long long>(cfg.a_mib));
  printf("node_b=cpus:1,memory_mib:%llu\n",
         static_cast<unsigned long long>(cfg.b_mib));
  printf("balanced_node=cpus:2,memory_mib:%llu\n",
         static_cast<unsigned long long>(cfg.a_mib + cfg.b_mib));
  printf("passes=%d\n", cfg.passes);
  printf("physical_cores=%u\n", std::thread::hardware_concurrency());
  Print(cfg, balanced);
  Print(cfg, imbalanced);
  double b = MedianOf(balanced, [](const Sample& x) { return x.wall_ms; });
  double i = MedianOf(imbalanced, [](const Sample& x) { return x.wall_ms; });
  printf("imbalanced_vs_balanced=%.2f\n", i > 0 ? b / i : 0.0);
  return 0;
}
