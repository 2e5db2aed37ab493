// GPU proclet benchmark: a kernel of a few milliseconds (saxpy over 4M
// floats) launched through Silt (the function's SDK -> its invoker -> the
// proclet's sandboxed process; K launches then a synchronize, timed inside
// the function) against the same kernel binary launched directly by a plain
// program through the same backend (no Silt, same threads), in the same run;
// and a GPU proclet of 64 MiB (and 1 GiB with --big) moved live between two
// nodes (each in its own network namespace), idle and while a caller
// launches on it, against copying its bytes off the device and back on (the
// physical limit of a stop-and-copy move on one machine). A move pre-copies
// the buffers while the proclet runs on; its pause carries what was written
// meanwhile.
//
//   sudo build/tests/bench/bench_gpu [--runs 7] [--big]
//
// Where no GPU is, both sides run on the host backend (gpu_backend=host).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cluster.h"
#include "gpu/backend.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using silt::testing::Cluster;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

[[noreturn]] void Die(const std::string& why) {
  fprintf(stderr, "bench_gpu: %s\n", why.c_str());
  exit(1);
}

constexpr uint64_t kN = 1 << 22;  // floats per saxpy
constexpr int kLaunches = 10;

// Per launch, ms: the same kernel through the backend directly.
double DirectLaunchMs(const std::string& kernels_dir, silt::gpu::Backend& b,
                      int runs) {
  silt::gpu::ModuleImage image;
  image.host_library = ReadAll(kernels_dir + "/kernels.host.so");
  image.ptx = ReadAll(kernels_dir + "/kernels.ptx");
  auto m = b.Load(image);
  if (!m.ok()) Die(std::string(m.status().message()));
  auto x = b.Alloc(kN * sizeof(float));
  auto y = b.Alloc(kN * sizeof(float));
  if (!x.ok() || !y.ok()) Die("alloc");
  int n = int(kN);
  float a = 1.0001f;
  uint64_t px = *x, py = *y;
  void* args[] = {&a, &px, &py, &n};
  std::vector<double> per;
  for (int r = 0; r < runs + 1; ++r) {
    auto start = Clock::now();
    for (int k = 0; k < kLaunches; ++k)
      if (!(*m)->Launch("saxpy", {unsigned((kN + 255) / 256)}, {256}, 0, args)
               .ok())
        Die("direct launch");
    if (!b.Synchronize().ok()) Die("sync");
    if (r > 0) per.push_back(Ms(Clock::now() - start) / kLaunches);
  }
  b.Free(*x, kN * sizeof(float));
  b.Free(*y, kN * sizeof(float));
  return Median(per);
}

