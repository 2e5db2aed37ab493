// Cold-start benchmark: end-to-end latency (HTTP request to response through
// the gateway) of a call served by a new instance, for functions with 1, 64
// and 256 MiB of heap built in init, per start tier, all in one run:
//   boot     exec of a sandboxed worker + the function's init
//   criu     CRIU at its best on the same image: libcriu with the options
//            Silt's own CRIU path uses (empty network namespace, loopback
//            brought up, kdat cached, images in the page cache)
//   restore  Silt's restore (silt-restorer staged ahead in a ready sandbox,
//            mapping the image; see README "Cold starts")
//   fork     a clone forked from the resident template
//   warm     an idle instance (the floor)
//   burst    Silt's restore again, the starts back to back: each one finds
//            the node still busy with the last (its staged restorer used up)
// plus the bare start cost the invoker reports (X-Silt-Start-Ms). Starts of
// every tier but burst are --gap-ms apart (independent cold starts, as they
// arrive when a function has no idle instance).
//
//   sudo build/tests/bench/bench_coldstart [--runs 30] [--sizes 1,64,256]
//                                          [--gap-ms 50]
//
// Last line: restore_speedup_vs_criu_64MiB=<criu p50 / restore p50>.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/gateway_process.h"
#include "common/process.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using silt::testing::GatewayProcess;
using silt::testing::Process;
using silt::testing::RunCommand;

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

