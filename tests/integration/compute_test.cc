// Compute proclets: jobs (ParallelFor, Map, Spawn) split into shares that run
// in sandboxed instances of the function on the nodes, over data that may
// live on another node; on a two-node cluster whose nodes run in their own
// network namespaces (tests/common/cluster.h), driven over HTTP as a user
// would.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;

class ComputeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    auto r = BuildProbe("silt-compute-suite", &suite_dir_);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static void TearDownTestSuite() {
    if (!suite_dir_.empty()) std::filesystem::remove_all(suite_dir_);
  }

  // node-a offers far more memory than node-b: state lands on node-a.
  void StartCluster(std::vector<std::string> node_flags = {}) {
    if (geteuid() != 0)
      GTEST_SKIP() << "nodes run in network namespaces, instances in "
                      "cgroups: run as root";
    dir_ = MakeTempDir("silt-compute");
    auto c = Cluster::Start(dir_);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    ASSERT_TRUE(
        cluster_
            ->AddNode(
                {.name = "node-a", .memory_mib = 1 << 20, .extra = node_flags})
            .ok());
    ASSERT_TRUE(
        cluster_
            ->AddNode(
                {.name = "node-b", .memory_mib = 4096, .extra = node_flags})
            .ok());
    ASSERT_TRUE(cluster_->WaitNodes(2).ok());
  }
  json Node(const std::string& name) {
    auto all = json::parse(
        cluster_->gateway().Call("GET", "/system/nodes").body, nullptr, false);
    for (const auto& n : all)
      if (n.value("name", "") == name) return n;
    return json::object();
  }
  std::string SumOf(const std::string& op, const std::string& vec) {
    auto res = Invoke("pipeline", "?op=" + op + "&input=" + vec);
    EXPECT_EQ(res.status, 200) << res.body;
    return json::parse(res.body, nullptr, false).value("sum", "");
  }
  void Deploy(const std::string& name, const std::string& image,
              const std::string& node = "") {
    json d = {{"service", name},
              {"image", image},
              {"envVars", {{"exec_timeout", "60s"}}}};
    if (!node.empty()) d["constraints"] = {"node.name==" + node};
    auto r = cluster_->gateway().Call("POST", "/system/functions", d.dump());
    ASSERT_EQ(r.status, 200) << r.body;
  }
  void DeployProbe(const std::string& node = "") {
    auto r = cluster_->Silt({"push", "-f", suite_dir_ + "/stack.yml"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    Deploy("probe", "probe@" + r.out.substr(r.out.find("sha256:"), 71), node);
  }
  void DeployPipeline(const std::string& node = "") {
    auto image =
        cluster_->BuildAndPush("pipeline", std::string(SILT_SOURCE_DIR) +
                                               "/examples/pipeline/pipeline");
    ASSERT_TRUE(image.ok()) << image.status();
    Deploy("pipeline", *image, node);
  }
  void TearDown() override {
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  deploy::HttpResult Invoke(const std::string& function,
                            const std::string& path) {
    return cluster_->gateway().Call("POST", "/function/" + function + path, "",
                                    /*with_auth=*/false);
  }
  json Proclets(const std::string& structure) {
    auto all =
        json::parse(cluster_->gateway().Call("GET", "/system/proclets").body,
                    nullptr, false);
    json out = json::array();
    for (const auto& p : all)
      if (p.value("structure", "") == structure) out.push_back(p);
    return out;
  }

  static std::string suite_dir_;
  std::string dir_;
  std::unique_ptr<Cluster> cluster_;
};

std::string ComputeTest::suite_dir_;

// The pipeline runs on node-b only; its records live on node-a: every
// share reads them over the network, and the digests it writes go back
// there. The job's answer must be the one this instance computes alone.
TEST_F(ComputeTest, MapOverDataOnAnotherNodeMatchesTheLocalResult) {
  StartCluster();
  if (IsSkipped()) return;
  DeployPipeline("node-b");
  auto r = Invoke("pipeline", "?op=produce&input=records&n=3000&rounds=20");
  ASSERT_EQ(r.status, 200) << r.body;
  json shards = Proclets("records");
  ASSERT_FALSE(shards.empty());
  for (const auto& s : shards) ASSERT_EQ(s["node"], "node-a") << shards.dump();

  r = Invoke("pipeline", "?op=transform&input=records&output=digests");
  ASSERT_EQ(r.status, 200) << r.body;
  r = Invoke("pipeline",
             "?op=transform-local&input=records&output=digests-local");
  ASSERT_EQ(r.status, 200) << r.body;
  std::string local = SumOf("reduce-local", "digests-local");
  ASSERT_FALSE(local.empty());
  EXPECT_EQ(SumOf("reduce-local", "digests"), local);  // Map's output
  EXPECT_EQ(SumOf("reduce", "digests"), local);        // through Spawn
  EXPECT_EQ(SumOf("reduce", "digests-local"), local);
}

// Enough work for both nodes: the job's shares run on each, and the result
// is the one computed in one place.
TEST_F(ComputeTest, MapSpreadsOverTheNodes) {
  StartCluster();
  if (IsSkipped()) return;
  DeployPipeline();
  auto r = Invoke("pipeline", "?op=produce&input=work&n=2000&rounds=4000");
  ASSERT_EQ(r.status, 200) << r.body;
  r = Invoke("pipeline", "?op=transform&input=work&output=out");
  ASSERT_EQ(r.status, 200) << r.body;
  json placement = json::parse(r.body, nullptr, false)["placement"];
  EXPECT_GT(placement.value("node-a", 0), 0) << r.body;
  EXPECT_GT(placement.value("node-b", 0), 0) << r.body;
  EXPECT_EQ(placement.value("node-a", 0) + placement.value("node-b", 0), 2000)
      << r.body;
  r = Invoke("pipeline", "?op=transform-local&input=work&output=out-local");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(SumOf("reduce-local", "out"), SumOf("reduce-local", "out-local"));
}

// node-b dies (SIGKILL) while it runs shares of a Map: they run again on
// node-a and the job's answer is right; or, had the caller itself been on
// node-b, the call fails saying so. Never a wrong result.
TEST_F(ComputeTest, NodeKilledMidJobLeavesNoWrongResult) {
  StartCluster();  // nodes report every 100 ms
  if (IsSkipped()) return;
  DeployPipeline();
  auto r = Invoke("pipeline", "?op=produce&input=work&n=3000&rounds=15000");
  ASSERT_EQ(r.status, 200) << r.body;
  deploy::HttpResult job;
  std::thread call(
      [&] { job = Invoke("pipeline", "?op=transform&input=work&output=out"); });
  bool running_on_b = Eventually(
      [&] { return Node("node-b").value("computeProclets", 0) > 0; });
  cluster_->StopNode("node-b", SIGKILL);
  call.join();
  ASSERT_TRUE(running_on_b) << Node("node-b").dump();
  if (job.status != 200) {  // the caller was on node-b
    EXPECT_FALSE(job.body.empty());
    EXPECT_EQ(job.body.find("\"sum\""), std::string::npos) << job.body;
    return;
  }
  r = Invoke("pipeline", "?op=transform-local&input=work&output=out-local");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(SumOf("reduce-local", "out"), SumOf("reduce-local", "out-local"));
}

// Shares run on both nodes (the function may run anywhere) and every
// element is seen exactly once.
TEST_F(ComputeTest, ParallelForSeesEveryElementOnce) {
  StartCluster();
  if (IsSkipped()) return;
  DeployProbe();
  for (int i = 0; i < 300; ++i)
    ASSERT_EQ(Invoke("probe", absl::StrCat("/vec/push?name=nums&v=", i)).status,
              200);
  auto r = Invoke("probe", "/compute/count?name=nums");
  ASSERT_EQ(r.status, 200) << r.body;
  r = Invoke("probe", "/kv/size?name=seen");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "300");
  r = Invoke("probe", "/compute/twice?name=nums&out=doubled");
  ASSERT_EQ(r.status, 200) << r.body;
  for (int i : {0, 1, 150, 299}) {
    r = Invoke("probe", absl::StrCat("/vec/get?name=doubled&i=", i));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body, std::to_string(2 * i));
  }
}