// Copying `bytes` off the device and back on, ms (what a move must do at
// the least on one machine).
double CopyMs(silt::gpu::Backend& b, uint64_t bytes, int runs) {
  auto d = b.Alloc(bytes);
  auto d2 = b.Alloc(bytes);
  if (!d.ok() || !d2.ok()) Die("alloc");
  std::string host(bytes, '\1');
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    auto start = Clock::now();
    if (!b.CopyOut(host.data(), *d, bytes).ok() ||
        !b.CopyIn(*d2, host.data(), bytes).ok())
      Die("copy");
    t.push_back(Ms(Clock::now() - start));
  }
  b.Free(*d, bytes);
  b.Free(*d2, bytes);
  return Median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 7;
  bool big = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) runs = atoi(argv[++i]);
    if (a == "--big") big = true;
  }
  if (geteuid() != 0) Die("run as root (nodes run in namespaces and cgroups)");
  std::unique_ptr<silt::gpu::Backend> backend;
  if (silt::gpu::CudaDeviceCount() > 0) {
    auto b = silt::gpu::MakeCudaBackend(0);
    if (b.ok()) backend = *std::move(b);
  }
  if (!backend) backend = silt::gpu::MakeHostBackend();
  const std::string kind(silt::gpu::BackendName(backend->kind()));

  std::string dir = silt::testing::MakeTempDir("silt-bench-gpu");
  auto cluster = Cluster::Start(dir);
  if (!cluster.ok()) Die(std::string(cluster.status().message()));
  Cluster& c = **cluster;
  for (const char* n : {"node-a", "node-b"})
    if (auto s = c.AddNode({.name = n}); !s.ok()) Die(std::string(s.message()));
  if (auto s = c.WaitNodes(2); !s.ok()) Die(std::string(s.message()));
  std::filesystem::copy(std::string(SILT_SOURCE_DIR) + "/tests/bench/gpu",
                        dir + "/fn", std::filesystem::copy_options::recursive);
  std::ofstream(dir + "/fn/stack.yml")
      << "version: 1.0\nprovider:\n  name: openfaas\nfunctions:\n"
      << "  gpubench:\n    lang: cpp\n    handler: ./bench\n"
      << "    image: gpubench\n    constraints: [\"node.name==node-a\"]\n";
  auto up = c.Silt({"up", "-f", dir + "/fn/stack.yml"});
  if (up.exit_code != 0) Die(up.out + up.err);
  auto call = [&](const std::string& q) {
    auto r = c.gateway().Call("POST", "/function/gpubench?" + q, "", false);
    if (r.status != 200)
      Die(q + ": " + std::to_string(r.status) + " " + r.body);
    return r.body;
  };

  // Kernel through Silt vs direct.
  std::vector<double> silt_ms;
  const std::string launch = absl::StrCat("op=launch&n=", kN, "&k=", kLaunches);
  const std::string launch1 = absl::StrCat("op=launch&n=", kN, "&k=1");
  call(launch);  // buffers made, module loaded
  for (int r = 0; r < runs; ++r) {
    double us = 0;
    if (!absl::SimpleAtod(call(launch), &us)) Die("bad launch answer");
    silt_ms.push_back(us / 1000.0 / kLaunches);
  }
  const double direct =
      DirectLaunchMs(dir + "/fn/build/gpubench/kernels", *backend, runs);
  const double silt = Median(silt_ms);

  // Moves.
  auto proclets = json::parse(c.Silt({"proclets", "list", "-o", "json"}).out,
                              nullptr, false);
  std::string id;
  for (const auto& p : proclets)
    if (p.value("kind", "") == "gpu") id = p.value("id", "");
  if (id.empty()) Die("no GPU proclet listed");
  printf("# gpu_backend=%s device: %s\n", kind.c_str(),
         backend->device_name().c_str());
  printf("# saxpy over %llu floats: through Silt %.3f ms/launch, direct %.3f\n",
         (unsigned long long)kN, silt, direct);
  std::vector<std::pair<uint64_t, std::string>> sizes = {{64, "64MiB"}};
  if (big) sizes.push_back({1024, "1GiB"});
  std::vector<std::string> summary;
  const char* where[] = {"node-b", "node-a"};
  int at = 0;  // the proclet is on node-a
  // One series of moves back and forth; with `load`, a caller launches the
  // saxpy (its 32 MiB written by every launch) all along.
  struct Moves {
    std::vector<double> pause, total, precopy, extract, inject;
    std::vector<double> paused_mib;
    uint64_t bytes = 0;
    int calls = 0;
  };
  auto move = [&](bool load) {
    Moves mv;
    std::atomic<bool> stop{false};
    std::atomic<int> calls{0};
    std::string failure;  // set before `failed`
    std::atomic<bool> failed{false};
    std::thread caller;
    if (load)
      caller = std::thread([&] {
        while (!stop) {
          auto r = c.gateway().Call("POST", "/function/gpubench?" + launch1, "",
                                    false);
          if (r.status != 200) {
            failure = r.body;
            failed = true;
            return;
          }
          ++calls;
        }
      });
    for (int r = 0; r < runs; ++r) {
      // Under load, moves start while launches run (not between calls).
      for (int seen = calls; load && calls < seen + 2 && !failed;)
        std::this_thread::yield();
      auto start = Clock::now();
      auto m = c.gateway().Call("POST", "/system/proclets/" + id + "/migrate",
                                json{{"node", where[at]}}.dump(), true);
      if (m.status != 200) Die("migrate: " + m.body);
      mv.total.push_back(Ms(Clock::now() - start));
      at ^= 1;
      json j = json::parse(m.body);
      mv.pause.push_back(j.value("pauseMs", 0.0));
      mv.precopy.push_back(j.value("precopyMs", 0.0));
      mv.extract.push_back(j.value("extractMs", 0.0));
      mv.inject.push_back(j.value("injectMs", 0.0));
      mv.paused_mib.push_back(j.value("pausedBytes", 0.0) / 1048576.0);
      mv.bytes = j.value("bytes", uint64_t{0});
    }
    stop = true;
    if (caller.joinable()) caller.join();
    if (!failure.empty()) Die("a call during the moves failed: " + failure);
    mv.calls = calls;
    return mv;
  };
  for (const auto& [mib, label] : sizes) {
    const std::string fill = call(absl::StrCat("op=fill&mib=", mib));
    Moves idle = move(false);
    Moves loaded = move(true);
    if (call(absl::StrCat("op=check&mib=", mib)) != fill)
      Die("the state changed across the moves");
    // Everything the proclet holds (the saxpy buffers too).
    const double copy = CopyMs(*backend, idle.bytes, runs);
    for (const auto& [what, mv] :
         {std::pair<const char*, Moves*>{"idle", &idle}, {"loaded", &loaded}})
      printf(
          "# %s, %s (%.0f MiB held in all): pause %.2f ms p50 (max %.2f; "
          "%.1f MiB written since the pre-copy; copy out %.2f, in %.2f), "
          "pre-copy %.1f ms, whole move %.1f ms%s\n",
          label.c_str(), what, mv->bytes / 1048576.0, Median(mv->pause),
          *std::max_element(mv->pause.begin(), mv->pause.end()),
          Median(mv->paused_mib), Median(mv->extract), Median(mv->inject),
          Median(mv->precopy), Median(mv->total),
          mv->calls ? absl::StrFormat(" (%d calls launching meanwhile, none "
                                      "failed)",
                                      mv->calls)
                          .c_str()
                    : "");
    printf("# device->host->device copy of the same bytes: %.2f ms\n", copy);
    const double p = Median(idle.pause), pl = Median(loaded.pause);
    summary.push_back(
        absl::StrFormat("gpu_migrate_pause_ms_%s=%.2f", label, p));
    summary.push_back(
        absl::StrFormat("gpu_migrate_pause_loaded_ms_%s=%.2f", label, pl));
    summary.push_back(absl::StrFormat("gpu_copy_ms_%s=%.2f", label, copy));
    summary.push_back(
        absl::StrFormat("gpu_migrate_vs_copy_%s=%.2f", label, p / copy));
    summary.push_back(absl::StrFormat("gpu_migrate_loaded_vs_copy_%s=%.2f",
                                      label, pl / copy));
    summary.push_back(absl::StrFormat("gpu_move_total_vs_copy_%s=%.2f", label,
                                      Median(idle.total) / copy));
  }
  printf("gpu_backend=%s\n", kind.c_str());
  printf("gpu_kernel_ms_silt=%.3f\n", silt);
  printf("gpu_kernel_ms_direct=%.3f\n", direct);
  printf("gpu_kernel_vs_direct=%.2f\n", direct / silt);
  for (const auto& s : summary) printf("%s\n", s.c_str());
  cluster->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
