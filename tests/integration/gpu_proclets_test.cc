// GPU proclets end to end: examples/gpu built with `silt up` (its kernels to
// PTX and a host library), called over HTTP; the proclet's device state
// outlives calls, each function gets its own, and its memory limit holds.
// On a node without a GPU the proclets run on the host backend.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/cluster.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

class GpuProcletsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "instances and GPU proclets run in namespaces and "
                      "cgroups: run as root";
    dir_ = MakeTempDir("silt-gpu");
    auto c = Cluster::Start(dir_);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    ASSERT_TRUE(cluster_->AddNode({.name = "node-a"}).ok());
    ASSERT_TRUE(cluster_->WaitNodes(1).ok());
    work_ = dir_ + "/example";
    std::filesystem::copy(std::string(SILT_SOURCE_DIR) + "/examples/gpu", work_,
                          std::filesystem::copy_options::recursive);
  }
  void TearDown() override {
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  deploy::HttpResult Invoke(const std::string& path) {
    return cluster_->gateway().Call("POST", path, "", /*with_auth=*/false);
  }

  std::string dir_, work_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(GpuProcletsTest, TheExampleRunsItsKernelsAndKeepsDeviceState) {
  auto r = cluster_->Silt({"up", "-f", work_ + "/stack.yml"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto first = Invoke("/function/saxpy?n=100000&a=3");
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_TRUE(absl::StartsWith(first.body, "ok n=100000 wrong=0 calls=1 "))
      << first.body;
  EXPECT_TRUE(absl::StrContains(first.body, " backend=host ") ||
              absl::StrContains(first.body, " backend=cuda "))
      << first.body;
  // The counter lives in the proclet's device memory, not in an instance.
  auto second = Invoke("/function/saxpy?n=4097&a=5");
  ASSERT_EQ(second.status, 200) << second.body;
  EXPECT_TRUE(absl::StartsWith(second.body, "ok n=4097 wrong=0 calls=2 "))
      << second.body;

  // Another function of the same code has a proclet (and a process, uid,
  // cgroup) of its own: its counter starts at 1.
  {
    std::ofstream(work_ + "/stack.yml", std::ios::app)
        << "  saxpy-small:\n    lang: cpp\n    handler: ./saxpy\n"
        << "    image: saxpy-small:latest\n    labels:\n"
        << "      com.silt.gpu.max-memory: 1Mi\n";
  }
  r = cluster_->Silt({"up", "-f", work_ + "/stack.yml"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto other = Invoke("/function/saxpy-small?n=1000&a=2");
  ASSERT_EQ(other.status, 200) << other.body;
  EXPECT_TRUE(absl::StartsWith(other.body, "ok n=1000 wrong=0 calls=1 "))
      << other.body;
  // Its 1 MiB of device memory does not hold two 800 kB buffers.
  auto over = Invoke("/function/saxpy-small?n=200000&a=2");
  EXPECT_EQ(over.status, 500) << over.body;
  EXPECT_TRUE(absl::StrContains(over.body, "limit")) << over.body;
  auto third = Invoke("/function/saxpy?n=10&a=1");
  EXPECT_TRUE(absl::StartsWith(third.body, "ok n=10 wrong=0 calls=3 "))
      << third.body;
  // The time its launches kept the device busy reaches the gateway in the
  // node's reports (silt gpu list, metrics).
  EXPECT_TRUE(Eventually([&] {
    auto j = nlohmann::json::parse(
        cluster_->Silt({"gpu", "list", "-o", "json"}).out, nullptr, false);
    if (!j.is_object()) return false;
    for (const auto& p : j.value("proclets", nlohmann::json::array()))
      if (p.value("function", "") == "saxpy" && p.value("busyMs", 0.0) > 0)
        return true;
    return false;
  }));
  auto metrics =
      deploy::Send({.url = cluster_->gateway().metrics_url() + "/metrics"});
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_TRUE(
      absl::StrContains(metrics->body,
                        "silt_gpu_proclet_busy_seconds_total{function_name="
                        "\"saxpy.openfaas-fn\""))
      << metrics->body;
  EXPECT_TRUE(absl::StrContains(metrics->body, "silt_gpu_proclet_utilization{"))
      << metrics->body;
}

TEST_F(GpuProcletsTest, ABadGpuLabelIsRefusedAtDeploy) {
  for (const auto& [label, says] :
       std::vector<std::pair<std::string, std::string>>{
           {"com.silt.gpu.max-memory: lots", "com.silt.gpu.max-memory"},
           {"com.silt.gpu.compute-capability: eight",
            "com.silt.gpu.compute-capability"},
           {"com.silt.gpu.min-memory: 1Gi\n      com.silt.gpu.max-memory: 1Mi",
            "min-memory is more than"}}) {
    std::ofstream(work_ + "/stack.yml", std::ios::trunc)
        << "version: 1.0\nprovider:\n  name: openfaas\nfunctions:\n"
        << "  saxpy:\n    lang: cpp\n    handler: ./saxpy\n"
        << "    image: saxpy:latest\n    labels:\n"
        << "      " << label << "\n";
    auto r = cluster_->Silt({"up", "-f", work_ + "/stack.yml"});
    EXPECT_NE(r.exit_code, 0) << label;
    EXPECT_TRUE(absl::StrContains(r.out + r.err, says)) << r.out << r.err;
  }
}

// The "calls=N" of the example's answer; -1 when absent.
int64_t CallsOf(const std::string& body) {
  auto at = body.find(" calls=");
  int64_t n = -1;
  if (at == std::string::npos) return -1;
  std::string_view rest = std::string_view(body).substr(at + 7);
  rest = rest.substr(0, rest.find(' '));
  if (!absl::SimpleAtoi(absl::string_view(rest.data(), rest.size()), &n))
    return -1;
  return n;
}

// The GPU proclets listed by `silt proclets list -o json`.
nlohmann::json GpuProclets(Cluster& c) {
  auto r = c.Silt({"proclets", "list", "-o", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json out = nlohmann::json::array();
  auto all = nlohmann::json::parse(r.out, nullptr, false);
  if (!all.is_array()) return out;
  for (const auto& p : all)
    if (p.value("kind", "") == "gpu") out.push_back(p);
  return out;
}

// The function's instances on node-a, its GPU proclet placed there (the
// asking node: no GPU anywhere) and moved to node-b and back while calls
// run: every call succeeds, and the device-resident counter the calls bump
// ends equal to the number of calls (no launch lost or repeated).
TEST_F(GpuProcletsTest, AProcletMovesBetweenNodesWhileCallsGoOn) {
  ASSERT_TRUE(cluster_->AddNode({.name = "node-b"}).ok());
  ASSERT_TRUE(cluster_->WaitNodes(2).ok());
  std::ofstream(work_ + "/stack.yml", std::ios::app)
      << "    constraints: [\"node.name==node-a\"]\n";
  auto r = cluster_->Silt({"up", "-f", work_ + "/stack.yml"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto first = Invoke("/function/saxpy?n=50000&a=2");
  ASSERT_EQ(first.status, 200) << first.body;
  ASSERT_EQ(CallsOf(first.body), 1) << first.body;
  auto listed = GpuProclets(*cluster_);
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  const std::string id = listed[0].value("id", "");
  EXPECT_EQ(listed[0].value("node", ""), "node-a");
  EXPECT_EQ(listed[0].value("function", ""), "saxpy");

  std::atomic<bool> stop{false};
  std::atomic<int64_t> ok_calls{1}, failed{0};
  std::string failure;
  std::thread caller([&] {
    while (!stop) {
      auto c = Invoke("/function/saxpy?n=20000&a=3");
      if (c.status == 200 && absl::StartsWith(c.body, "ok ")) {
        ++ok_calls;
      } else {
        if (failed++ == 0) failure = c.body;
      }
    }
  });
  for (const char* to : {"node-b", "node-a", "node-b"}) {
    auto m = cluster_->Silt({"proclets", "migrate", id, "--to", to});
    EXPECT_EQ(m.exit_code, 0) << m.out << m.err;
    EXPECT_TRUE(absl::StrContains(m.out, std::string("-> ") + to)) << m.out;
    // Calls go on between moves.
    int64_t seen = ok_calls;
    while (ok_calls < seen + 3 && failed == 0) std::this_thread::yield();
  }
  stop = true;
  caller.join();
  EXPECT_EQ(failed, 0) << failure;
  auto last = Invoke("/function/saxpy?n=10&a=1");
  ASSERT_EQ(last.status, 200) << last.body;
  EXPECT_EQ(CallsOf(last.body), ok_calls + 1) << last.body;
  listed = GpuProclets(*cluster_);
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  EXPECT_EQ(listed[0].value("node", ""), "node-b");
  EXPECT_EQ(listed[0].value("moves", 0), 3);

  // Bad moves are clear errors and change nothing.
  auto same = cluster_->Silt({"proclets", "migrate", id, "--to", "node-b"});
  EXPECT_NE(same.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(same.err + same.out, "already")) << same.err;
  auto nowhere = cluster_->Silt({"proclets", "migrate", id, "--to", "node-z"});
  EXPECT_NE(nowhere.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(nowhere.err + nowhere.out, "node-z"));
  auto no_gpu = cluster_->Silt(
      {"proclets", "migrate", id, "--to", "node-a", "--backend", "cuda"});
  EXPECT_NE(no_gpu.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(no_gpu.err + no_gpu.out, "no GPU"))
      << no_gpu.err;
  auto gpus = cluster_->Silt({"gpu", "list"});
  EXPECT_EQ(gpus.exit_code, 0) << gpus.err;
  EXPECT_TRUE(absl::StrContains(gpus.out, "saxpy/default")) << gpus.out;
  EXPECT_EQ(CallsOf(Invoke("/function/saxpy?n=10&a=1").body), ok_calls + 2);

  auto metrics =
      deploy::Send({.url = cluster_->gateway().metrics_url() + "/metrics"});
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_TRUE(absl::StrContains(
      metrics->body,
      "silt_gpu_proclet_moves{function_name=\"saxpy.openfaas-fn\","
      "proclet=\"default\",node=\"node-b\",backend=\"host\"} 3"))
      << metrics->body;
  EXPECT_TRUE(
      absl::StrContains(metrics->body, "silt_gpu_proclet_last_pause_seconds{"))
      << metrics->body;

  // The function's deletion ends its proclet.
  auto del = cluster_->Silt({"remove", "saxpy"});
  EXPECT_EQ(del.exit_code, 0) << del.err;
  EXPECT_TRUE(GpuProclets(*cluster_).empty());
}

// The reconfiguration API: `silt gpu resize` within the function's labels;
// a proclet holding more than its new allocation has its function's
// callback asked (on the next call) to free, then the allocation applies;
// one whose function frees nothing keeps its allocation and the resize
// fails, saying why.
TEST_F(GpuProcletsTest, AResizeAsksTheFunctionToShrinkWithinItsLabels) {
  auto r = cluster_->Silt({"up", "-f", work_ + "/stack.yml"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // 32 MB of scratch buffers in its 256 MiB (preferred) allocation.
  auto big = Invoke("/function/saxpy?n=4000000&a=2");
  ASSERT_EQ(big.status, 200) << big.body;
  EXPECT_TRUE(absl::StrContains(big.body, " limit=268435456 ")) << big.body;
  auto listed = GpuProclets(*cluster_);
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  const std::string id = listed[0].value("id", "");

  // Below its min-memory, above its max-memory, or not a GPU proclet.
  auto low = cluster_->Silt({"gpu", "resize", id, "--memory", "8Mi"});
  EXPECT_NE(low.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(low.err, "min-memory")) << low.err;
  auto high = cluster_->Silt({"gpu", "resize", id, "--memory", "1Gi"});
  EXPECT_NE(high.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(high.err, "max-memory")) << high.err;
  auto junk = cluster_->Silt({"gpu", "resize", id, "--memory", "lots"});
  EXPECT_NE(junk.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(junk.err, "memory")) << junk.err;

  // Down to 16 MiB while calls go on: the first call after the request runs
  // the callback, which frees the scratch; the resize then completes.
  std::atomic<bool> resized{false};
  deploy::HttpResult during;
  std::thread resize([&] {
    auto res = cluster_->Silt({"gpu", "resize", id, "--memory", "16Mi"});
    EXPECT_EQ(res.exit_code, 0) << res.out << res.err;
    EXPECT_TRUE(absl::StrContains(res.out, "16.0 MiB")) << res.out;
    resized = true;
  });
  int calls = 0;
  while (!resized) {
    during = Invoke("/function/saxpy?n=1000&a=2");
    EXPECT_EQ(during.status, 200) << during.body;
    ++calls;
  }
  resize.join();
  EXPECT_GE(calls, 1);
  auto small = Invoke("/function/saxpy?n=1000&a=2");
  EXPECT_EQ(small.status, 200) << small.body;
  EXPECT_TRUE(absl::StrContains(small.body, " limit=16777216 ")) << small.body;
  auto too_big = Invoke("/function/saxpy?n=4000000&a=2");
  EXPECT_EQ(too_big.status, 500) << too_big.body;
  EXPECT_TRUE(absl::StrContains(too_big.body, "allocation")) << too_big.body;

  // Back up; then down with no call to run the callback: called off.
  r = cluster_->Silt({"gpu", "resize", id, "--memory", "256Mi"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_EQ(Invoke("/function/saxpy?n=4000000&a=2").status, 200);
  r = cluster_->Silt({"gpu", "resize", id, "--memory", "16Mi"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.err, "did not free enough")) << r.err;
  auto after = Invoke("/function/saxpy?n=4000000&a=2");
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_TRUE(absl::StrContains(after.body, " limit=268435456 ")) << after.body;
}

// A proclet whose process dies loses its buffers: the next call says so,
// and the one after starts afresh.
TEST_F(GpuProcletsTest, AProcletWhoseProcessDiesIsReportedLost) {
  auto r = cluster_->Silt({"up", "-f", work_ + "/stack.yml"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_EQ(CallsOf(Invoke("/function/saxpy?n=100&a=2").body), 1);
  ASSERT_EQ(CallsOf(Invoke("/function/saxpy?n=100&a=2").body), 2);
  // This node's proclet processes (tests run at once): in its cgroups.
  std::string node_id;
  std::getline(std::ifstream(dir_ + "/node-a/node-id"), node_id);
  ASSERT_FALSE(node_id.empty());
  int killed = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::ifstream in(e.path() / "cmdline");
    std::string cmd;
    std::getline(in, cmd, '\0');
    if (cmd != "/var/silt/bin/silt-gpu-host") continue;
    std::stringstream cgroups;
    cgroups << std::ifstream(e.path() / "cgroup").rdbuf();
    if (!absl::StrContains(cgroups.str(), "silt/" + node_id + "/gpu-"))
      continue;
    int pid = 0;
    if (absl::SimpleAtoi(e.path().filename().string(), &pid) &&
        kill(pid, SIGKILL) == 0)
      ++killed;
  }
  ASSERT_EQ(killed, 1);
  auto lost = Invoke("/function/saxpy?n=100&a=2");
  EXPECT_EQ(lost.status, 500) << lost.body;
  EXPECT_TRUE(absl::StrContains(lost.body, "lost")) << lost.body;
  auto fresh = Invoke("/function/saxpy?n=100&a=2");
  EXPECT_EQ(fresh.status, 200) << fresh.body;
  EXPECT_EQ(CallsOf(fresh.body), 1) << fresh.body;
}

}  // namespace
}  // namespace silt::testing
