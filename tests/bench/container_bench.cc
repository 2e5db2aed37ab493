// Container functions against bundles, in one run on one node: the same
// function (an HTTP echo server, tests/images/watchdog.cc `echo-server`) as
// an OCI image behind its of-watchdog in HTTP mode (imported with `silt image
// import`, run by the invoker's own containerd: runc, overlayfs, a CNI
// bridge address), and as an exec bundle in HTTP mode (the server in a
// sandbox of the invoker's, silt-worker its proxy).
//
// Cold starts (end to end through the gateway, X-Silt-Cold-Start forcing
// the tier; each start a new instance, --gap-ms apart; also the start cost
// the invoker reports, X-Silt-Start-Ms):
//   container_boot     containerd container + task create, CNI, start, the
//                      watchdog's /_/health, the worker joining its netns
//   container_criu     restored from the checkpoint of the function's first
//                      instance by containerd's Tasks API (runc restore,
//                      CRIU: the baseline, as podman or ctr restore it)
//   container_restore  Silt's restore: the instance the invoker restored
//                      from that checkpoint ahead of need and froze, thawed
//                      (each start waits until the next one is staged)
//   slow_init_boot, slow_init_criu, slow_init_restore  the same for an image
//                      whose server builds --init-mib MiB of state and
//                      spends --init-ms before it listens (an app's imports)
//   bundle_boot        the bundle's server exec'd in a sandbox
//   bundle_restore     the bundle restored from its snapshot, where CRIU can
//                      checkpoint its listening socket (else it boots: the
//                      tier served is printed)
// Warm throughput and p50/p99 at 1 and 8 connections (closed loop,
// keep-alive to the gateway), container against bundle.
//
//   sudo build/tests/bench/bench_container [--runs 20] [--seconds 3]
//                                          [--gap-ms 50]
//
// Ends with name=value lines, among them container_restore_vs_boot (boot
// p50 / restore p50), container_restore_vs_criu (runc restore p50 / Silt's
// restore p50), container_restore_vs_boot_slow_init,
// container_boot_p50_ms,
// container_warm_vs_bundle (container warm throughput / bundle warm
// throughput at 1 connection) and container_warm_vs_bundle_c8.
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

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/cluster.h"
#include "common/http_load.h"
#include "nlohmann/json.hpp"
#include "proclets/bundle.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using silt::testing::Cluster;
using silt::testing::RunCommand;
using Clock = std::chrono::steady_clock;

struct Starts {
  std::vector<double> e2e_ms, start_ms;
  std::map<std::string, int> tiers;  // the tier the invoker served
  std::string refused;               // why a start was refused, if one was
  int unstaged = 0;  // starts that found no instance staged within 10 s
};

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// How many instances of `fn` the invoker staged so far (its log says so
// for each; a frozen cgroup alone is no sign: CRIU restores a container's
// freezer state, frozen as it was dumped, and thaws it at the end).
int StagedSoFar(Cluster& c, const std::string& fn) {
  auto r = c.gateway().Call("GET", "/system/logs?name=" + fn);
  int n = 0;
  for (size_t at = 0;
       (at = r.body.find("next instance staged", at)) != std::string::npos;
       ++at)
    ++n;
  return n;
}

