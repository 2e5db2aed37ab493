// Rebalancer benchmarks on a two-node cluster (invokers in their own network
// namespaces, one CPU each), with the pipeline example (examples/pipeline).
//
//   sudo build/tests/bench/bench_rebalance [--shifts 5]   (0: pulse cost only)
//
// Load shift: while a Map (pipeline op=transform) runs compute proclets on
// both nodes, a CPU hog (busy processes in node-b's own cgroup: CPU that is
// not Silt's) appears on node-b. The gateway's rebalancer sees it in node-b's
// load pulses, marks node-b hot, and node-b's compute proclets finish their
// share and take no more. rebalance_ms is the rebalancer's own measure: from
// the first pulse that showed node-b over its mark to the pulse showing no
// compute proclet of Silt's left there (every node under its marks, or with
// nothing movable left); the median over --shifts shifts. decide_ms is how
// long marking the node and re-routing took. dip_ms: the work the job did not
// do in the 150 ms after the shift, against going on at once at the rate it
// settled to, in milliseconds of that rate (from the job's progress: elements
// done at each share's end). Each job must still give the right answer
// (checked against the same Map run with no shift).
//
// Job time with the shift vs without (same job, quiet cluster, same run) is
// context: node-b has its CPU taken for most of the job, so the job runs on
// node-a's one CPU after the shift.
//
// Pulse cost: the same two-node cluster idle, once with every node sending a
// pulse every 5 ms whether or not anything changed (--pulse-change 0), once
// with pulses off (--pulse-ms 0), once with the defaults (5 ms samples, a
// pulse when a figure moved by 5%); the gateway's and invokers' CPU time
// (from /proc) over the same wall time, per pulse received and per second.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cluster.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using silt::testing::Cluster;
using Clock = std::chrono::steady_clock;

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

json Get(Cluster& c, const std::string& path) {
  return json::parse(c.gateway().Call("GET", path).body, nullptr, false);
}

int ComputeOn(Cluster& c, const std::string& node) {
  for (const auto& n : Get(c, "/system/nodes"))
    if (n.value("name", "") == node) return n.value("computeProclets", 0);
  return 0;
}

// Polls (every 2 ms) until `cond` or `timeout`.
template <typename F>
bool Until(F cond, std::chrono::milliseconds timeout) {
  auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // poll
  }
  return cond();
}

uint64_t LastSeq(Cluster& c) {
  uint64_t seq = 0;
  for (const auto& e : Get(c, "/system/events"))
    seq = std::max(seq, e.value("seq", uint64_t{0}));
  return seq;
}

// The first event of `type` after `after` (null when none yet).
json EventAfter(Cluster& c, uint64_t after, const std::string& type) {
  for (const auto& e : Get(c, absl::StrCat("/system/events?after=", after)))
    if (e.value("type", "") == type) return e;
  return json();
}

int64_t UnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The job's throughput dip after a shift at `shift_us`, from its progress
// ([[unix µs, elements done], ...] at each share's end): the work it did not
// do in the 150 ms after the shift, compared with going on at once at the
// rate it settled to (measured over the 300 ms after that), in milliseconds
// of that rate. 0: it lost nothing to the move. The shares end in steps of
// ~20 ms of work, so the figure is good to about that.
double DipMs(const json& progress, int64_t shift_us) {
  auto done_at = [&](int64_t t) {
    double done = 0;
    for (const auto& p : progress)
      if (p.size() == 2 && p[0].get<int64_t>() <= t)
        done = std::max(done, p[1].get<double>());
    return done;
  };
  const int64_t window = 150'000, settle = 300'000;
  double after =
      (done_at(shift_us + window + settle) - done_at(shift_us + window)) /
      (settle / 1e6);
  if (after <= 0) return -1;  // the job ended too soon to say
  double ideal = done_at(shift_us) + after * (window / 1e6);
  double lost = ideal - done_at(shift_us + window);
  return std::max(0.0, lost / after * 1000);
}

