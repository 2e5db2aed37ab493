// Compute proclet benchmarks on a two-node cluster (invokers in their own
// network namespaces, joined by veth pairs on a bridge), with the pipeline
// example (examples/pipeline).
//
//   sudo build/tests/bench/bench_compute [--mib 64] [--runs 5] [--only
//   vector|map]
//
// Remote scan: one compute proclet (ctx.Spawn of the pipeline's ScanRecords,
// the function pinned to node-b) reads every record of a --mib MiB vector
// through the SDK's prefetching scanner, with the vector's shards all on
// node-b (local: through this node's invoker, no network) and then all on
// node-a (remote: each block crosses the network). The baseline is the same
// scan, same code and same data, local; the figure is local time / remote
// time (1.0: a remote shard costs nothing extra). Scan time is measured
// inside the task (the job's dispatch is the same in both), the median of
// --runs after one warm-up. The same again for the same records in a
// sharded map (id -> record), read with Map::Scan: remote_map_scan_*.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using silt::testing::Cluster;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

json Call(Cluster& c, const std::string& query) {
  auto r = c.gateway().Call("POST", "/function/pipeline?" + query, "",
                            /*with_auth=*/false);
  if (r.status != 200) {
    fprintf(stderr, "pipeline %s: %d %s\n", query.c_str(), r.status,
            r.body.c_str());
    return json();
  }
  return json::parse(r.body, nullptr, false);
}

// Moves every shard of `structure` to `node`; false if one would not go.
bool MoveAll(Cluster& c, const std::string& structure,
             const std::string& node) {
  auto all = json::parse(c.gateway().Call("GET", "/system/proclets").body,
                         nullptr, false);
  for (const auto& p : all) {
    if (p.value("structure", "") != structure || p.value("node", "") == node)
      continue;
    uint64_t id = p.value("id", uint64_t{0});
    auto r = c.gateway().Call("POST",
                              absl::StrCat("/system/proclets/", id, "/migrate"),
                              json{{"node", node}}.dump());
    if (r.status != 200) {
      fprintf(stderr, "migrate %llu to %s: %s\n",
              static_cast<unsigned long long>(id), node.c_str(),
              r.body.c_str());
      return false;
    }
  }
  return true;
}

// Scans `runs` times (after a warm-up): the task's scan times. op: scan (a
// vector) or scan-map.
std::vector<double> Scans(Cluster& c, const std::string& op,
                          const std::string& input, int runs,
                          std::string* sum) {
  std::vector<double> ms;
  for (int i = 0; i <= runs; ++i) {
    json r = Call(c, "op=" + op + "&input=" + input);
    if (r.is_null()) return {};
    *sum = r.value("sum", "");
    if (i > 0) ms.push_back(r.value("scan_ms", 0.0));
  }
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int mib = 64, runs = 5;
  std::string only;  // --only vector|map
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--mib") mib = std::max(1, std::atoi(argv[i + 1]));
    if (flag == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
    if (flag == "--only") only = argv[i + 1];
  }
  if (geteuid() != 0) {
    fprintf(stderr,
            "bench_compute: run as root (instances run sandboxed, nodes in "
            "network namespaces)\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  std::string dir = silt::testing::MakeTempDir("silt-bench-compute");
  auto cluster = Cluster::Start(dir);
  if (!cluster.ok()) {
    fprintf(stderr, "cluster: %s\n",
            std::string(cluster.status().message()).c_str());
    return 2;
  }
  Cluster& c = **cluster;
  for (const char* name : {"node-a", "node-b"}) {
    if (auto s = c.AddNode({.name = name, .memory_mib = 1 << 20}); !s.ok()) {
      fprintf(stderr, "%s: %s\n", name, std::string(s.message()).c_str());
      return 2;
    }
  }
  if (!c.WaitNodes(2).ok()) return 2;
  auto image = c.BuildAndPush(
      "pipeline", std::string(SILT_SOURCE_DIR) + "/examples/pipeline/pipeline");
  if (!image.ok()) {
    fprintf(stderr, "%s\n", std::string(image.status().message()).c_str());
    return 2;
  }
  json d = {{"service", "pipeline"},
            {"image", *image},
            {"envVars", {{"exec_timeout", "120s"}}},
            {"constraints", {"node.name==node-b"}}};
  if (c.gateway().Call("POST", "/system/functions", d.dump()).status != 200)
    return 2;
  // 64-byte records.
  uint64_t n = (uint64_t{static_cast<unsigned>(mib)} << 20) / 64;
  if (Call(c, absl::StrCat("op=produce&input=scan&rounds=1&n=", n)).is_null())
    return 2;

  if (Call(c, absl::StrCat("op=produce-map&input=scanmap&n=", n)).is_null())
    return 2;

  // The vector, then the map (same records, keyed by id).
  for (const char* kind : {"vector", "map"}) {
    const bool map = std::string(kind) == "map";
    if (!only.empty() && only != kind) continue;
    const std::string op = map ? "scan-map" : "scan";
    const std::string input = map ? "scanmap" : "scan";
    const std::string prefix = map ? "remote_map_scan" : "remote_scan";
    std::string local_sum, remote_sum;
    if (!MoveAll(c, input, "node-b")) return 2;
    std::vector<double> local = Scans(c, op, input, runs, &local_sum);
    if (!MoveAll(c, input, "node-a")) return 2;
    std::vector<double> remote = Scans(c, op, input, runs, &remote_sum);
    if (local.empty() || remote.empty() || local_sum != remote_sum) {
      fprintf(stderr, "%s scans failed or disagree (%s vs %s)\n", kind,
              local_sum.c_str(), remote_sum.c_str());
      return 1;
    }
    double l = Median(local), r = Median(remote);
    printf("%s_mib=%d\n", prefix.c_str(), mib);
    printf("%s_local_ms=%.1f\n", prefix.c_str(), l);
    printf("%s_remote_ms=%.1f\n", prefix.c_str(), r);
    printf("%s_local_mib_per_s=%.0f\n", prefix.c_str(), mib / (l / 1000));
    printf("%s_remote_mib_per_s=%.0f\n", prefix.c_str(), mib / (r / 1000));
    printf("%s_vs_local=%.2f\n", prefix.c_str(), l / r);
  }
  cluster->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
