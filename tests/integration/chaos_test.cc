// Chaos under load: sync and async calls keep coming (loopback, bounded)
// while the gateway, an invoker and a worker are killed with SIGKILL in turn.
// Sync calls succeed or fail fast with a reason, never hang; every accepted
// async call runs; afterwards the platform is as it was: the same functions,
// secrets and replicas, no orphaned instance processes, no instance cgroups
// without processes, no mounts left behind.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/callback_server.h"
#include "common/cluster.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr int kUpstreamTimeoutS = 10;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

pid_t ParentOf(pid_t pid) {
  std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  pid_t ppid = 0;
  return f.size() > 1 && absl::SimpleAtoi(f[1], &ppid) ? ppid : 0;
}

// Whether `pid` sits in an instance cgroup (silt/<node id>/...) of one of
// `node_ids`: ctest runs other tests beside this one, and their invokers'
// instances are none of this test's business.
bool InNodes(pid_t pid, const std::vector<std::string>& node_ids) {
  std::string cgroups = ReadFile(absl::StrCat("/proc/", pid, "/cgroup"));
  for (const auto& id : node_ids)
    if (absl::StrContains(cgroups, absl::StrCat("/silt/", id, "/")))
      return true;
  return false;
}

// Processes of function instances (silt-worker, or silt-restorer for one
// restored on the fast path), with the invoker each descends from (0: none
// alive, an orphan). With `node_ids`, only instances of those nodes.
std::map<pid_t, pid_t> Workers(
    const std::set<pid_t>& invokers,
    const std::vector<std::string>* node_ids = nullptr) {
  std::map<pid_t, pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    std::error_code ec;
    auto exe = fs::read_symlink(e.path() / "exe", ec);
    // "silt-worker (deleted)" once a restarted invoker replaced its copy;
    // an instance restored on the fast path runs as silt-restorer.
    std::string name = exe.filename().string();
    if (ec || !(absl::StartsWith(name, "silt-worker") ||
                absl::StartsWith(name, "silt-restorer")))
      continue;
    if (node_ids != nullptr && !InNodes(pid, *node_ids)) continue;
    pid_t owner = 0;
    for (pid_t p = pid; p > 1 && owner == 0; p = ParentOf(p))
      if (invokers.count(p)) owner = p;
    out[pid] = owner;
  }
  return out;
}

// Mounts in this (the host's) mount namespace under `dir` or CRIU's bind
// directory: an invoker's mounts must never land here.
int HostMountsUnder(const std::string& dir) {
  int n = 0;
  for (absl::string_view line :
       absl::StrSplit(ReadFile("/proc/self/mountinfo"), '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    if (f.size() > 4 && (absl::StartsWith(f[4], dir) ||
                         absl::StartsWith(f[4], "/run/silt-criu")))
      ++n;
  }
  return n;
}

// Leaf cgroups of instances (silt/<node id>/<instance>, v2 or each v1
// hierarchy) of the given nodes that hold no process: what a killed invoker
// leaves behind until its successor cleans up.
std::vector<std::string> EmptyInstanceCgroups(
    const std::vector<std::string>& node_ids, const std::string& except) {
  std::vector<std::string> n;
  std::vector<std::string> roots;
  for (absl::string_view line :
       absl::StrSplit(ReadFile("/proc/self/mountinfo"), '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    for (size_t i = 6; i + 1 < f.size(); ++i)
      if (f[i] == "-" && (f[i + 1] == "cgroup2" || f[i + 1] == "cgroup"))
        roots.emplace_back(f[4]);
  }
  for (const auto& root : roots) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(root, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_directory(ec)) continue;
      std::string p = it->path().string();
      bool ours = false;
      for (const auto& id : node_ids)
        ours = ours || absl::StrContains(p, "/silt/" + id + "/");
      if (!ours) continue;
      bool leaf = true;
      for (const auto& c : fs::directory_iterator(p, ec))
        if (c.is_directory()) leaf = false;
      bool excepted = !except.empty() && absl::EndsWith(p, except);
      if (leaf && !excepted && ReadFile(p + "/cgroup.procs").empty())
        n.push_back(p);
    }
  }
  return n;
}