// Whether `fn` has more instances staged than `taken` within `timeout`.
bool WaitStaged(Cluster& c, const std::string& fn, int taken,
                std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (StagedSoFar(c, fn) <= taken) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

Starts ColdStarts(Cluster& c, const std::string& fn, const std::string& tier,
                  int runs, int gap_ms, bool staged) {
  Starts s;
  // Staged before this tier (and not taken since: nothing else starts it).
  int taken = staged ? std::max(StagedSoFar(c, fn) - 1, 0) : 0;
  for (int i = 0; i < runs; ++i) {
    if (staged && !WaitStaged(c, fn, taken, std::chrono::seconds(10)))
      ++s.unstaged;
    auto t0 = Clock::now();
    auto r = c.gateway().Call("POST", "/function/" + fn, "x", false,
                              {{"X-Silt-Cold-Start", tier}});
    double ms =
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (r.status != 200) {
      // The tier is not served for this function: say why, once.
      s.refused = absl::StrCat(r.status, " ", r.body);
      while (!s.refused.empty() && s.refused.back() == '\n')
        s.refused.pop_back();
      break;
    }
    double start = 0;
    (void)absl::SimpleAtod(r.Header("X-Silt-Start-Ms"), &start);
    s.e2e_ms.push_back(ms);
    s.start_ms.push_back(start);
    ++s.tiers[std::string(r.Header("X-Silt-Start"))];
    taken += r.Header("X-Silt-Start") == "restore";
    std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
  }
  return s;
}

std::string Served(const Starts& s) {
  if (!s.refused.empty()) return "refused: " + s.refused;
  std::string out;
  for (const auto& [tier, n] : s.tiers)
    absl::StrAppend(&out, out.empty() ? "" : ",", tier, ":", n);
  return out;
}

// What the staged (frozen) instance of `fn` holds: its container's
// processes' PSS, MiB (its worker, a few hundred KiB more, not counted).
double StagedPssMib(const std::string& fn) {
  double kib = 0;
  for (const std::string& id : silt::testing::FrozenContainers(fn + "-")) {
    std::ifstream procs("/sys/fs/cgroup/memory/silt-silt/" + id +
                        "/cgroup.procs");  // cgroup v1
    if (!procs) procs.open("/sys/fs/cgroup/silt-silt/" + id + "/cgroup.procs");
    for (int pid; procs >> pid;) {
      std::ifstream rollup(absl::StrCat("/proc/", pid, "/smaps_rollup"));
      for (std::string line; std::getline(rollup, line);) {
        double v = 0;
        if (line.rfind("Pss:", 0) == 0 &&
            absl::SimpleAtod(
                absl::StripSuffix(absl::StripAsciiWhitespace(line.substr(4)),
                                  " kB"),
                &v))
          kib += v;
      }
    }
  }
  return kib / 1024;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 20, gap_ms = 50, init_ms = 500, init_mib = 64;
  double seconds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--runs") runs = std::atoi(argv[i + 1]);
    if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    if (a == "--gap-ms") gap_ms = std::atoi(argv[i + 1]);
    if (a == "--init-ms") init_ms = std::atoi(argv[i + 1]);
    if (a == "--init-mib") init_mib = std::atoi(argv[i + 1]);
  }
  if (geteuid() != 0) {
    fprintf(stderr, "bench_container: run as root (containerd, sandboxes)\n");
    return 2;
  }
  std::string dir = silt::testing::MakeTempDir("bench-ctr");
  auto cluster = Cluster::Start(dir);
  if (!cluster.ok() || !(*cluster)->AddNode({.name = "node-a"}).ok() ||
      !(*cluster)->WaitNodes(1).ok()) {
    fprintf(stderr, "bench_container: cannot start a gateway and a node\n");
    return 1;
  }
  Cluster& c = **cluster;

  // The image: a busybox root and the watchdog, in HTTP mode.
  fs::create_directories(dir + "/rootfs/bin");
  fs::copy_file("/bin/busybox", dir + "/rootfs/bin/busybox");
  fs::create_symlink("busybox", dir + "/rootfs/bin/sh");
  fs::create_directories(dir + "/fn/usr/bin");
  fs::copy_file(SILT_TEST_WATCHDOG, dir + "/fn/usr/bin/fwatchdog");
  // Two images: the echo server as it is (no init), and one whose server
  // first builds --init-mib of state and spends --init-ms, as an app's
  // imports do.
  for (const auto& [image, fprocess] :
       std::vector<std::pair<std::string, std::string>>{
           {"bench/echo:1", "/usr/bin/fwatchdog echo-server 8082"},
           {"bench/slow:1", absl::StrCat("/usr/bin/fwatchdog echo-server 8082 ",
                                         init_ms, " ", init_mib)}}) {
    std::string tar = dir + "/" + image.substr(6, image.find(':') - 6) + ".tar";
    auto r =
        RunCommand({SILT_SOURCE_DIR "/tests/images/make-oci-image.sh", "--name",
                    image, "--layer", dir + "/rootfs", "--layer", dir + "/fn",
                    "-o", tar, "--entrypoint", R"(["/usr/bin/fwatchdog"])",
                    "--env", "PATH=/bin:/usr/bin", "--env", "mode=http",
                    "--env", "upstream_url=http://127.0.0.1:8082", "--env",
                    "fprocess=" + fprocess});
    if (r.exit_code == 0) r = c.Silt({"image", "import", tar});
    if (r.exit_code != 0) {
      fprintf(stderr, "bench_container: image: %s%s\n", r.out.c_str(),
              r.err.c_str());
      return 1;
    }
  }
  // The bundle: the same server, the worker its proxy.
  silt::proclets::BundleManifest m;
  m.kind = "exec";
  m.mode = "http";
  m.entry = "./fwatchdog echo-server 5000";
  m.upstream_url = "http://127.0.0.1:5000";
  m.name = "bun";
  std::ifstream wd(SILT_TEST_WATCHDOG, std::ios::binary);
  std::string wd_bytes((std::istreambuf_iterator<char>(wd)),
                       std::istreambuf_iterator<char>());
  auto tar = silt::proclets::PackBundle(m, {{"fwatchdog", wd_bytes, 0755}});
  std::string digest = tar.ok() ? silt::proclets::Sha256Digest(*tar) : "";
  auto pushed =
      c.gateway().Call("POST", "/system/bundles?digest=" + digest, *tar);
  if (!tar.ok() || (pushed.status != 200 && pushed.status != 201)) {
    fprintf(stderr, "bench_container: bundle push: %d %s\n", pushed.status,
            pushed.body.c_str());
    return 1;
  }
  for (const auto& [name, image] :
       std::vector<std::pair<std::string, std::string>>{
           {"ctr", "bench/echo:1"},
           {"slow", "bench/slow:1"},
           {"bun", "bun@" + digest}}) {
    json fn = {{"service", name}, {"image", image}};
    auto d = c.gateway().Call("POST", "/system/functions", fn.dump(), true,
                              {{"Content-Type", "application/json"}});
    auto first = c.gateway().Call("POST", "/function/" + name, "x");
    if ((d.status != 200 && d.status != 202) || first.status != 200) {
      fprintf(stderr, "bench_container: deploy %s: %d %s / %d %s\n",
              name.c_str(), d.status, d.body.c_str(), first.status,
              first.body.c_str());
      return 1;
    }
  }
  // The bundle's snapshot is taken after its first start (when CRIU can).
  std::this_thread::sleep_for(std::chrono::seconds(2));

  printf("bench_container: %d starts per tier, %d ms apart; warm %.1f s\n",
         runs, gap_ms, seconds);
  printf("%-18s %10s %10s %12s  %s\n", "tier", "p50 ms", "p99 ms", "start p50",
         "served");
  std::map<std::string, Starts> starts;
  for (const auto& [label, fn, tier] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"container_boot", "ctr", "boot"},
           {"container_criu", "ctr", "criu"},
           {"container_restore", "ctr", "restore"},
           {"slow_init_boot", "slow", "boot"},
           {"slow_init_criu", "slow", "criu"},
           {"slow_init_restore", "slow", "restore"},
           {"bundle_boot", "bun", "boot"},
           {"bundle_restore", "bun", "restore"}}) {
    Starts s = ColdStarts(c, fn, tier, runs, gap_ms,
                          /*staged=*/fn != "bun" && tier == "restore");
    printf("%-18s %10.2f %10.2f %12.2f  %s%s\n", label.c_str(),
           Pct(s.e2e_ms, 0.5), Pct(s.e2e_ms, 0.99), Pct(s.start_ms, 0.5),
           Served(s).c_str(),
           s.unstaged
               ? absl::StrCat(" (", s.unstaged, " found none staged)").c_str()
               : "");
    starts[label] = std::move(s);
  }

  int port = 0;
  {
    const std::string& url = c.gateway().url();
    port = std::atoi(url.substr(url.rfind(':') + 1).c_str());
  }
  printf("\n%-18s %5s %10s %10s %10s %7s\n", "warm", "conns", "req/s", "p50 us",
         "p99 us", "errors");
  std::map<std::string, silt::testing::LoadResult> warm;
  for (int conns : {1, 8}) {
    silt::testing::Load(port, "/function/ctr", conns, 0.3);
    silt::testing::Load(port, "/function/bun", conns, 0.3);
    for (const char* fn : {"ctr", "bun"}) {
      auto w = silt::testing::Load(port, absl::StrCat("/function/", fn), conns,
                                   seconds);
      printf("%-18s %5d %10.0f %10.0f %10.0f %7llu\n",
             fn == std::string("ctr") ? "container" : "bundle", conns, w.rps,
             w.p50_us, w.p99_us, static_cast<unsigned long long>(w.errors));
      warm[absl::StrCat(fn, conns)] = w;
    }
  }

  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0; };
  printf("\n");
  printf("container_boot_p50_ms=%.2f\n",
         Pct(starts["container_boot"].e2e_ms, 0.5));
  printf("container_boot_start_p50_ms=%.2f\n",
         Pct(starts["container_boot"].start_ms, 0.5));
  printf("container_restore_p50_ms=%.2f\n",
         Pct(starts["container_restore"].e2e_ms, 0.5));
  printf("container_restore_vs_boot=%.2f\n",
         ratio(Pct(starts["container_boot"].e2e_ms, 0.5),
               Pct(starts["container_restore"].e2e_ms, 0.5)));
  printf("container_staged_pss_mib=%.1f\n", StagedPssMib("ctr"));
  printf("slow_init_staged_pss_mib=%.1f\n", StagedPssMib("slow"));
  printf("container_criu_p50_ms=%.2f\n",
         Pct(starts["container_criu"].e2e_ms, 0.5));
  printf("container_restore_vs_criu=%.2f\n",
         ratio(Pct(starts["container_criu"].e2e_ms, 0.5),
               Pct(starts["container_restore"].e2e_ms, 0.5)));
  printf("container_criu_vs_boot=%.2f\n",
         ratio(Pct(starts["container_boot"].e2e_ms, 0.5),
               Pct(starts["container_criu"].e2e_ms, 0.5)));
  printf("slow_init_boot_p50_ms=%.2f\n",
         Pct(starts["slow_init_boot"].e2e_ms, 0.5));
  printf("slow_init_restore_p50_ms=%.2f\n",
         Pct(starts["slow_init_restore"].e2e_ms, 0.5));
  printf("container_restore_vs_boot_slow_init=%.2f\n",
         ratio(Pct(starts["slow_init_boot"].e2e_ms, 0.5),
               Pct(starts["slow_init_restore"].e2e_ms, 0.5)));
  printf("slow_init_criu_p50_ms=%.2f\n",
         Pct(starts["slow_init_criu"].e2e_ms, 0.5));
  printf("container_restore_vs_criu_slow_init=%.2f\n",
         ratio(Pct(starts["slow_init_criu"].e2e_ms, 0.5),
               Pct(starts["slow_init_restore"].e2e_ms, 0.5)));
  printf("bundle_boot_p50_ms=%.2f\n", Pct(starts["bundle_boot"].e2e_ms, 0.5));
  printf("bundle_restore_p50_ms=%.2f\n",
         Pct(starts["bundle_restore"].e2e_ms, 0.5));
  printf("bundle_restore_served=%s\n",
         Served(starts["bundle_restore"]).c_str());
  printf("container_boot_over_bundle_restore=%.2f\n",
         ratio(Pct(starts["container_boot"].e2e_ms, 0.5),
               Pct(starts["bundle_restore"].e2e_ms, 0.5)));
  printf("container_warm_vs_bundle=%.2f\n",
         ratio(warm["ctr1"].rps, warm["bun1"].rps));
  printf("container_warm_vs_bundle_c8=%.2f\n",
         ratio(warm["ctr8"].rps, warm["bun8"].rps));
  cluster->reset();
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
