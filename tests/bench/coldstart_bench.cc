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
//   cold     Silt's restore from disk: the node restarted with nothing held
//            ahead (--resident-memory-mib 0: no staged restorer, no
//            template), the function's files (its image and bundle) dropped
//            from the page cache before each start; the call reads its
//            whole heap
//   criu_cold  the same for the baseline (libcriu, Silt's options)
//   cold_lookup, criu_cold_lookup  the same for a second function with the
//            same state whose calls read little of it (GET /state)
// plus the bare start cost the invoker reports (X-Silt-Start-Ms). Starts of
// every tier but burst are --gap-ms apart (independent cold starts, as they
// arrive when a function has no idle instance).
//
// Then density (--density N functions, 0 skips it): N functions with 16 MiB
// of init state each, deployed on one fresh node and scaled to zero (each
// phase starts with no instance running), and N cold starts spread
// over them in a random order, the same order twice: once on a node as Silt
// runs by default (staged restorers and templates within the default
// resident budget), once on the same node restarted as the libcriu baseline
// (--criu-restore --resident-memory-mib 0: every restore is libcriu's, nothing
// is held ahead). Each reports restore p50/p99 and what the node's processes
// hold afterwards (PSS of the invoker and everything under it), next to the
// single-function restore p50 of one of the same functions on the same node.
//
//   sudo build/tests/bench/bench_coldstart [--runs 30] [--sizes 1,64,256]
//                                          [--gap-ms 50] [--density 200]
//
// Ends with name=value lines: restore_speedup_vs_criu_64MiB=<criu p50 /
// restore p50>, cold_restore_speedup_vs_criu_64MiB=<criu_cold p50 / cold
// p50>, density_restore_p50_over_single=... and the density figures.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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

// What the invoker `pid` and every process under it hold (PSS, MiB).
double NodePssMiB(pid_t pid) {
  std::map<pid_t, pid_t> parent;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    pid_t p = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &p)) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), {});
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> f =
        absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
    pid_t pp = 0;
    if (f.size() > 1 && absl::SimpleAtoi(f[1], &pp)) parent[p] = pp;
  }
  double kib = 0;
  for (const auto& [p, pp] : parent) {
    pid_t a = p;
    for (int depth = 0; a > 1 && a != pid && depth < 64; ++depth)
      a = parent.contains(a) ? parent[a] : 0;
    if (a != pid) continue;
    std::ifstream in(absl::StrCat("/proc/", p, "/smaps_rollup"));
    std::string line;
    while (std::getline(in, line)) {
      double v = 0;
      if (line.rfind("Pss:", 0) == 0 &&
          absl::SimpleAtod(
              absl::StripAsciiWhitespace(line.substr(4, line.size() - 4 - 3)),
              &v)) {
        kib += v;
        break;
      }
    }
  }
  return kib / 1024;
}

// Drops every file under `dir` from the page cache (a function whose image
// nothing has read lately: on disk only); returns how many KiB of them are
// still cached afterwards (0 unless something maps them).
uint64_t EvictFromPageCache(const std::string& dir) {
  uint64_t cached_kib = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(
           dir, std::filesystem::directory_options::skip_permission_denied, ec);
       !ec && it != std::filesystem::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    int fd = open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    off_t size = lseek(fd, 0, SEEK_END);
    if (size > 0) {
      void* m = mmap(nullptr, size, PROT_NONE, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) {
        std::vector<unsigned char> vec((size + 4095) / 4096);
        if (mincore(m, size, vec.data()) == 0)
          for (unsigned char v : vec) cached_kib += (v & 1) * 4;
        munmap(m, size);
      }
    }
    close(fd);
  }
  return cached_kib;
}

struct Samples {
  std::vector<double> e2e, start;
  int errors = 0;
};

// e2e p50 of tier `a` over that of tier `b`.
double Ratio(std::map<std::string, Samples>& r, const char* a, const char* b) {
  return Pct(r[a].e2e, 0.5) / std::max(1e-9, Pct(r[b].e2e, 0.5));
}

// One cold start of `fn` forced to `tier`: e2e ms, or a negative value on
// an error (printed once per phase by the caller).
double ColdStart(GatewayProcess& gw, const std::string& fn,
                 const std::string& tier, std::string* error) {
  auto t0 = Clock::now();
  auto r = gw.Call("GET", "/function/" + fn + "/heap", "", false,
                   {{"X-Silt-Cold-Start", tier}});
  double ms =
      std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::string started(r.Header("X-Silt-Start"));
  if (r.status == 200 && (started == "restore" || started == "criu")) return ms;
  *error = absl::StrCat(fn, ": ", r.status, " ", started, " ", r.body);
  return -1;
}

