// The resident budget's policy: which staged restorers and templates go when
// something new must fit.
#include "resident_budget.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace silt::invoker {
namespace {

using ::testing::ElementsAre;
using T = std::chrono::steady_clock::time_point;
constexpr uint64_t MiB = 1 << 20;

T At(int s) { return T() + std::chrono::seconds(s); }

TEST(ResidentBudgetTest, FitsWithoutLettingAnythingGo) {
  std::vector<ResidentHolder> h = {{ResidentKind::kRestorer, 10 * MiB, At(1)},
                                   {ResidentKind::kTemplate, 20 * MiB, At(2)}};
  auto plan = PlanEviction(h, 64 * MiB, 30 * MiB, At(3));
  ASSERT_TRUE(plan.has_value());
  EXPECT_TRUE(plan->empty());
}

TEST(ResidentBudgetTest, LeastRecentlyStartedGoFirstAndOnlyAsManyAsNeeded) {
  std::vector<ResidentHolder> h = {{ResidentKind::kRestorer, 16 * MiB, At(5)},
                                   {ResidentKind::kTemplate, 16 * MiB, At(1)},
                                   {ResidentKind::kRestorer, 16 * MiB, At(3)},
                                   {ResidentKind::kRestorer, 16 * MiB, At(7)}};
  // 64 held of 64: 20 more needs two of them to go, the oldest two.
  auto plan = PlanEviction(h, 64 * MiB, 20 * MiB, At(9));
  ASSERT_TRUE(plan.has_value());
  EXPECT_THAT(*plan, ElementsAre(1, 2));
}

TEST(ResidentBudgetTest, NothingUsedMoreRecentlyGoesForAnOlderFunction) {
  std::vector<ResidentHolder> h = {{ResidentKind::kRestorer, 32 * MiB, At(5)},
                                   {ResidentKind::kTemplate, 32 * MiB, At(6)}};
  // The function asking last started at 4: both holders are newer.
  EXPECT_FALSE(PlanEviction(h, 64 * MiB, 16 * MiB, At(4)).has_value());
  // At 5.5 only the first may go, and that is enough.
  auto plan = PlanEviction(h, 64 * MiB, 16 * MiB,
                           At(5) + std::chrono::milliseconds(500));
  ASSERT_TRUE(plan.has_value());
  EXPECT_THAT(*plan, ElementsAre(0));
}

TEST(ResidentBudgetTest, MoreThanTheWholeBudgetNeverFits) {
  EXPECT_FALSE(PlanEviction({}, 64 * MiB, 65 * MiB, T::max()).has_value());
  EXPECT_FALSE(PlanEviction({}, 0, 1, T::max()).has_value());
  EXPECT_TRUE(PlanEviction({}, 0, 0, T::max()).has_value());
}

TEST(ResidentBudgetTest, EnforcingBringsTheNodeBackUnderItsBudget) {
  // Over the budget (a holder grew, or the budget shrank): need 0.
  std::vector<ResidentHolder> h = {{ResidentKind::kTemplate, 40 * MiB, At(2)},
                                   {ResidentKind::kRestorer, 40 * MiB, At(1)},
                                   {ResidentKind::kRestorer, 40 * MiB, At(3)}};
  auto plan = PlanEviction(h, 64 * MiB, 0, T::max());
  ASSERT_TRUE(plan.has_value());
  EXPECT_THAT(*plan, ElementsAre(1, 0));
}

}  // namespace
}  // namespace silt::invoker
