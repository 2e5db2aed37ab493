// The migration target's spare arena (invoker/src/spare_arena.h): what Take
// hands out is backed by memory already, and a spare the size of the last
// arrival is made ready in the background.
#include "spare_arena.h"

#include <sys/mman.h>

#include <vector>

#include "common/process.h"
#include "gtest/gtest.h"

namespace silt::invoker {
namespace {

// How many of the arena's first `bytes` are resident.
size_t Resident(const proclets::Arena& a, size_t bytes) {
  const size_t pages = bytes / proclets::Arena::kPageSize;
  std::vector<unsigned char> in(pages);
  if (mincore(const_cast<char*>(a.data()), bytes, in.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n * proclets::Arena::kPageSize;
}

TEST(SpareArena, HandsOutBackedArenasAndKeepsOneReadyOfTheLastSize) {
  constexpr size_t kMiB = 1 << 20;
  SpareArena spare;
  EXPECT_EQ(spare.ready_bytes(), 0u);  // nothing arrived yet
  auto first = spare.Take(kMiB);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_GE(first->mapped(), kMiB);
  EXPECT_EQ(first->used(), 0u);
  EXPECT_EQ(Resident(*first, kMiB), kMiB);

  ASSERT_TRUE(
      silt::testing::Eventually([&] { return spare.ready_bytes() >= kMiB; }));
  auto second = spare.Take(kMiB);  // the spare
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(Resident(*second, kMiB), kMiB);
  ASSERT_TRUE(
      silt::testing::Eventually([&] { return spare.ready_bytes() >= kMiB; }));

  // Far larger: the spare is too small, so a new arena; the next spare
  // follows the new size.
  auto large = spare.Take(4 * kMiB);
  ASSERT_TRUE(large.ok());
  EXPECT_EQ(Resident(*large, 4 * kMiB), 4 * kMiB);
  EXPECT_TRUE(silt::testing::Eventually([&] {
    return spare.ready_bytes() >= 4 * kMiB;
  })) << spare.ready_bytes();
}

}  // namespace
}  // namespace silt::invoker