// ParallelFor and Map over a sharded map (4 shards): every entry is seen
// once, by Map::Scan from a handler and by the jobs' compute proclets.
TEST_F(ComputeTest, JobsOverAMapSeeEveryEntryOnce) {
  StartCluster();
  if (IsSkipped()) return;
  DeployProbe();
  auto r = Invoke("probe", "/kv/mput?name=words&shards=4&n=3000&p=k&v=v");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Proclets("words").size(), 4u);
  r = Invoke("probe", "/kv/scan?name=words");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "3000 3000");
  r = Invoke("probe", "/compute/map-copy?name=words");
  ASSERT_EQ(r.status, 200) << r.body;
  uint64_t entries = 0;  // "node=entries/shares ..."
  for (size_t at = r.body.find('='); at != std::string::npos;
       at = r.body.find('=', at + 1))
    entries += std::stoull(r.body.substr(at + 1));
  EXPECT_EQ(entries, 3000u) << r.body;
  r = Invoke("probe", "/kv/mget?name=seen-entries&n=3000&p=k&v=v");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "3000");
  EXPECT_EQ(Invoke("probe", "/kv/size?name=seen-entries").body, "3000");
  r = Invoke("probe", "/compute/map-exclaim?name=words&out=loud");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Invoke("probe", "/kv/size?name=loud").body, "3000");
  EXPECT_EQ(Invoke("probe", "/kv/get?name=loud&k=k17").body, "v17!");
  EXPECT_EQ(Invoke("probe", "/kv/get?name=loud&k=k2999").body, "v2999!");
  // Bad input: a vector where a map belongs, the input as its own output.
  ASSERT_EQ(Invoke("probe", "/vec/push?name=avec&v=1").status, 200);
  r = Invoke("probe", "/compute/map-copy?name=avec");
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_NE(r.body.find("is a vector, not a map"), std::string::npos) << r.body;
  r = Invoke("probe", "/compute/map-exclaim?name=words&out=words");
  EXPECT_EQ(r.status, 400) << r.body;
}

