// SharedMapShard: an instance's read-only view of a map shard its invoker
// owns, read while the owner changes it.
#include "proclets/shared_map.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "proclets/shard.h"

namespace silt::proclets {
namespace {

using Read = SharedMapShard::Read;
constexpr uint64_t kAll = UINT64_MAX;

std::unique_ptr<SharedMapShard> View(const MapShard& m) {
  auto v = SharedMapShard::Open(dup(m.arena().memory_fd()));
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *std::move(v) : nullptr;
}

TEST(SharedMapTest, ReadsWhatTheOwnerWroteWhileTheWindowIsOpen) {
  auto m = *MapShard::Create();
  ASSERT_TRUE(m->Put("a", "apple").ok());
  auto v = View(*m);
  ASSERT_NE(v, nullptr);
  std::string value;
  // A new arena's window is closed: its owner has not vouched for it.
  EXPECT_EQ(v->Get("a", KeyHash("a"), &value), Read::kNotHere);
  m->arena().SetWindow(0, kAll, true);
  EXPECT_EQ(v->Get("a", KeyHash("a"), &value), Read::kFound);
  EXPECT_EQ(value, "apple");
  EXPECT_EQ(v->Get("b", KeyHash("b"), &value), Read::kAbsent);
  EXPECT_EQ(v->Contains("a", KeyHash("a")), Read::kFound);
  ASSERT_TRUE(m->Put("a", "apricot, a longer value than before").ok());
  EXPECT_EQ(v->Get("a", KeyHash("a"), &value), Read::kFound);
  EXPECT_EQ(value, "apricot, a longer value than before");
  ASSERT_TRUE(m->Erase("a"));
  EXPECT_EQ(v->Get("a", KeyHash("a"), &value), Read::kAbsent);
  // Outside the window's range, or closed: the owner answers.
  m->arena().SetWindow(KeyHash("a") + 1, kAll, true);
  EXPECT_EQ(v->Get("a", KeyHash("a"), &value), Read::kNotHere);
  m->arena().SetWindow(0, kAll, false);
  EXPECT_EQ(v->Get("b", KeyHash("b"), &value), Read::kNotHere);
}

TEST(SharedMapTest, FollowsGrowthAndRetiresWithRebuildsAndDrops) {
  auto m = *MapShard::Create();
  m->arena().SetWindow(0, kAll, true);
  auto v = View(*m);
  ASSERT_NE(v, nullptr);
  // Far past the first mapping: the view remaps as the file grows.
  for (int i = 0; i < 20000; ++i)
    ASSERT_TRUE(m->Put("k" + std::to_string(i), std::string(64, 'x')).ok());
  std::string value;
  EXPECT_EQ(v->Get("k19999", KeyHash("k19999"), &value), Read::kFound);
  EXPECT_EQ(value, std::string(64, 'x'));
  // A split rebuilds the lower half into a fresh arena, which inherits the
  // window; the view of the old one is retired.
  uint64_t mid = *m->MedianHash();
  auto upper = m->SplitOff(mid);
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(v->Get("k1", KeyHash("k1"), &value), Read::kRetired);
  auto lower = View(*m);
  ASSERT_NE(lower, nullptr);
  m->arena().SetWindow(0, mid, true);
  const std::string low_key = KeyHash("k1") < mid ? "k1" : "k2";
  EXPECT_EQ(lower->Get(low_key, KeyHash(low_key), &value), Read::kFound);
  // Dropping the shard retires its arena too.
  m.reset();
  EXPECT_EQ(lower->Get(low_key, KeyHash(low_key), &value), Read::kRetired);
}

TEST(SharedMapTest, SharersCannotWriteOrShrinkTheFile) {
  auto m = *MapShard::Create();
  int fd = m->arena().memory_fd();
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0),
            MAP_FAILED);
  EXPECT_NE(ftruncate(fd, 4096), 0);
  EXPECT_NE(write(fd, "x", 1), 1);
  // The owner still writes through its own mapping, and grows.
  for (int i = 0; i < 5000; ++i)
    ASSERT_TRUE(m->Put("k" + std::to_string(i), std::string(100, 'y')).ok());
}

// A writer rewrites values that carry their key and a version; a reader in
// parallel must only ever see whole values, and each key's versions in order
// (a read never goes back in time).
TEST(SharedMapTest, ReadsUnderConcurrentChangesAreNeverTornNorOld) {
  constexpr int kKeys = 64;
  auto m = *MapShard::Create();
  auto make = [](int k, uint64_t version) {
    std::string s = std::to_string(k) + ":" + std::to_string(version) + ":";
    // Varying lengths: some updates stay in place, others move the entry.
    s.append(version % 7 * 13, static_cast<char>('a' + k % 26));
    return s;
  };
  for (int k = 0; k < kKeys; ++k)
    ASSERT_TRUE(m->Put("key" + std::to_string(k), make(k, 0)).ok());
  m->arena().SetWindow(0, kAll, true);
  auto v = View(*m);
  ASSERT_NE(v, nullptr);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t version = 1; !stop; ++version) {
      for (int k = 0; k < kKeys; ++k)
        if (!m->Put("key" + std::to_string(k), make(k, version)).ok()) return;
      // Deletes and re-inserts leave dead bytes: compactions happen too.
      if (version % 50 == 0) {
        m->Erase("key0");
        (void)m->Put("key0", make(0, version));
      }
    }
  });
  std::vector<uint64_t> last(kKeys, 0);
  int found = 0, retired = 0, bad = 0;
  std::string value;
  for (int i = 0; i < 200000 && bad == 0; ++i) {
    int k = i % kKeys;
    std::string key = "key" + std::to_string(k);
    Read r = v->Get(key, KeyHash(key), &value);
    if (r == Read::kRetired) {  // a compaction: take the new arena
      ++retired;
      v = View(*m);
      ASSERT_NE(v, nullptr);
      continue;
    }
    if (r != Read::kFound) continue;
    ++found;
    uint64_t version = std::stoull(value.substr(value.find(':') + 1));
    if (value != make(k, version) || version < last[k]) {
      ADD_FAILURE() << key << " read " << value << " after version " << last[k];
      ++bad;
    }
    last[k] = version;
  }
  stop = true;
  writer.join();
  EXPECT_GT(found, 1000);
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace silt::proclets