struct Tally {
  std::atomic<int> sent{0}, ok{0}, failed_fast{0}, hung{0}, unexpected{0};
  std::atomic<int> refused{0}, s502{0}, s503{0}, s504{0};  // of failed_fast
  std::mutex mu;
  std::vector<std::string> unexpected_examples;
};

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "the chaos suite kills invokers, which need root for "
                      "namespaces and cgroups: run as root";
    dir_ = MakeTempDir("silt-chaos");
    ClusterOptions o;
    o.gateway_flags = {
        "--node-timeout-ms",      "1000",
        "--upstream-timeout",     absl::StrCat(kUpstreamTimeoutS),
        "--async-backoff-ms",     "50",
        "--async-max-backoff-ms", "500",
        "--no-autoscale"};
    auto c = Cluster::Start(dir_, o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    for (const char* n : {"node-a", "node-b"})
      ASSERT_TRUE(cluster_->AddNode({.name = n}).ok());
    ASSERT_TRUE(cluster_->WaitNodes(2).ok());
    auto cb = CallbackServer::Start();
    ASSERT_TRUE(cb.ok()) << cb.status();
    callbacks_ = *std::move(cb);
    url_ = cluster_->gateway().url();
  }
  void TearDown() override {
    stop_ = true;
    for (auto& t : load_) t.join();
    callbacks_.reset();
    cluster_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  GatewayProcess& gw() { return cluster_->gateway(); }
  std::string Url() {
    std::lock_guard<std::mutex> l(url_mu_);
    return url_;
  }

  std::set<pid_t> Invokers() {
    std::set<pid_t> out;
    for (const char* n : {"node-a", "node-b"})
      if (cluster_->node(n).pid() > 0) out.insert(cluster_->node(n).pid());
    return out;
  }

  // What a user can see of the platform's state.
  json Snapshot() {
    json out;
    auto fns = json::parse(gw().Call("GET", "/system/functions").body);
    for (const auto& f : fns)
      out["functions"][f.value("name", "")] = {
          {"image", f.value("image", "")},
          // The user's 2, or more instances while load keeps them.
          {"replicas_at_least_2", f.value("replicas", 0) >= 2},
          {"secrets", f.value("secrets", json::array())}};
    out["secrets"] = json::parse(gw().Call("GET", "/system/secrets").body);
    return out;
  }

  void SyncLoad(int id) {
    for (int i = 0; !stop_; ++i) {
      std::string body = absl::StrCat("sync-", id, "-", i);
      auto start = Clock::now();
      auto r = deploy::Send(
          {.method = "POST",
           .url = Url() + "/function/echo",
           .body = body,
           .timeout = std::chrono::seconds(kUpstreamTimeoutS + 20)});
      double secs = std::chrono::duration<double>(Clock::now() - start).count();
      ++sync_.sent;
      if (!r.ok() || r->status != 200)  // a client backs off a little
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (secs > kUpstreamTimeoutS + 2) {
        ++sync_.hung;
      } else if (!r.ok()) {
        ++sync_.failed_fast;  // refused or reset: the gateway is down
        ++sync_.refused;
      } else if (r->status == 200 && r->body == body) {
        ++sync_.ok;
      } else if ((r->status == 502 || r->status == 503 || r->status == 504) &&
                 !r->body.empty()) {
        ++sync_.failed_fast;
        ++(r->status == 502   ? sync_.s502
           : r->status == 503 ? sync_.s503
                              : sync_.s504);
      } else {
        ++sync_.unexpected;
        std::lock_guard<std::mutex> l(sync_.mu);
        if (sync_.unexpected_examples.size() < 5)
          sync_.unexpected_examples.push_back(absl::StrCat(
              r->status, " [", r->body, "] node ", r->Header("X-Silt-Node"),
              " start ", r->Header("X-Silt-Start"), " phase ", phase_.load()));
      }
    }
  }

  void AsyncLoad() {
    for (int i = 0; !stop_; ++i) {
      std::string id = absl::StrCat("chaos-", i);
      auto r = deploy::Send(
          {.method = "POST",
           .url = Url() + "/async-function/echo",
           .headers = {{"X-Call-Id", id},
                       {"X-Callback-Url", callbacks_->url() + "cb"}},
           .body = id,
           .timeout = std::chrono::seconds(10)});
      ++async_sent_;
      if (r.ok() && r->status == 202) {
        std::lock_guard<std::mutex> l(accepted_mu_);
        accepted_.insert(id);
      }
      // Paced by the gateway's own answer, bounded so the queue stays small.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Waits until `more` further sync calls succeeded (progress, not time).
  bool Progress(int more) {
    int target = sync_.ok + more;
    auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline && sync_.ok < target)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return sync_.ok >= target;
  }

  std::string dir_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<CallbackServer> callbacks_;
  std::mutex url_mu_;
  std::string url_;
  std::atomic<bool> stop_{false};
  std::atomic<int> phase_{0};
  std::vector<std::thread> load_;
  Tally sync_;
  std::atomic<int> async_sent_{0};
  std::mutex accepted_mu_;
  std::set<std::string> accepted_;
};

TEST_F(ChaosTest, LoadSurvivesKill9OfTheGatewayAnInvokerAndAWorker) {
  ASSERT_EQ(gw().Call("POST", "/system/secrets",
                      R"({"name":"token","value":"s3cret"})")
                    .status /
                100,
            2);
  std::string image =
      gw().PushExecBundle("echo", "sh run.sh", {{"run.sh", "cat\n"}});
  json d = {{"service", "echo"}, {"image", image}, {"secrets", {"token"}}};
  ASSERT_EQ(gw().Call("POST", "/system/functions", d.dump()).status / 100, 2);
  ASSERT_EQ(gw().Call("POST", "/system/scale-function/echo",
                      R"({"serviceName":"echo","replicas":2})")
                    .status /
                100,
            2);
  json before = Snapshot();
  int mounts_before = HostMountsUnder(dir_);

  for (int i = 0; i < 3; ++i) load_.emplace_back([this, i] { SyncLoad(i); });
  load_.emplace_back([this] { AsyncLoad(); });
  ASSERT_TRUE(Progress(20)) << "no calls succeed before any fault";

  // 1. The gateway.
  phase_ = 1;
  ASSERT_TRUE(cluster_->RestartGateway(SIGKILL).ok());
  {
    std::lock_guard<std::mutex> l(url_mu_);
    url_ = gw().url();
  }
  ASSERT_TRUE(Progress(20)) << "calls do not recover after the gateway";

  // 2. An invoker: its calls fail fast or move to the other node.
  phase_ = 2;
  cluster_->StopNode("node-a", SIGKILL);
  ASSERT_TRUE(Progress(20)) << "calls do not recover after node-a died";
  ASSERT_TRUE(cluster_->AddNode({.name = "node-a"}).ok());
  ASSERT_TRUE(cluster_->WaitNodes(2).ok());
  ASSERT_TRUE(Progress(20));

  // 3. A worker (a function instance).
  phase_ = 3;
  pid_t victim = 0;
  auto invokers = Invokers();
  auto pick_until = Clock::now() + std::chrono::seconds(30);
  while (victim == 0 && Clock::now() < pick_until) {
    for (auto [pid, owner] : Workers(invokers))  // an instance's first process
      if (owner != 0 && ParentOf(pid) == owner) victim = pid;
    if (victim == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (victim == 0) {
    for (auto [pid, owner] : Workers(invokers))
      printf("worker %d owner %d parent %d\n", pid, owner, ParentOf(pid));
  }
  ASSERT_NE(victim, 0) << "no instance of echo runs";
  // Its instance's cgroup: the invoker notices an idle instance died only at
  // its next use, so until then the cgroup stays, empty (not counted below).
  std::string victim_cgroup;
  for (absl::string_view line : absl::StrSplit(
           ReadFile(absl::StrCat("/proc/", victim, "/cgroup")), '\n'))
    if (absl::StrContains(line, "/silt/"))
      victim_cgroup = std::string(line.substr(line.rfind('/')));
  kill(victim, SIGKILL);
  ASSERT_TRUE(Progress(20)) << "calls do not recover after a worker died";

  stop_ = true;
  for (auto& t : load_) t.join();
  load_.clear();

  // Every accepted async call ran (at least once) and was called back.
  std::set<std::string> ran;
  size_t deliveries = 0;
  auto deadline = Clock::now() + std::chrono::seconds(120);
  auto all_ran = [&] {
    for (const auto& id : accepted_)
      if (!ran.count(id)) return false;
    return true;
  };
  while (Clock::now() < deadline && !all_ran()) {
    auto got = callbacks_->WaitFor(ran.size() + 1, std::chrono::seconds(1));
    deliveries = got.size();
    for (const auto& c : got)
      if (c.Header("X-Function-Status") == "200" &&
          c.body == c.Header("X-Call-Id"))
        ran.insert(c.Header("X-Call-Id"));
  }
  std::vector<std::string> lost;
  for (const auto& id : accepted_)
    if (!ran.count(id)) lost.push_back(id);

  printf(
      "chaos_sync_sent=%d\nchaos_sync_ok=%d\nchaos_sync_failed_fast=%d\n"
      "chaos_sync_failed_refused=%d\nchaos_sync_failed_502=%d\n"
      "chaos_sync_failed_503=%d\nchaos_sync_failed_504=%d\n"
      "chaos_sync_hung=%d\nchaos_sync_unexpected=%d\n"
      "chaos_async_sent=%d\nchaos_async_accepted=%zu\n"
      "chaos_async_lost=%zu\nchaos_async_duplicates=%zu\n",
      sync_.sent.load(), sync_.ok.load(), sync_.failed_fast.load(),
      sync_.refused.load(), sync_.s502.load(), sync_.s503.load(),
      sync_.s504.load(), sync_.hung.load(), sync_.unexpected.load(),
      async_sent_.load(), accepted_.size(), lost.size(),
      deliveries > ran.size() ? deliveries - ran.size() : 0);
  EXPECT_EQ(sync_.hung, 0);
  EXPECT_EQ(sync_.unexpected, 0)
      << (sync_.unexpected_examples.empty() ? ""
                                            : sync_.unexpected_examples[0]);
  EXPECT_TRUE(lost.empty())
      << lost.size() << " accepted async calls never ran, "
      << "e.g. " << lost[0];

  // The platform is as it was.
  EXPECT_EQ(Snapshot(), before);
  EXPECT_EQ(HostMountsUnder(dir_), mounts_before);
  std::vector<std::string> node_ids;
  for (const char* n : {"node-a", "node-b"}) {
    std::string id = ReadFile(dir_ + "/" + n + "/node-id");
    node_ids.push_back(id.substr(0, id.find('\n')));
  }
  auto settled = [&] {
    for (auto [pid, owner] : Workers(Invokers(), &node_ids))
      if (owner == 0) return false;
    return EmptyInstanceCgroups(node_ids, victim_cgroup).empty();
  };
  auto until = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < until && !settled())
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (auto [pid, owner] : Workers(Invokers(), &node_ids)) {
    std::string chain;
    for (pid_t p = pid; p > 1; p = ParentOf(p)) absl::StrAppend(&chain, p, " ");
    EXPECT_NE(owner, 0) << "silt-worker " << pid
                        << " belongs to no invoker: " << chain << "\n"
                        << ReadFile(absl::StrCat("/proc/", pid, "/cgroup"));
  }
  auto empty = EmptyInstanceCgroups(node_ids, victim_cgroup);
  EXPECT_TRUE(empty.empty()) << absl::StrJoin(empty, "\n");
}

}  // namespace
}  // namespace silt::testing