// A job over a map whose shards migrate while it runs: the router follows
// them, and every entry is still seen exactly once.
TEST_F(ComputeTest, AJobOverAMapFollowsShardsThatMove) {
  StartCluster();
  if (IsSkipped()) return;
  DeployProbe();
  constexpr int kEntries = 40000;
  auto put = Invoke(
      "probe",
      absl::StrCat("/kv/mput?name=moving&shards=4&n=", kEntries, "&p=k&v=v"));
  ASSERT_EQ(put.status, 200) << put.body;
  std::atomic<bool> ended{false};
  deploy::HttpResult job;
  std::thread run([&] {
    job = Invoke("probe", "/compute/map-copy?name=moving");
    ended = true;
  });
  // Once the job has copied some entries, move every shard to the other
  // node.
  while (!ended && Invoke("probe", "/kv/size?name=seen-entries").body == "0")
    std::this_thread::yield();
  int moved = 0;
  for (const auto& p : Proclets("moving")) {
    std::string to = p.value("node", "") == "node-a" ? "node-b" : "node-a";
    auto r = cluster_->gateway().Call(
        "POST",
        absl::StrCat("/system/proclets/", p.value("id", uint64_t{0}),
                     "/migrate"),
        json{{"node", to}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    moved += r.status == 200 && !ended;
  }
  run.join();
  ASSERT_EQ(job.status, 200) << job.body;
  EXPECT_GT(moved, 0) << "the job ended before any shard moved";
  auto r = Invoke(
      "probe",
      absl::StrCat("/kv/mget?name=seen-entries&n=", kEntries, "&p=k&v=v"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, std::to_string(kEntries));
  EXPECT_EQ(Invoke("probe", "/kv/size?name=seen-entries").body,
            std::to_string(kEntries));
}

// User code in a compute proclet is sandboxed like any instance: a syscall
// the seccomp policy forbids kills that instance and fails the job, saying
// why; the function keeps answering.
TEST_F(ComputeTest, ForbiddenSyscallInATaskFailsTheJobClearly) {
  StartCluster();
  if (IsSkipped()) return;
  DeployProbe();
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(Invoke("probe", absl::StrCat("/vec/push?name=few&v=", i)).status,
              200);
  auto r = Invoke("probe", "/compute/forbidden?name=few");
  EXPECT_NE(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("seccomp"), std::string::npos) << r.body;
  EXPECT_EQ(Invoke("probe", "/state").status, 200);
}

TEST_F(ComputeTest, BadInputGetsClearErrors) {
  StartCluster();
  if (IsSkipped()) return;
  DeployProbe();
  auto r = Invoke("probe", "/compute/count?name=nothing-here");
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_NE(r.body.find("no vector named \"nothing-here\""), std::string::npos)
      << r.body;
  ASSERT_EQ(Invoke("probe", "/kv/put?name=amap&k=a&v=1").status, 200);
  r = Invoke("probe", "/compute/count?name=amap");
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_NE(r.body.find("is a map, not a vector"), std::string::npos) << r.body;
  ASSERT_EQ(Invoke("probe", "/vec/push?name=one&v=1").status, 200);
  r = Invoke("probe", "/compute/unregistered?name=one&out=two");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("SILT_TASK"), std::string::npos) << r.body;
  r = Invoke("probe", "/compute/twice?name=one&out=amap");  // a map as output
  EXPECT_EQ(r.status, 409) << r.body;
}

}  // namespace
}  // namespace silt::testing
