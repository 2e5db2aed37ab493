// LoadPulse (invoker/src/load_pulse.h): what a node reports of its CPU use
// between full reports.
#include "load_pulse.h"

#include <chrono>
#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace silt::invoker {
namespace {

using std::chrono::milliseconds;
constexpr uint64_t kMs = 1000000;  // ns

LoadPulse::Sample At(LoadPulse::Clock::time_point t0, int ms, uint64_t cpu,
                     uint64_t ours = 0) {
  LoadPulse::Sample s;
  s.at = t0 + milliseconds(ms);
  s.cpu_nanos = cpu;
  s.instances_cpu_nanos = ours;
  s.cores = 1;
  s.memory = 1ull << 30;
  return s;
}

// A node cgroup at its quota of one core on a two-core machine: for the
// first 50 ms of each 100 ms CFS period it runs on both cores, then it is
// throttled. Over any window of a period it used one core; a window inside
// the throttled half saw none (20 ms windows read 0 there: a hot node looked
// idle to the rebalancer).
TEST(LoadPulseTest, AThrottledNodeReadsItsQuotaNotIdle) {
  LoadPulse pulse(/*change=*/0, milliseconds(100));
  auto t0 = LoadPulse::Clock::now();
  uint64_t cpu = 0;
  int pulses = 0;
  for (int ms = 0; ms <= 2000; ms += 5) {
    if (ms % 100 < 50) cpu += 2 * 5 * kMs;  // both cores for the last 5 ms
    auto p = pulse.Next(At(t0, ms, cpu));
    if (!p) continue;
    ++pulses;
    EXPECT_NEAR(p->cpu_used(), 1.0, 0.15) << "at " << ms << " ms";
    EXPECT_NEAR(p->cpu_foreign(), 1.0, 0.15) << "at " << ms << " ms";
  }
  EXPECT_GT(pulses, 300);
}

TEST(LoadPulseTest, NeverOverLessThanAWindow) {
  LoadPulse pulse(/*change=*/0, milliseconds(100));
  auto t0 = LoadPulse::Clock::now();
  EXPECT_FALSE(pulse.Next(At(t0, 0, 0)));
  EXPECT_FALSE(pulse.Next(At(t0, 5, 5 * kMs)));
  EXPECT_FALSE(pulse.Next(At(t0, 95, 95 * kMs), /*force=*/true));
  auto p = pulse.Next(At(t0, 100, 100 * kMs));
  ASSERT_TRUE(p);
  EXPECT_NEAR(p->cpu_used(), 1.0, 0.01);

  // An instance's cgroup went away (the instances' total fell): the split
  // between ours and foreign is unknown across it, so a new window starts,
  // and it says nothing until it is a window long.
  EXPECT_TRUE(pulse.Next(At(t0, 105, 105 * kMs, 50 * kMs)));
  EXPECT_FALSE(pulse.Next(At(t0, 110, 110 * kMs, 10 * kMs)));
  EXPECT_FALSE(pulse.Next(At(t0, 150, 150 * kMs, 50 * kMs)));
  p = pulse.Next(At(t0, 210, 210 * kMs, 110 * kMs));
  ASSERT_TRUE(p);
  EXPECT_NEAR(p->cpu_used(), 1.0, 0.01);
  EXPECT_NEAR(p->cpu_foreign(), 0.0, 0.01);
}

TEST(LoadPulseTest, SendsOnlyWhatMovedEnough) {
  LoadPulse pulse(/*change=*/0.05, milliseconds(100));
  auto t0 = LoadPulse::Clock::now();
  uint64_t cpu = 0;
  int pulses = 0;
  for (int ms = 0; ms <= 1000; ms += 5) {
    cpu += 5 * kMs / 2;  // half a core, steadily
    if (pulse.Next(At(t0, ms, cpu, cpu))) ++pulses;
  }
  EXPECT_EQ(pulses, 1) << "a steady node sends its figure once";
  // A CPU hog appears: foreign use climbs past 5% of the core.
  uint64_t ours = cpu;
  bool seen = false;
  for (int ms = 1005; ms <= 1300 && !seen; ms += 5) {
    cpu += 5 * kMs;
    ours += 5 * kMs / 2;
    auto p = pulse.Next(At(t0, ms, cpu, ours));
    seen = p && p->cpu_foreign() > 0.05;
  }
  EXPECT_TRUE(seen);
}

}  // namespace
}  // namespace silt::invoker
