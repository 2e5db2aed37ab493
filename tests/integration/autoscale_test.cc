// Autoscaling end to end, as OpenFaaS users see it: real silt-gateway and
// silt-invoker on loopback, the probe function deployed with
// com.openfaas.scale.* labels, bounded load from a few threads. Replicas
// climb to scale.max under load, come back to min after the (short, for the
// test) scale-down delay and to zero after zero-duration; the decisions show
// in `silt logs` and /metrics. Prints autoscale_to_max_s= and
// autoscale_back_s= (the README's figure).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/gateway_process.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Calls /function/NAME/PATH from `threads` threads until stopped.
class Load {
 public:
  Load(const GatewayProcess& gw, const std::string& path, int threads) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this, &gw, path] {
        while (!stop_) {
          auto r = gw.Call("GET", path, "", /*with_auth=*/false);
          (r.status == 200 ? ok_ : failed_)++;
        }
      });
    }
  }
  ~Load() { Stop(); }
  void Stop() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  int ok() const { return ok_; }
  int failed() const { return failed_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0}, failed_{0};
  std::vector<std::thread> threads_;
};

class AutoscaleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    auto r = BuildProbe("silt-autoscale-suite", &suite_dir_);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static void TearDownTestSuite() {
    if (!suite_dir_.empty()) std::filesystem::remove_all(suite_dir_);
  }

  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "instances run in namespaces and cgroups: run as root";
    dir_ = MakeTempDir("silt-autoscale");
    StartGateway();
    auto r = Silt({"login", "--password-stdin"}, gw_->password());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    StartInvoker();
    r = Silt({"push", "-f", suite_dir_ + "/stack.yml"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    image_ = "probe@" + r.out.substr(r.out.find("sha256:"), 71);
  }
  void TearDown() override {
    if (invoker_) invoker_->Stop(SIGTERM);
    invoker_.reset();
    gw_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Decisions every 100 ms over a 1 s window; down after 2 s of low load.
  // SILT_AUTOSCALE_DEFAULTS=1 keeps the gateway's own timings (1 s, 10 s,
  // 60 s) to measure what users get (the README's figure).
  static bool DefaultTimings() {
    const char* v = getenv("SILT_AUTOSCALE_DEFAULTS");
    return v != nullptr && std::string(v) == "1";
  }
  // Deadlines for conditions the autoscaler brings about.
  static std::chrono::seconds Deadline() {
    return std::chrono::seconds(DefaultTimings() ? 180 : 60);
  }
  void StartGateway() {
    std::vector<std::string> flags = {"--node-timeout-ms", "1000"};
    if (!DefaultTimings()) {
      flags.insert(flags.end(),
                   {"--autoscale-interval-ms", "100", "--autoscale-window-ms",
                    "1000", "--scale-down-delay-ms", "2000"});
    }
    auto gw = GatewayProcess::Start(dir_ + "/gateway", flags, grpc_listen_);
    ASSERT_TRUE(gw.ok()) << gw.status();
    gw_ = std::make_unique<GatewayProcess>(*std::move(gw));
    grpc_listen_ = gw_->grpc_address();  // a restart keeps the port
  }

  void StartInvoker() {
    auto p = Process::Start(
        {SILT_INVOKER_BIN, "--gateway", gw_->grpc_address(), "--listen",
         "127.0.0.1:0", "--data-dir", dir_ + "/node-a", "--node-name", "node-a",
         "--idle-timeout", "1", "--report-interval-ms", "100"});
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(p->WaitForLine("listening on ", std::chrono::seconds(30)).ok());
    invoker_ = std::make_unique<Process>(*std::move(p));
    ASSERT_TRUE(Eventually([&] {
      auto r = gw_->Call("GET", "/system/nodes");
      return r.status == 200 && json::parse(r.body).size() == 1;
    }));
  }

  RunResult Silt(std::vector<std::string> args, const std::string& input = "") {
    args.insert(args.begin(), SILT_CLI_BIN);
    return RunCommand(
        args, input,
        {{"OPENFAAS_CONFIG", dir_ + "/config"}, {"OPENFAAS_URL", gw_->url()}});
  }

  void Deploy(const std::map<std::string, std::string>& labels) {
    json d = {{"service", "probe"}, {"image", image_}, {"labels", labels}};
    auto r = gw_->Call("POST", "/system/functions", d.dump());
    ASSERT_EQ(r.status, 200) << r.body;
  }

  struct Replicas {
    uint64_t desired = 0, available = 0;
  };
  // The function's status; every look also checks that availableReplicas is
  // never above replicas.
  Replicas Status() {
    auto r = gw_->Call("GET", "/system/function/probe");
    if (r.status != 200) return {};
    auto j = json::parse(r.body);
    Replicas out{j.value("replicas", uint64_t{0}),
                 j.value("availableReplicas", uint64_t{0})};
    EXPECT_LE(out.available, out.desired) << r.body;
    return out;
  }

  // Waits (up to `timeout`) until the status has `desired` replicas and as
  // many available.
  bool WaitReplicas(uint64_t desired, std::chrono::seconds timeout) {
    return Eventually(
        [&] {
          Replicas r = Status();
          return r.desired == desired && r.available == desired;
        },
        timeout);
  }

  std::string Logs() { return Silt({"logs", "probe", "-o", "raw"}).out; }
  // Waits until `silt logs probe` shows `text`.
  bool LogsShow(const std::string& text) {
    return Eventually([&] { return absl::StrContains(Logs(), text); },
                      std::chrono::seconds(20));
  }

  // The autoscaler's target for the function, from /metrics (-1: none).
  int Target() {
    auto m = deploy::Send({.url = gw_->metrics_url() + "/metrics"});
    if (!m.ok()) return -1;
    const std::string key =
        "gateway_service_target_replicas{function_name=\"probe.openfaas-fn\"} ";
    size_t at = m->body.find(key);
    if (at == std::string::npos) return -1;
    return std::atoi(m->body.c_str() + at + key.size());
  }

  static std::string suite_dir_;
  std::string dir_;
  std::string image_;
  std::string grpc_listen_ = "127.0.0.1:0";
  std::unique_ptr<GatewayProcess> gw_;
  std::unique_ptr<Process> invoker_;
};

std::string AutoscaleTest::suite_dir_;

TEST_F(AutoscaleTest, CapacityLoadScalesToMaxAndBackToMin) {
  // One call in flight per replica (x 0.9): six callers of a 200 ms call
  // want seven replicas, capped at four.
  Deploy({{"com.openfaas.scale.type", "capacity"},
          {"com.openfaas.scale.target", "1"},
          {"com.openfaas.scale.min", "1"},
          {"com.openfaas.scale.max", "4"}});
  ASSERT_TRUE(WaitReplicas(1, std::chrono::seconds(30)));

  auto start = Clock::now();
  auto load = std::make_unique<Load>(*gw_, "/function/probe/sleep?ms=200", 6);
  // The invoker starts instances for calls that find none idle, so the
  // status can reach max before the autoscaler's target does.
  EXPECT_TRUE(WaitReplicas(4, Deadline()))
      << Status().desired << " " << Status().available;
  double up = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_TRUE(Eventually([&] { return Target() == 4; }, Deadline()))
      << Target();
  double target_up =
      std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(Status().desired, 4u);
  load->Stop();
  EXPECT_GT(load->ok(), 0);
  EXPECT_EQ(load->failed(), 0);

  start = Clock::now();
  EXPECT_TRUE(WaitReplicas(1, Deadline()))
      << Status().desired << " " << Status().available;
  double back = std::chrono::duration<double>(Clock::now() - start).count();
  printf(
      "autoscale_to_max_s=%.2f autoscale_target_max_s=%.2f "
      "autoscale_back_s=%.2f (capacity, target 1, max 4, 6 callers of a 200 ms "
      "call; %s)\n",
      up, target_up, back,
      DefaultTimings() ? "default timings: decisions every 1 s over a 10 s "
                         "window, scale-down delay 60 s"
                       : "decisions every 100 ms over a 1 s window, "
                         "scale-down delay 2 s");

  EXPECT_TRUE(LogsShow("-> 4: capacity load")) << Logs();
  EXPECT_TRUE(LogsShow("-> 1: load low")) << Logs();
  auto m = deploy::Send({.url = gw_->metrics_url() + "/metrics"});
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string& metrics_body = m->body;
  EXPECT_TRUE(absl::StrContains(
      metrics_body,
      "gateway_service_target_replicas{function_name=\"probe.openfaas-fn\"} "
      "1"))
      << metrics_body;
  EXPECT_TRUE(absl::StrContains(metrics_body,
                                "gateway_service_scale_events_total{direction="
                                "\"up\",function_name=\"probe.openfaas-fn\"}"))
      << metrics_body;
  EXPECT_TRUE(absl::StrContains(
      metrics_body,
      "gateway_service_count{function_name=\"probe.openfaas-fn\"} 1"))
      << metrics_body;
}

TEST_F(AutoscaleTest, RpsLoadScalesUp) {
  // Five calls a second per replica (x 0.9): four callers of a fast call
  // far exceed three replicas' worth.
  Deploy({{"com.openfaas.scale.target", "5"}, {"com.openfaas.scale.max", "3"}});
  ASSERT_TRUE(WaitReplicas(1, std::chrono::seconds(30)));
  {
    Load load(*gw_, "/function/probe/state", 4);
    EXPECT_TRUE(WaitReplicas(3, Deadline()))
        << Status().desired << " " << Status().available;
    EXPECT_TRUE(Eventually([&] { return Target() == 3; }, Deadline()))
        << Target();
  }
  EXPECT_TRUE(WaitReplicas(1, Deadline()))
      << Status().desired << " " << Status().available;
  EXPECT_TRUE(LogsShow("-> 3: rps load")) << Logs();
}

TEST_F(AutoscaleTest, ScalesToZeroWhenIdleAndBackOnACall) {
  Deploy({{"com.openfaas.scale.zero", "true"},
          {"com.openfaas.scale.zero-duration", "2s"},
          {"com.openfaas.scale.max", "3"}});
  ASSERT_EQ(gw_->Call("GET", "/function/probe/state", "", false).status, 200);
  // `silt logs --tail` (follow) shows the decision as it is made.
  auto follower = Process::Start(
      {SILT_CLI_BIN, "logs", "probe", "--tail", "-o", "raw"},
      {{"OPENFAAS_CONFIG", dir_ + "/config"}, {"OPENFAAS_URL", gw_->url()}});
  ASSERT_TRUE(follower.ok()) << follower.status();
  auto start = Clock::now();
  EXPECT_TRUE(WaitReplicas(0, Deadline()))
      << Status().desired << " " << Status().available;
  printf("autoscale_to_zero_s=%.2f (zero-duration 2 s)\n",
         std::chrono::duration<double>(Clock::now() - start).count());
  EXPECT_TRUE(LogsShow("-> 0: no calls for")) << Logs();
  EXPECT_TRUE(
      follower
          ->WaitForLine("silt: autoscaler: replicas 1 -> 0: no calls for",
                        std::chrono::seconds(20))
          .ok())
      << follower->output();
  follower->Stop(SIGTERM);

  // A call wakes it (a cold start) and the minimum comes back.
  auto r = gw_->Call("GET", "/function/probe/state", "", false);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(WaitReplicas(1, std::chrono::seconds(30)))
      << Status().desired << " " << Status().available;
  EXPECT_TRUE(LogsShow("0 -> 1: calls arrived")) << Logs();
  EXPECT_TRUE(WaitReplicas(1, std::chrono::seconds(30)));
}

TEST_F(AutoscaleTest, MalformedScalingLabelRefusesTheDeploy) {
  json d = {{"service", "probe"},
            {"image", image_},
            {"labels", {{"com.openfaas.scale.type", "memory"}}}};
  auto r = gw_->Call("POST", "/system/functions", d.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "com.openfaas.scale.type")) << r.body;
}

TEST_F(AutoscaleTest, RestartedGatewayKeepsTheReplicasItDecided) {
  Deploy({{"com.openfaas.scale.zero", "true"},
          {"com.openfaas.scale.zero-duration", "1s"}});
  ASSERT_TRUE(WaitReplicas(0, Deadline()));
  gw_->Stop(SIGTERM);
  StartGateway();
  // At zero before, at zero after: the decision is back before the first
  // round, and the restart does not wake the function.
  EXPECT_EQ(Status().desired, 0u);
  ASSERT_TRUE(Eventually([&] {
    auto r = gw_->Call("GET", "/system/nodes");
    return r.status == 200 && json::parse(r.body).size() == 1;
  }));
  EXPECT_EQ(Status().desired, 0u);
  EXPECT_EQ(Status().available, 0u);
}

}  // namespace
}  // namespace silt::testing
