// Nodes end to end on the multi-node harness (tests/common/cluster.h): an
// invoker stopped with SIGTERM drains its memory proclets to its peers first
// (or says what it loses), a node's --cpus/--memory are enforced on its
// instances by their parent cgroup, and the gateway exports proclet metrics.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/cluster.h"
#include "deploy/http_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The value of one series ("name{labels}" exactly as exported) in Prometheus
// text; nullopt when absent.
std::optional<double> Series(const std::string& text,
                             const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, series) || !absl::ConsumePrefix(&line, " "))
      continue;
    double v = 0;
    if (absl::SimpleAtod(line, &v)) return v;
  }
  return std::nullopt;
}

class NodeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    // One build of the probe function for the whole suite.
    auto r = BuildProbe("silt-node-suite", &suite_dir_);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static void TearDownTestSuite() {
    if (!suite_dir_.empty()) std::filesystem::remove_all(suite_dir_);
  }

  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "nodes run instances in namespaces and cgroups, each in "
                      "a network namespace of its own: run as root";
    dir_ = MakeTempDir("silt-node");
    auto c = Cluster::Start(dir_);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
  }
  void TearDown() override {
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  GatewayProcess& gw() { return cluster_->gateway(); }

  // Pushes the probe bundle (once the nodes are up) and deploys it.
  void DeployProbe(json d = json::object()) {
    if (image_.empty()) {
      auto r = cluster_->Silt({"push", "-f", suite_dir_ + "/stack.yml"});
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
      image_ = "probe@" + r.out.substr(r.out.find("sha256:"), 71);
    }
    d["service"] = "probe";
    d["image"] = image_;
    auto r = gw().Call("PUT", "/system/functions", d.dump());
    if (r.status == 404) r = gw().Call("POST", "/system/functions", d.dump());
    ASSERT_EQ(r.status, 200) << r.body;
  }

  deploy::HttpResult Invoke(const std::string& path,
                            const std::string& body = "") {
    return gw().Call("POST", "/function/probe" + path, body,
                     /*with_auth=*/false);
  }
  // A call that must succeed; returns its body.
  std::string Ok(const std::string& path, const std::string& body = "") {
    auto r = Invoke(path, body);
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    return r.body;
  }

  // The probe runs on node-a only and puts ~1.8 MiB into its map there.
  void PutTwoBigValuesFromNodeA() {
    DeployProbe({{"constraints", json::array({"node.name==node-a"})}});
    std::string big(900 << 10, 'x');
    EXPECT_EQ(Ok("/kv/put?k=big1", big), "ok");
    EXPECT_EQ(Ok("/kv/put?k=big2", big), "ok");
  }

  json Proclets() {
    auto r = gw().Call("GET", "/system/proclets");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  }

  std::string Metrics() {
    auto m = deploy::Send({.url = gw().metrics_url() + "/metrics"});
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? m->body : "";
  }

  static std::string suite_dir_;
  std::string dir_;
  std::string image_;
  std::unique_ptr<Cluster> cluster_;
};

std::string NodeTest::suite_dir_;

