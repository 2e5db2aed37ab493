// The autoscaler's decisions on a driven clock: fake load in, replicas out
// (no daemons; a real store in a temp dir for the kept decisions).
#include "autoscaler.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "store/store.h"

namespace silt::gateway {
namespace {

TEST(ScalePolicyTest, OpenFaasProDefaults) {
  auto p = ParseScalePolicy({});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->autoscaled);
  EXPECT_EQ(p->type, ScaleType::kRps);
  EXPECT_EQ(p->target, 50);
  EXPECT_DOUBLE_EQ(p->proportion, 0.90);
  EXPECT_EQ(p->min, 1u);
  EXPECT_EQ(p->max, 20u);
  EXPECT_FALSE(p->zero);
  EXPECT_EQ(p->zero_duration, absl::Minutes(15));
  // min alone sets a floor, not autoscaling.
  EXPECT_FALSE(ParseScalePolicy({{"com.openfaas.scale.min", "2"}})->autoscaled);
  auto q = ParseScalePolicy({{"com.openfaas.scale.type", "capacity"},
                             {"com.openfaas.scale.target", "5"},
                             {"com.openfaas.scale.target-proportion", "1.0"},
                             {"com.openfaas.scale.zero", "true"},
                             {"com.openfaas.scale.zero-duration", "1m30s"}});
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->autoscaled);
  EXPECT_EQ(q->type, ScaleType::kCapacity);
  EXPECT_EQ(q->target, 5);
  EXPECT_TRUE(q->zero);
  EXPECT_EQ(q->zero_duration, absl::Seconds(90));
}

TEST(ScalePolicyTest, MalformedLabelsAreNamed) {
  for (const auto& [label, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"type", "memory"},
           {"target", "0"},
           {"target", "lots"},
           {"target-proportion", "1.5"},
           {"max", "0"},
           {"zero", "maybe"},
           {"zero-duration", "soon"}}) {
    auto p = ParseScalePolicy({{"com.openfaas.scale." + label, value}});
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << label;
    EXPECT_TRUE(
        absl::StrContains(p.status().message(), "com.openfaas.scale." + label))
        << p.status();
  }
}

TEST(ScalePolicyTest, ReplicasForLoad) {
  ScalePolicy p;  // rps, 50 x 0.9, max 20
  EXPECT_EQ(ReplicasFor(p, 0), 0u);
  EXPECT_EQ(ReplicasFor(p, 1), 1u);
  EXPECT_EQ(ReplicasFor(p, 45), 1u);
  EXPECT_EQ(ReplicasFor(p, 46), 2u);
  EXPECT_EQ(ReplicasFor(p, 100000), 20u);
  p.type = ScaleType::kCapacity;  // the docs' example: 15 in flight, target 5
  p.target = 5;
  p.proportion = 1.0;
  EXPECT_EQ(ReplicasFor(p, 15), 3u);
}

class AutoscalerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("silt-autoscaler-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    auto s = store::Store::Open(
        {.path = dir_ + "/db", .secrets_key = std::string(32, 'k')});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    fn_.ns = "openfaas-fn";
    fn_.name = "f";
    fn_.replicas = 1;
  }
  void TearDown() override {
    scaler_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start() {
    AutoscalerOptions o;
    o.interval = absl::ZeroDuration();  // driven by Tick
    o.window = absl::Seconds(2);
    o.scale_down_delay = absl::Seconds(10);
    o.now = [this] { return now_; };
    Autoscaler::Hooks h;
    h.loads = [this] { return std::vector<FunctionLoad>{fn_}; };
    h.set_desired = [this](const std::string&, const std::string&,
                           std::optional<uint64_t> n) { pushed_ = n; };
    h.log = [this](const std::string&, const std::string&,
                   const std::string& text) { logs_.push_back(text); };
    auto a = Autoscaler::Start(o, std::move(h), store_.get(), &metrics_);
    ASSERT_TRUE(a.ok()) << a.status();
    scaler_ = *std::move(a);
  }

  // Advances the clock by `secs` one second at a time, ticking each second.
  void Run(int secs) {
    for (int i = 0; i < secs; ++i) {
      now_ += absl::Seconds(1);
      scaler_->Tick();
    }
  }

  std::string dir_;
  std::unique_ptr<store::Store> store_;
  Metrics metrics_;
  FunctionLoad fn_;
  absl::Time now_ = absl::FromUnixSeconds(1000000);
  std::optional<uint64_t> pushed_;
  std::vector<std::string> logs_;
  std::unique_ptr<Autoscaler> scaler_;
};