// Waits until the node "dense" runs no instance (they were scaled to zero
// and end after a second idle), so that a phase starts on a quiet node.
void WaitDenseIdle(GatewayProcess& gw) {
  for (int t = 0; t < 600; ++t) {
    json j = json::parse(gw.Call("GET", "/system/nodes").body, nullptr, false);
    for (const auto& n : j)
      if (n.is_object() && n.value("name", "") == "dense" &&
          n.value("instances", 1) == 0)
        return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  fprintf(stderr, "density: instances still running on the node\n");
}

struct DensityPhase {
  double single_p50 = 0, p50 = 0, p99 = 0, pss_mib = 0;
  int errors = 0;
};

// Density: see the file comment. `order` indexes the functions dense0...
DensityPhase RunDensityPhase(GatewayProcess& gw, Process& node, int n,
                             const std::vector<int>& order, int runs,
                             int gap_ms) {
  DensityPhase out;
  std::string error;
  auto note = [&](double ms, std::vector<double>* into) {
    if (ms >= 0) {
      if (into) into->push_back(ms);
      return;
    }
    if (out.errors++ == 0) fprintf(stderr, "density: %s\n", error.c_str());
  };
  // Every image once, untimed: both nodes start from the same state (images
  // verified, in the page cache).
  for (int i = 0; i < n; ++i)
    note(ColdStart(gw, absl::StrCat("dense", i), "restore", &error), nullptr);
  WaitDenseIdle(gw);
  std::vector<double> single, spread;
  for (int i = 0; i < runs; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
    note(ColdStart(gw, "dense0", "restore", &error), &single);
  }
  WaitDenseIdle(gw);
  for (int i : order) {
    std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
    note(ColdStart(gw, absl::StrCat("dense", i), "restore", &error), &spread);
  }
  out.single_p50 = Pct(single, 0.5);
  out.p50 = Pct(spread, 0.5);
  out.p99 = Pct(spread, 0.99);
  out.pss_mib = NodePssMiB(node.pid());
  return out;
}

// Waits until the gateway lists the node "dense".
bool WaitDenseNode(GatewayProcess& gw) {
  for (int t = 0; t < 300; ++t) {
    json j = json::parse(gw.Call("GET", "/system/nodes").body, nullptr, false);
    for (const auto& n : j)
      if (n.is_object() && n.value("name", "") == "dense") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

std::unique_ptr<Process> StartDenseNode(GatewayProcess& gw,
                                        const std::string& dir,
                                        std::vector<std::string> extra) {
  std::vector<std::string> argv = {SILT_INVOKER_BIN,
                                   "--gateway",
                                   gw.grpc_address(),
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--data-dir",
                                   dir + "/dense",
                                   "--node-name",
                                   "dense",
                                   "--idle-timeout",
                                   "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto p = Process::Start(argv);
  if (!p.ok() ||
      !p->WaitForLine("listening on ", std::chrono::seconds(30)).ok() ||
      !WaitDenseNode(gw))
    return nullptr;
  return std::make_unique<Process>(*std::move(p));
}

// Deploys `name` (the probe image with `mb` MiB of init state) and calls
// `path` until its snapshot is in the catalog with `field` true (the first
// call boots and checkpoints).
bool DeployAndSnapshot(GatewayProcess& gw, const std::string& name,
                       const std::string& image, int mb,
                       const std::string& path, const char* field) {
  json d = {{"service", name},
            {"image", image},
            {"envVars", {{"STATE_MB", std::to_string(mb)}}}};
  if (gw.Call("POST", "/system/functions", d.dump()).status != 200) {
    fprintf(stderr, "deploy %s failed\n", name.c_str());
    return false;
  }
  for (int i = 0; i < 300; ++i) {
    auto r = gw.Call("GET", "/function/" + name + path, "", false);
    json j = json::parse(gw.Call("GET", "/system/snapshots/" + name).body,
                         nullptr, false);
    if (r.status == 200 && j.is_array() && !j.empty() &&
        j[0].value(field, false))
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 30;
  int gap_ms = 50;
  std::vector<int> sizes = {1, 64, 256};
  int density = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--runs") runs = std::atoi(argv[i + 1]);
    if (a == "--gap-ms") gap_ms = std::atoi(argv[i + 1]);
    if (a == "--density") density = std::atoi(argv[i + 1]);
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
    // A staged restorer (the fork tier's template is made when first asked
    // for).
    if (!DeployAndSnapshot(*gw, name, image, mb, "/heap", "staged")) return 1;
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
  // Cold: the node restarted with nothing held ahead; before each start the
  // function's files leave the page cache.
  inv->Stop(SIGTERM);
  inv = Process::Start({SILT_INVOKER_BIN, "--gateway", gw->grpc_address(),
                        "--listen", "127.0.0.1:0", "--data-dir", dir + "/node",
                        "--node-name", "bench", "--resident-memory-mib", "0"});
  if (!inv.ok() ||
      !inv->WaitForLine("listening on ", std::chrono::seconds(30)).ok()) {
    fprintf(stderr, "invoker did not start again\n");
    return 1;
  }
  for (int t = 0; t < 300; ++t) {  // registered again
    std::string e;
    if (ColdStart(*gw, absl::StrCat("state", sizes[0]), "restore", &e) >= 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  uint64_t left_cached_kib = 0;
  // A second function per size, same image and state, whose calls read a
  // little of it (a lookup in a big table, not a scan): booted and
  // checkpointed on this node.
  for (int mb : sizes) {
    std::string name = absl::StrCat("lookup", mb);
    if (!DeployAndSnapshot(*gw, name, image, mb, "/state", "current")) return 1;
  }
  struct ColdTier {
    const char* tier;
    const char* force;
    const char* function;  // + size
    const char* path;
  };
  const ColdTier cold_tiers[] = {
      {"cold", "restore", "state", "/heap"},
      {"criu_cold", "criu", "state", "/heap"},
      {"cold_lookup", "restore", "lookup", "/state"},
      {"criu_cold_lookup", "criu", "lookup", "/state"}};
  for (int mb : sizes) {
    for (const auto& [tier, force, function, path] : cold_tiers) {
      std::string name = absl::StrCat(function, mb);
      Samples& smp = results[mb][tier];
      for (int i = 0; i < runs + 1; ++i) {
        // The last forced instance is torn down within the reaper's 100 ms
        // period: until then it maps the image and holds it in the cache.
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::max(gap_ms, 200)));
        // The function's own files (its images and bundle) leave the page
        // cache; the node's programs (silt-worker, silt-restorer, criu and
        // their libraries) stay, as on any node that runs other functions.
        for (const char* sub : {"/node/snapshots", "/node/bundles"})
          left_cached_kib =
              std::max(left_cached_kib, EvictFromPageCache(dir + sub));
        auto t0 = Clock::now();
        auto r = gw->Call("GET", "/function/" + name + path, "", false,
                          {{"X-Silt-Cold-Start", force}});
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0)
                        .count();
        if (i == 0) continue;
        if (r.status != 200 || r.Header("X-Silt-Start") != force) {
          if (smp.errors++ == 0)
            fprintf(stderr, "%s %d MiB: %d %s %s\n", tier, mb, r.status,
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
  std::vector<std::string> all_tiers = tiers;
  for (const auto& c : cold_tiers) all_tiers.push_back(c.tier);

  printf("%-8s %-16s %12s %12s %12s %12s %7s\n", "heap", "tier", "e2e_p50_ms",
         "e2e_p99_ms", "start_p50_ms", "start_p99_ms", "errors");
  for (int mb : sizes) {
    for (const auto& tier : all_tiers) {
      const Samples& s = results[mb][tier];
      printf("%-8s %-16s %12.2f %12.2f %12.2f %12.2f %7d\n",
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
    printf(
        "%dMiB: from disk, restore %.2fx faster than CRIU (criu_cold over "
        "cold, e2e p50), %.2fx for a call that reads little of its state\n",
        mb, Ratio(r, "criu_cold", "cold"),
        Ratio(r, "criu_cold_lookup", "cold_lookup"));
  }
  // Should be 0: what stayed in the page cache of the node's data dir right
  // after an eviction (something mapped it).
  printf("cold_left_cached_kib=%llu\n",
         static_cast<unsigned long long>(left_cached_kib));
  if (results.contains(64)) {
    auto& r = results[64];
    printf("fork_speedup_vs_criu_64MiB=%.2f\n",
           Pct(r["criu"].e2e, 0.5) / std::max(1e-9, Pct(r["fork"].e2e, 0.5)));
    printf("restore_burst_speedup_vs_criu_64MiB=%.2f\n",
           Pct(r["criu"].e2e, 0.5) / std::max(1e-9, Pct(r["burst"].e2e, 0.5)));
    printf(
        "restore_speedup_vs_criu_64MiB=%.2f\n",
        Pct(r["criu"].e2e, 0.5) / std::max(1e-9, Pct(r["restore"].e2e, 0.5)));
    printf("cold_restore_speedup_vs_criu_64MiB=%.2f\n",
           Ratio(r, "criu_cold", "cold"));
    printf("cold_lookup_restore_speedup_vs_criu_64MiB=%.2f\n",
           Ratio(r, "criu_cold_lookup", "cold_lookup"));
  }
  if (density > 0) {
    // The functions go to a node of their own ("dense"), as Silt runs by
    // default; each boots once and is checkpointed.
    auto dense = StartDenseNode(*gw, dir, {});
    if (dense == nullptr) {
      fprintf(stderr, "density: the node did not start\n");
      return 1;
    }
    for (int i = 0; i < density; ++i) {
      json d = {{"service", absl::StrCat("dense", i)},
                {"image", image},
                {"constraints", json::array({"node.name==dense"})},
                {"envVars", {{"STATE_MB", "16"}}}};
      int code = 0;
      for (int t = 0; t < 100 && code != 200; ++t) {  // until the node is up
        code = gw->Call("POST", "/system/functions", d.dump()).status;
        if (code == 200) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      auto r = gw->Call("GET", absl::StrCat("/function/dense", i, "/heap"), "",
                        false);
      if (code != 200 || r.status != 200) {
        fprintf(stderr, "density: dense%d: %d %s\n", i, r.status,
                r.body.c_str());
        return 1;
      }
      // Scaled to zero, as a function that is not being called would be:
      // no warm replica waits, every call below is a cold start.
      json zero = {{"serviceName", absl::StrCat("dense", i)}, {"replicas", 0}};
      gw->Call("POST", absl::StrCat("/system/scale-function/dense", i),
               zero.dump());
    }
    for (int t = 0; t < 1200; ++t) {  // every snapshot in the catalog
      json j = json::parse(gw->Call("GET", "/system/snapshots").body, nullptr,
                           false);
      int n = 0;
      for (const auto& s : j)
        if (absl::StartsWith(s.value("name", ""), "dense") &&
            s.value("current", false))
          ++n;
      if (n >= density) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::mt19937 rng(42);
    std::vector<int> order;
    for (int i = 0; i < density; ++i) order.push_back(i);
    std::shuffle(order.begin(), order.end(), rng);
    DensityPhase silt =
        RunDensityPhase(*gw, *dense, density, order, runs, gap_ms);
    dense->Stop(SIGTERM);
    dense = StartDenseNode(*gw, dir,
                           {"--criu-restore", "--resident-memory-mib", "0"});
    if (dense == nullptr) {
      fprintf(stderr, "density: the baseline node did not start\n");
      return 1;
    }
    for (int t = 0; t < 300; ++t) {  // registered again
      std::string e;
      if (ColdStart(*gw, "dense0", "restore", &e) >= 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    DensityPhase criu =
        RunDensityPhase(*gw, *dense, density, order, runs, gap_ms);
    dense->Stop(SIGTERM);
    printf(
        "\ndensity: %d functions x 16 MiB on one node, %d cold starts in "
        "random order\n",
        density, density);
    printf("%-8s %14s %12s %12s %14s %7s\n", "node", "single_p50_ms", "p50_ms",
           "p99_ms", "node_pss_mib", "errors");
    for (const auto& [name, d] :
         {std::pair<const char*, DensityPhase&>{"silt", silt}, {"criu", criu}})
      printf("%-8s %14.2f %12.2f %12.2f %14.1f %7d\n", name, d.single_p50,
             d.p50, d.p99, d.pss_mib, d.errors);
    printf("density_restore_p50_over_single=%.2f\n",
           silt.p50 / std::max(1e-9, silt.single_p50));
    printf("density_restore_speedup_vs_criu=%.2f\n",
           criu.p50 / std::max(1e-9, silt.p50));
    printf("density_restore_p99_ms=%.2f\n", silt.p99);
    printf("density_node_pss_mib_silt=%.1f\n", silt.pss_mib);
    printf("density_node_pss_mib_criu=%.1f\n", criu.pss_mib);
  }
  inv->Stop(SIGTERM);
  gw->Stop(SIGTERM);
  std::filesystem::remove_all(dir);
  return 0;
}