// A planned restart loses no state: SIGTERM moves every proclet to the peer
// before the node exits, and every value is there afterwards.
TEST_F(NodeTest, SigtermDrainsEveryProcletToAPeerFirst) {
  // node-b offers the most memory: it gets the shards.
  ASSERT_TRUE(cluster_->AddNode({.name = "node-a", .memory_mib = 2048}).ok());
  ASSERT_TRUE(cluster_->AddNode({.name = "node-b", .memory_mib = 8192}).ok());
  ASSERT_TRUE(cluster_->WaitNodes(2).ok());
  DeployProbe();
  EXPECT_EQ(Ok("/kv/mput?n=300&p=key&v=val"), "ok");
  EXPECT_EQ(Ok("/kv/put?k=single&v=one"), "ok");
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(Ok("/vec/push?name=v&v=" + std::to_string(10 + i)),
              std::to_string(i));
  Ok("/q/push?name=q", "first");
  Ok("/q/push?name=q", "second");
  json before = Proclets();
  ASSERT_EQ(before.size(), 3u) << before.dump();
  for (const auto& p : before) ASSERT_EQ(p["node"], "node-b") << p.dump();
  // The gateway counts the operations node-b served (from its reports).
  ASSERT_TRUE(Eventually([&] {
    return Series(Metrics(), "silt_proclet_ops_total{node=\"node-b\"}")
               .value_or(0) >= 5;
  })) << Metrics();

  auto start = Clock::now();
  int status = cluster_->StopNode("node-b", SIGTERM);
  auto took = Clock::now() - start;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_LT(took, std::chrono::seconds(30));  // within --drain-timeout

  // The drain finished before node-b exited: everything is on node-a,
  // active, and nothing was lost when node-b went.
  json after = Proclets();
  ASSERT_EQ(after.size(), 3u) << after.dump();
  for (const auto& p : after) {
    EXPECT_EQ(p["node"], "node-a") << p.dump();
    EXPECT_EQ(p["state"], "active") << p.dump();
  }
  ASSERT_TRUE(cluster_->WaitNodes(1).ok());
  EXPECT_EQ(Ok("/kv/mget?n=300&p=key&v=val"), "300");
  EXPECT_EQ(Ok("/kv/get?k=single"), "one");
  EXPECT_EQ(Ok("/kv/size"), "301");
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(Ok("/vec/get?name=v&i=" + std::to_string(i)),
              std::to_string(10 + i));
  EXPECT_EQ(Ok("/q/pop?name=q"), "first");
  EXPECT_EQ(Ok("/q/pop?name=q"), "second");

  // The metrics tell the same story.
  std::string m = Metrics();
  EXPECT_GE(Series(m, "silt_proclet_migrations_total{outcome=\"ok\"}"), 3) << m;
  EXPECT_EQ(Series(m, "silt_proclet_migrations_total{outcome=\"aborted\"}"), 0)
      << m;
  EXPECT_GE(Series(m, "silt_proclet_migration_seconds_count"), 3) << m;
  EXPECT_GE(Series(m, "silt_proclet_migration_pause_seconds_count"), 3) << m;
  EXPECT_EQ(Series(m, "silt_proclet_shards{state=\"active\"}"), 3) << m;
  EXPECT_EQ(Series(m, "silt_proclet_shards{state=\"lost\"}"), 0) << m;
  EXPECT_TRUE(absl::StrContains(m, "# TYPE silt_proclet_ops_total counter"));
  // node-a's gauges follow its next report; the operations since count there.
  EXPECT_TRUE(Eventually([&] {
    std::string now = Metrics();
    return Series(now, "silt_proclets{node=\"node-a\"}") == 3 &&
           Series(now, "silt_proclet_bytes{node=\"node-a\"}").value_or(0) > 0 &&
           Series(now, "silt_proclet_ops_total{node=\"node-a\"}").value_or(0) >=
               5;
  })) << Metrics();
}