TEST_F(AutoscalerTest, CapacityUpAtOnceDownAfterTheDelay) {
  fn_.labels = {{"com.openfaas.scale.type", "capacity"},
                {"com.openfaas.scale.target", "1"},
                {"com.openfaas.scale.max", "4"}};
  Start();
  Run(1);
  EXPECT_EQ(pushed_, 1u);
  fn_.inflight = 10;
  Run(3);
  EXPECT_EQ(pushed_, 4u);  // capped at max
  EXPECT_EQ(scaler_->Desired("openfaas-fn", "f"), 4u);
  ASSERT_FALSE(logs_.empty());
  EXPECT_TRUE(absl::StrContains(logs_.back(), "-> 4: capacity load"))
      << logs_.back();
  fn_.inflight = 0;
  Run(8);
  EXPECT_EQ(pushed_, 4u);  // still within the delay
  Run(6);
  EXPECT_EQ(pushed_, 1u);
  EXPECT_TRUE(absl::StrContains(logs_.back(), "4 -> 1: load low"))
      << logs_.back();
  std::string m = metrics_.Render({});
  EXPECT_TRUE(
      absl::StrContains(m,
                        "gateway_service_scale_events_total{direction=\"up\","
                        "function_name=\"f.openfaas-fn\"}"))
      << m;
  EXPECT_TRUE(absl::StrContains(
      m, "gateway_service_target_replicas{function_name=\"f.openfaas-fn\"} 1"))
      << m;
}

TEST_F(AutoscalerTest, RpsOverTheWindow) {
  fn_.labels = {{"com.openfaas.scale.target", "10"}};  // 9 calls/s a replica
  Start();
  for (int i = 0; i < 5; ++i) {
    fn_.calls += 30;  // 30 calls/s
    Run(1);
  }
  EXPECT_EQ(pushed_, 4u);  // ceil(30 / 9)
}

TEST_F(AutoscalerTest, CpuInMillicores) {
  fn_.labels = {{"com.openfaas.scale.type", "cpu"},
                {"com.openfaas.scale.target", "500"},
                {"com.openfaas.scale.target-proportion", "1"}};
  fn_.cpu_cores = 2.2;  // 2200m: five replicas of 500m
  Start();
  Run(2);
  EXPECT_EQ(pushed_, 5u);
  EXPECT_TRUE(absl::StrContains(logs_.back(), "-> 5: cpu load 2200.00m CPU"))
      << logs_.back();
}

TEST_F(AutoscalerTest, ZeroAfterIdleDurationBackOnACall) {
  fn_.labels = {{"com.openfaas.scale.zero", "true"},
                {"com.openfaas.scale.zero-duration", "30s"}};
  Start();
  Run(29);
  EXPECT_EQ(pushed_, 1u);
  Run(2);
  EXPECT_EQ(pushed_, 0u);
  EXPECT_TRUE(absl::StrContains(logs_.back(), "1 -> 0: no calls for"))
      << logs_.back();
  fn_.calls = 1;
  Run(1);
  EXPECT_EQ(pushed_, 1u);
  EXPECT_TRUE(absl::StrContains(logs_.back(), "0 -> 1: calls arrived"))
      << logs_.back();
}

TEST_F(AutoscalerTest, UserCountIsTheFloorAndTakesEffectAtOnce) {
  fn_.labels = {{"com.openfaas.scale.max", "10"}};
  Start();
  fn_.calls = 100;
  Run(1);
  fn_.replicas = 3;  // /system/scale-function
  Run(1);
  EXPECT_EQ(pushed_, 3u);
  fn_.replicas = 0;  // scaled to zero by hand: earlier calls do not hold it
  Run(1);
  EXPECT_EQ(pushed_, 0u);
}

TEST_F(AutoscalerTest, RestartKeepsTheDecision) {
  fn_.labels = {{"com.openfaas.scale.type", "capacity"},
                {"com.openfaas.scale.target", "1"}};
  Start();
  fn_.inflight = 5;
  Run(3);
  ASSERT_EQ(pushed_, 6u);  // ceil(5 / 0.9)
  scaler_.reset();
  pushed_.reset();
  fn_.inflight = 0;
  Start();
  EXPECT_EQ(pushed_, 6u);  // before any round
  Run(1);
  EXPECT_EQ(pushed_, 6u);  // held for the delay, then down
  Run(11);
  EXPECT_EQ(pushed_, 1u);
}

TEST_F(AutoscalerTest, FunctionWithoutScaleLabelsIsLeftAlone) {
  fn_.labels = {{"com.openfaas.scale.min", "2"}};
  fn_.inflight = 100;
  Start();
  Run(3);
  EXPECT_FALSE(pushed_.has_value());
  EXPECT_FALSE(scaler_->Desired("openfaas-fn", "f").has_value());
}

}  // namespace
}  // namespace silt::gateway