bool StartCluster(Cluster& c, const std::vector<std::string>& extra) {
  for (const char* name : {"node-a", "node-b"}) {
    if (auto s = c.AddNode({.name = name, .cpus = 1, .extra = extra});
        !s.ok()) {
      fprintf(stderr, "%s: %s\n", name, std::string(s.message()).c_str());
      return false;
    }
  }
  return c.WaitNodes(2).ok();
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  double utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtod(f[11], &utime) ||
      !absl::SimpleAtod(f[12], &stime))
    return 0;
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

double PulsesReceived(Cluster& c) {
  auto r = silt::deploy::Send({.url = c.gateway().metrics_url() + "/metrics"});
  if (!r.ok()) return 0;
  double total = 0;
  for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
    if (!absl::StartsWith(line, "silt_load_pulses_total{")) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) total += v;
  }
  return total;
}

// Over `secs` of an idle cluster: the gateway's and the invokers' CPU
// seconds, and the pulses the gateway received.
struct Cost {
  double gateway = -1, invokers = 0, pulses = 0;
};
Cost IdleCost(const std::string& dir, const std::vector<std::string>& flags,
              double secs) {
  auto cluster = Cluster::Start(dir);
  if (!cluster.ok() || !StartCluster(**cluster, flags)) return {};
  Cluster& c = **cluster;
  std::this_thread::sleep_for(std::chrono::seconds(1));  // settle after start
  auto invokers = [&] {
    return ProcessCpuSeconds(c.node("node-a").pid()) +
           ProcessCpuSeconds(c.node("node-b").pid());
  };
  pid_t gw = c.gateway().process().pid();
  Cost start{ProcessCpuSeconds(gw), invokers(), PulsesReceived(c)};
  std::this_thread::sleep_for(
      std::chrono::milliseconds(static_cast<int>(secs * 1000)));  // measure
  return {ProcessCpuSeconds(gw) - start.gateway, invokers() - start.invokers,
          PulsesReceived(c) - start.pulses};
}

}  // namespace