// With no peer that has room, the node still stops promptly, and its proclets
// are marked lost (never silently empty).
TEST_F(NodeTest, SigtermWithNoRoomOnAnyPeerStopsAndLosesTheProclets) {
  ASSERT_TRUE(cluster_->AddNode({.name = "node-a", .memory_mib = 8192}).ok());
  // node-b offers 1 MiB: less than the map will hold. No instances run there.
  ASSERT_TRUE(cluster_->AddNode({.name = "node-b", .memory_mib = 1}).ok());
  ASSERT_TRUE(cluster_->WaitNodes(2).ok());
  PutTwoBigValuesFromNodeA();
  ASSERT_TRUE(Eventually([&] {
    json p = Proclets();
    return p.size() == 1 && p[0]["node"] == "node-a" &&
           p[0]["bytes"].get<uint64_t>() > (uint64_t{1} << 20);
  })) << Proclets().dump();

  auto start = Clock::now();
  int status = cluster_->StopNode("node-a", SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  ASSERT_TRUE(Eventually([&] {
    json p = Proclets();
    return p.size() == 1 && p[0]["state"] == "lost";
  })) << Proclets().dump();
  EXPECT_EQ(Proclets()[0]["node"], "node-a");
  EXPECT_EQ(Series(Metrics(), "silt_proclet_shards{state=\"lost\"}"), 1);
}

// A second signal during a drain stops the node at once, in the middle of
// copying its shard: node-a's link is slowed so that the copy would take a
// minute, and the shard stays behind, lost with the node.
TEST_F(NodeTest, SecondSignalDuringADrainStopsAtOnce) {
  ASSERT_TRUE(cluster_
                  ->AddNode({.name = "node-a",
                             .memory_mib = 8192,
                             .extra = {"--drain-timeout", "120"}})
                  .ok());
  ASSERT_TRUE(cluster_->AddNode({.name = "node-b", .memory_mib = 2048}).ok());
  ASSERT_TRUE(cluster_->WaitNodes(2).ok());
  PutTwoBigValuesFromNodeA();
  ASSERT_TRUE(Eventually([&] {
    json p = Proclets();
    return p.size() == 1 && p[0]["node"] == "node-a";
  })) << Proclets().dump();
  // ~1.8 MiB at 256 kbit/s: about a minute.
  auto shaped = cluster_->ShapeLink(
      "node-a", "tbf rate 256kbit burst 16kbit latency 5000ms");
  if (!shaped.ok()) GTEST_SKIP() << shaped;

  Process& node = cluster_->node("node-a");
  ASSERT_EQ(kill(node.pid(), SIGTERM), 0);
  auto line = node.WaitForLine("stopping: draining", std::chrono::seconds(10));
  EXPECT_TRUE(line.ok()) << line.status();
  ASSERT_TRUE(Eventually([&] {
    json p = Proclets();
    return p.size() == 1 && p[0]["state"] == "migrating";
  })) << Proclets().dump();
  auto start = Clock::now();
  int status = cluster_->StopNode("node-a", SIGTERM);  // the second signal
  auto took = Clock::now() - start;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_LT(took, std::chrono::seconds(15));
  // The copy was cut short: the shard is lost with node-a, not half moved.
  ASSERT_TRUE(Eventually([&] {
    json p = Proclets();
    return p.size() == 1 && p[0]["state"] == "lost";
  })) << Proclets().dump();
  EXPECT_EQ(Proclets()[0]["node"], "node-a");
}

// --cpus and --memory are enforced on the node's instances together by their
// parent cgroup; an instance's own limits stay below it.
TEST_F(NodeTest, CapacityIsEnforcedByTheInstancesParentCgroup) {
  auto added =
      cluster_->AddNode({.name = "node-a", .cpus = 1, .memory_mib = 256});
  ASSERT_TRUE(added.ok()) << added;
  ASSERT_TRUE(cluster_->WaitNodes(1).ok());
  // The parent cgroup: silt/<node id> below the invoker's own cgroup.
  std::string id = ReadFile(dir_ + "/node-a/node-id");
  while (!id.empty() && id.back() == '\n') id.pop_back();
  ASSERT_FALSE(id.empty());
  pid_t pid = cluster_->node("node-a").pid();
  auto own = [pid](const std::string& controller) -> std::string {
    for (absl::string_view line : absl::StrSplit(
             ReadFile(absl::StrCat("/proc/", pid, "/cgroup")), '\n')) {
      std::vector<std::string> f =
          absl::StrSplit(line, absl::MaxSplits(':', 2));
      if (f.size() != 3) continue;
      std::vector<std::string> names = absl::StrSplit(f[1], ',');
      if (controller.empty() ? f[1].empty()
                             : std::find(names.begin(), names.end(),
                                         controller) != names.end())
        return f[2] == "/" ? "" : f[2];
    }
    return "";
  };
  if (std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers")) {
    std::string dir = "/sys/fs/cgroup" + own("") + "/silt/" + id;
    EXPECT_EQ(ReadFile(dir + "/memory.max"), absl::StrCat(256 << 20, "\n"));
    EXPECT_EQ(ReadFile(dir + "/cpu.max"), "10000 10000\n");
  } else {
    std::string mem = "/sys/fs/cgroup/memory" + own("memory") + "/silt/" + id;
    std::string cpu = "/sys/fs/cgroup/cpu" + own("cpu") + "/silt/" + id;
    EXPECT_EQ(ReadFile(mem + "/memory.limit_in_bytes"),
              absl::StrCat(256 << 20, "\n"));
    EXPECT_EQ(ReadFile(cpu + "/cpu.cfs_period_us"), "10000\n");
    EXPECT_EQ(ReadFile(cpu + "/cpu.cfs_quota_us"), "10000\n");
  }

  // A function with no limits of its own cannot use more than the node
  // offers: the kernel kills the instance, and only it.
  DeployProbe();
  EXPECT_EQ(Ok("/alloc?mb=16"), "allocated 16 MiB");
  auto r = Invoke("/alloc?mb=400");
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_EQ(Ok("/alloc?mb=16"), "allocated 16 MiB");
  // Limits above the node's are capped to it (a v1 CPU quota above the
  // parent's would be refused), so the function still runs.
  DeployProbe({{"limits", {{"cpu", "4"}, {"memory", "1Gi"}}}});
  ASSERT_TRUE(Eventually([&] { return Invoke("/state").status == 200; }));
  EXPECT_EQ(Ok("/alloc?mb=16"), "allocated 16 MiB");
  r = Invoke("/alloc?mb=400");
  EXPECT_EQ(r.status, 502) << r.body;
}

}  // namespace
}  // namespace silt::testing