struct Samples {
  std::vector<double> e2e, start;
  int errors = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 30;
  int gap_ms = 50;
  std::vector<int> sizes = {1, 64, 256};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--runs") runs = std::atoi(argv[i + 1]);
    if (a == "--gap-ms") gap_ms = std::atoi(argv[i + 1]);
    if (a == "--sizes") {
      sizes.clear();
      for (auto s : absl::StrSplit(argv[i + 1], ','))
        sizes.push_back(std::atoi(std::string(s).c_str()));
    }
  }
  if (geteuid() != 0) {
    fprintf(stderr, "bench_coldstart: run as root (sandboxes, CRIU)\n");
    return 2;
  }
  std::string dir = silt::testing::MakeTempDir("silt-coldstart");
  auto gw = GatewayProcess::Start(dir + "/gateway", {});
  if (!gw.ok()) {
    fprintf(stderr, "gateway: %s\n",
            std::string(gw.status().message()).c_str());
    return 1;
  }
  auto inv =
      Process::Start({SILT_INVOKER_BIN, "--gateway", gw->grpc_address(),
                      "--listen", "127.0.0.1:0", "--data-dir", dir + "/node",
                      "--node-name", "bench", "--resident-memory-mib", "2048"});
  if (!inv.ok() ||
      !inv->WaitForLine("listening on ", std::chrono::seconds(30)).ok()) {
    fprintf(stderr, "invoker did not start\n");
    return 1;
  }
  std::vector<std::pair<std::string, std::string>> env = {
      {"OPENFAAS_URL", gw->url()}, {"OPENFAAS_CONFIG", dir + "/config"}};
  RunCommand({SILT_CLI_BIN, "login", "--password-stdin"}, gw->password(), env);
  std::ofstream(dir + "/stack.yml")
      << "version: 1.0\nprovider:\n  name: openfaas\nfunctions:\n  probe:\n"
      << "    lang: cpp\n    handler: " << SILT_SOURCE_DIR
      << "/tests/functions/probe\n    image: probe\n";
  auto b =
      RunCommand({SILT_CLI_BIN, "build", "-f", dir + "/stack.yml"}, "", env);
  auto p =
      RunCommand({SILT_CLI_BIN, "push", "-f", dir + "/stack.yml"}, "", env);
  if (b.exit_code != 0 || p.exit_code != 0) {
    fprintf(stderr, "build/push failed: %s %s\n", b.err.c_str(), p.err.c_str());
    return 1;
  }
  std::string image = "probe@" + p.out.substr(p.out.find("sha256:"), 71);

  const std::vector<std::string> tiers = {"boot", "criu", "restore",
                                          "fork", "warm", "burst"};
  std::map<int, std::map<std::string, Samples>> results;
  for (int mb : sizes) {
    std::string name = absl::StrCat("state", mb);
    json d = {{"service", name},
              {"image", image},
              {"envVars", {{"STATE_MB", std::to_string(mb)}}}};
    if (gw->Call("POST", "/system/functions", d.dump()).status != 200) {
      fprintf(stderr, "deploy %s failed\n", name.c_str());
      return 1;
    }
    // First call: boot and snapshot; then wait for the catalog and template.
    for (int i = 0; i < 300; ++i) {
      auto r = gw->Call("GET", "/function/" + name + "/heap", "", false);
      auto s = gw->Call("GET", "/system/snapshots/" + name);
      json j = json::parse(s.body, nullptr, false);
      if (r.status == 200 && j.is_array() && !j.empty() &&
          j[0].value("template", false))
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (const auto& tier : tiers) {
      Samples& smp = results[mb][tier];
      const std::string force = tier == "burst" ? "restore" : tier;
      for (int i = 0; i < runs + 1; ++i) {
        if (tier != "burst")
          std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
        silt::deploy::Headers h;
        if (tier != "warm") h.push_back({"X-Silt-Cold-Start", force});
        auto t0 = Clock::now();
        auto r = gw->Call("GET", "/function/" + name + "/heap", "", false, h);
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0)
                        .count();
        if (i == 0) continue;  // first one warms caches
        if (r.status != 200 || r.Header("X-Silt-Start") != force) {
          ++smp.errors;
          if (smp.errors == 1)
            fprintf(stderr, "%s %d MiB: %d %s %s\n", tier.c_str(), mb, r.status,
                    std::string(r.Header("X-Silt-Start")).c_str(),
                    r.body.c_str());
          continue;
        }
        double start = 0;
        (void)absl::SimpleAtod(r.Header("X-Silt-Start-Ms"), &start);
        smp.e2e.push_back(ms);
        smp.start.push_back(start);
      }
    }
  }
  printf("%-8s %-8s %12s %12s %12s %12s %7s\n", "heap", "tier", "e2e_p50_ms",
         "e2e_p99_ms", "start_p50_ms", "start_p99_ms", "errors");
  for (int mb : sizes) {
    for (const auto& tier : tiers) {
      const Samples& s = results[mb][tier];
      printf("%-8s %-8s %12.2f %12.2f %12.2f %12.2f %7d\n",
             absl::StrCat(mb, "MiB").c_str(), tier.c_str(), Pct(s.e2e, 0.5),
             Pct(s.e2e, 0.99), Pct(s.start, 0.5), Pct(s.start, 0.99), s.errors);
    }
  }
  for (int mb : sizes) {
    auto& r = results[mb];
    double criu = Pct(r["criu"].e2e, 0.5);
    printf(
        "%dMiB: restore %.2fx (burst %.2fx), fork %.2fx, boot %.2fx faster "
        "than CRIU (libcriu with Silt's options; e2e p50)\n",
        mb, criu / std::max(1e-9, Pct(r["restore"].e2e, 0.5)),
        criu / std::max(1e-9, Pct(r["burst"].e2e, 0.5)),
        criu / std::max(1e-9, Pct(r["fork"].e2e, 0.5)),
        criu / std::max(1e-9, Pct(r["boot"].e2e, 0.5)));
  }
  if (results.contains(64)) {
    auto& r = results[64];
    printf("fork_speedup_vs_criu_64MiB=%.2f\n",
           Pct(r["criu"].e2e, 0.5) / std::max(1e-9, Pct(r["fork"].e2e, 0.5)));
    printf("restore_burst_speedup_vs_criu_64MiB=%.2f\n",
           Pct(r["criu"].e2e, 0.5) / std::max(1e-9, Pct(r["burst"].e2e, 0.5)));
    printf(
        "restore_speedup_vs_criu_64MiB=%.2f\n",
        Pct(r["criu"].e2e, 0.5) / std::max(1e-9, Pct(r["restore"].e2e, 0.5)));
  }
  inv->Stop(SIGTERM);
  gw->Stop(SIGTERM);
  std::filesystem::remove_all(dir);
  return 0;
}