int main(int argc, char** argv) {
  int shifts = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--shifts") shifts = std::max(0, std::atoi(argv[i + 1]));
  }
  if (geteuid() != 0) {
    fprintf(stderr,
            "bench_rebalance: run as root (instances and hogs in cgroups, "
            "nodes in network namespaces)\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  std::string dir = silt::testing::MakeTempDir("silt-bench-rebalance");
  std::vector<double> rebalance, decide, with_shift, quiet, dip;
  if (shifts > 0) {  // --shifts 0: the pulse cost only
    auto cluster = Cluster::Start(dir + "/shift");
    if (!cluster.ok() || !StartCluster(**cluster, {})) return 2;
    Cluster& c = **cluster;
    auto image = c.BuildAndPush("pipeline", std::string(SILT_SOURCE_DIR) +
                                                "/examples/pipeline/pipeline");
    if (!image.ok()) {
      fprintf(stderr, "%s\n", std::string(image.status().message()).c_str());
      return 2;
    }
    json d = {{"service", "pipeline"},
              {"image", *image},
              {"envVars", {{"exec_timeout", "120s"}}}};
    if (c.gateway().Call("POST", "/system/functions", d.dump()).status != 200)
      return 2;
    if (Call(c, "op=produce&input=work&n=3000&rounds=8000").is_null()) return 2;
    auto t0 = Clock::now();
    json ref = Call(c, "op=transform&input=work&output=ref");  // also warm-up
    if (ref.is_null()) return 2;
    std::string want = Call(c, "op=reduce-local&input=ref").value("sum", "");
    for (int i = 0; i < shifts; ++i) {
      // Quiet run (context), then the same job with a hog on node-b.
      t0 = Clock::now();
      if (Call(c, absl::StrCat("op=transform&input=work&output=q", i))
              .is_null())
        return 2;
      quiet.push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      uint64_t after = LastSeq(c);
      json job;
      t0 = Clock::now();
      std::thread call([&] {
        job = Call(
            c, absl::StrCat("op=transform&progress=1&input=work&output=s", i));
      });
      if (!Until([&] { return ComputeOn(c, "node-b") > 0; },
                 std::chrono::seconds(20))) {
        fprintf(stderr, "no compute proclet reached node-b\n");
        call.join();
        return 2;
      }
      int64_t shift_us = UnixMicros();
      auto hog = c.StartCpuHog("node-b", 2);
      if (!hog.ok()) {
        fprintf(stderr, "hog: %s\n",
                std::string(hog.status().message()).c_str());
        call.join();
        return 2;
      }
      bool settled =
          Until([&] { return !EventAfter(c, after, "equilibrium").is_null(); },
                std::chrono::seconds(20));
      call.join();
      with_shift.push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      json eq = EventAfter(c, after, "equilibrium");
      json mv = EventAfter(c, after, "move");
      hog->reset();
      if (!settled || job.is_null()) {
        fprintf(stderr, "shift %d: %s\n", i,
                settled ? "the job failed" : "no equilibrium event");
        return 2;
      }
      std::string got =
          Call(c, absl::StrCat("op=reduce-local&input=s", i)).value("sum", "");
      if (got != want) {
        fprintf(stderr, "shift %d: wrong result %s (want %s)\n", i, got.c_str(),
                want.c_str());
        return 2;
      }
      rebalance.push_back(eq.value("ms", 0.0));
      decide.push_back(mv.value("ms", 0.0));
      dip.push_back(DipMs(job.value("progress", json::array()), shift_us));
      printf(
          "shift %d: rebalance_ms=%.1f decide_ms=%.2f dip_ms=%.1f job_ms=%.0f "
          "(quiet %.0f)\n",
          i, rebalance.back(), decide.back(), dip.back(), with_shift.back(),
          quiet.back());
      fflush(stdout);
      // node-b cools before the next shift.
      Until([&] { return !EventAfter(c, after, "cool").is_null(); },
            std::chrono::seconds(10));
    }
  }

  Cost on = IdleCost(dir + "/pulse-on", {"--pulse-change", "0"}, 3);
  Cost off = IdleCost(dir + "/pulse-off", {"--pulse-ms", "0"}, 3);
  Cost idle = IdleCost(dir + "/pulse-default", {}, 3);
  std::filesystem::remove_all(dir);
  auto per_pulse_us = [&](double a, double b) {
    return on.pulses > 0 ? (a - b) / on.pulses * 1e6 : 0;
  };
  double gw_us = per_pulse_us(on.gateway, off.gateway);
  double inv_us = per_pulse_us(on.invokers, off.invokers);

  printf("shifts=%d\n", shifts);
  printf("node_cpus=1,1 hog_processes=2 pulse_ms=5\n");
  if (shifts > 0) {
    printf("rebalance_ms=%.1f\n", Median(rebalance));
    printf("rebalance_ms_max=%.1f\n",
           *std::max_element(rebalance.begin(), rebalance.end()));
    printf("decide_ms=%.2f\n", Median(decide));
    printf("dip_ms=%.1f\n", Median(dip));
    printf("job_ms_with_shift=%.0f\n", Median(with_shift));
    printf("job_ms_quiet=%.0f\n", Median(quiet));
  }
  printf("pulses_per_s_forced=%.0f\n", on.pulses / 3);
  printf("pulse_cost_gateway_us=%.1f\n", gw_us);
  printf("pulse_cost_invoker_us=%.1f\n", inv_us);
  printf("pulse_cost_us=%.1f\n", gw_us + inv_us);
  printf("pulse_cpu_pct_per_node_at_200hz=%.2f\n",
         (gw_us + inv_us) * 200 / 1e6 * 100);
  // Defaults (5 ms samples, a pulse only on a 5% move), idle: what sampling
  // costs when nothing changes.
  printf("pulses_per_s_idle_default=%.1f\n", idle.pulses / 3);
  printf("pulse_idle_cpu_pct_per_node=%.2f\n",
         ((idle.gateway - off.gateway) + (idle.invokers - off.invokers)) / 3 /
             2 * 100);
  return 0;
}
