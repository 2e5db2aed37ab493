#include "proclets/shard.h"

#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gtest/gtest.h"

namespace silt::proclets {
namespace {

using Contents = std::map<std::string, std::string>;

// The receiving side of a migration: a fresh arena holding a byte copy.
Arena CopyOf(const Arena& source) {
  absl::StatusOr<Arena> copy = Arena::Create();
  EXPECT_TRUE(copy.ok()) << copy.status();
  absl::Status s = copy->WriteAt(
      0, std::string_view(source.data(), source.used()), source.used());
  EXPECT_TRUE(s.ok()) << s;
  return *std::move(copy);
}

// Applies the source's dirty runs to `target`, as a pre-copy round does.
void ApplyDirty(Arena& source, Arena& target) {
  for (const auto& [offset, length] : source.TakeDirty()) {
    ASSERT_LE(offset + length, source.used());
    absl::Status s =
        target.WriteAt(offset, std::string_view(source.data() + offset, length),
                       source.used());
    ASSERT_TRUE(s.ok()) << s;
  }
  // Nothing was written, yet used() may differ (nothing allocated either).
  ASSERT_TRUE(target.WriteAt(0, "", source.used()).ok());
}

bool SameBytes(const Arena& a, const Arena& b) {
  return a.used() == b.used() && memcmp(a.data(), b.data(), a.used()) == 0;
}

Contents MapContents(const MapShard& map) {
  Contents contents;
  map.ForEach([&](std::string_view k, std::string_view v) {
    EXPECT_TRUE(contents.emplace(std::string(k), std::string(v)).second)
        << "duplicate key " << k;
  });
  return contents;
}

std::vector<std::string> VectorContents(const VectorShard& vec) {
  absl::StatusOr<std::vector<std::string_view>> range =
      vec.Range(vec.first(), vec.count());
  EXPECT_TRUE(range.ok()) << range.status();
  return {range->begin(), range->end()};
}

std::vector<std::string> Drain(QueueShard& queue) {
  std::vector<std::string> values;
  while (std::optional<std::string> v = queue.Pop()) values.push_back(*v);
  return values;
}

std::string Value(std::mt19937_64& rng, size_t max_len) {
  std::string v(rng() % (max_len + 1), '\0');
  for (char& c : v) c = static_cast<char>('a' + rng() % 26);
  return v;
}

std::unique_ptr<MapShard> NewMap() {
  absl::StatusOr<std::unique_ptr<MapShard>> map = MapShard::Create();
  EXPECT_TRUE(map.ok()) << map.status();
  return *std::move(map);
}

std::unique_ptr<MapShard> FilledMap(int n, uint64_t seed) {
  std::unique_ptr<MapShard> map = NewMap();
  std::mt19937_64 rng(seed);
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(map->Put("key" + std::to_string(i), Value(rng, 64)).ok());
  }
  return map;
}

// --- Names and hash. -------------------------------------------------------

TEST(ShardKind, NamesRoundTrip) {
  for (ShardKind kind :
       {ShardKind::kMap, ShardKind::kVector, ShardKind::kQueue}) {
    EXPECT_EQ(ParseShardKind(ShardKindName(kind)), kind);
  }
  EXPECT_EQ(ShardKindName(ShardKind::kVector), "vector");
  EXPECT_EQ(ParseShardKind("list"), std::nullopt);
}

TEST(KeyHash, IsPinned) {
  // The directory's ranges depend on these values: they must never change.
  EXPECT_EQ(KeyHash(""), 0x93228a4de0eec5a2ull);
  EXPECT_EQ(KeyHash("a"), 0xaced12527fe5bff8ull);
  EXPECT_EQ(KeyHash("hello world"), 0xe7f8b1dc82171923ull);
  EXPECT_EQ(KeyHash(std::string(100, 'x')), 0x39d3b1617320fdbfull);
}

TEST(KeyHash, SpreadsKeys) {
  std::unordered_set<uint64_t> seen;
  std::vector<int> low(256), high(256);
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    uint64_t h = KeyHash("user:" + std::to_string(i));
    seen.insert(h);
    ++low[h & 255];
    ++high[h >> 56];
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(n));
  for (int b = 0; b < 256; ++b) {
    // Expected 781 per bucket; a fair hash stays well inside +-25%.
    EXPECT_GT(low[b], 585) << b;
    EXPECT_LT(low[b], 977) << b;
    EXPECT_GT(high[b], 585) << b;
    EXPECT_LT(high[b], 977) << b;
  }
}

// --- Arena. ----------------------------------------------------------------

TEST(Arena, AllocatesAlignedAndGrowsKeepingBytes) {
  absl::StatusOr<Arena> arena = Arena::Create(4096);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<uint64_t> off = arena->Allocate(1 + i % 13);
    ASSERT_TRUE(off.ok());
    EXPECT_EQ(*off % 8, 0u);
    memset(arena->data() + *off, i & 0xff, 1 + i % 13);
    offsets.push_back(*off);
  }
  EXPECT_GE(arena->mapped(), arena->used());
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(static_cast<unsigned char>(arena->data()[offsets[i]]), i & 0xff);
  }
  Arena moved = *std::move(arena);
  EXPECT_EQ(static_cast<unsigned char>(moved.data()[offsets[999]]), 999 & 0xff);
  moved.Reset();
  EXPECT_EQ(moved.used(), 0u);
}

TEST(Arena, TakeDirtyCoalescesBlocksAndClipsToUsed) {
  constexpr uint64_t kBlock = Arena::kDirtyBlock;
  absl::StatusOr<Arena> arena = Arena::Create();
  ASSERT_TRUE(arena.ok());
  ASSERT_TRUE(arena->Allocate(10 * kBlock + 100).ok());
  arena->MarkDirty(0, 1);  // Not tracking: ignored.
  arena->TrackWrites(true);
  EXPECT_TRUE(arena->TakeDirty().empty());
  arena->MarkDirty(10, 1);
  arena->MarkDirty(kBlock + 5, kBlock);  // Blocks 1 and 2.
  arena->MarkDirty(5 * kBlock, 1);
  arena->MarkDirty(10 * kBlock + 3, 2);
  std::vector<std::pair<uint64_t, uint64_t>> want = {
      {0, 3 * kBlock}, {5 * kBlock, kBlock}, {10 * kBlock, 100}};
  EXPECT_EQ(arena->TakeDirty(), want);
  EXPECT_TRUE(arena->TakeDirty().empty());
  arena->TrackWrites(false);
  arena->MarkDirty(0, 1);
  EXPECT_TRUE(arena->TakeDirty().empty());
}

TEST(Arena, WriteAtGrowsAndChecksBounds) {
  absl::StatusOr<Arena> arena = Arena::Create();
  ASSERT_TRUE(arena.ok());
  ASSERT_TRUE(arena->WriteAt(1 << 20, "tail", (1 << 20) + 4).ok());
  EXPECT_EQ(arena->used(), (1u << 20) + 4);
  EXPECT_EQ(std::string_view(arena->data() + (1 << 20), 4), "tail");
  EXPECT_EQ(arena->WriteAt(10, "abc", 12).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(arena->WriteAt(UINT64_MAX, "a", 12).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(arena->WriteAt(0, "", uint64_t{1} << 60).code(),
            absl::StatusCode::kResourceExhausted);
}

// --- MapShard. -------------------------------------------------------------

TEST(MapShard, RandomOpsMatchUnorderedMap) {
  std::unique_ptr<MapShard> map = NewMap();
  std::unordered_map<std::string, std::string> model;
  std::mt19937_64 rng(42);
  const int kKeys = 100000;
  auto key = [](uint64_t i) { return "k" + std::to_string(i); };
  for (int i = 0; i < kKeys; ++i) {
    std::string v = Value(rng, 40);
    ASSERT_TRUE(map->Put(key(i), v).ok());
    model[key(i)] = v;
  }
  for (int op = 0; op < 400000; ++op) {
    const std::string k = key(rng() % (kKeys + kKeys / 4));
    switch (rng() % 6) {
      case 0:  // Bigger value: usually relocates.
      case 1: {
        std::string v = Value(rng, rng() % 8 == 0 ? 2000 : 120);
        ASSERT_TRUE(map->Put(k, v).ok());
        model[k] = v;
        break;
      }
      case 2: {  // Smaller value: in place.
        std::string v = Value(rng, 8);
        ASSERT_TRUE(map->Put(k, v).ok());
        model[k] = v;
        break;
      }
      case 3:
        ASSERT_EQ(map->Erase(k), model.erase(k) == 1) << k;
        break;
      case 4:
        ASSERT_EQ(map->Contains(k), model.count(k) == 1) << k;
        break;
      default: {
        absl::StatusOr<std::string_view> got = map->Get(k);
        auto it = model.find(k);
        if (it == model.end()) {
          ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound);
        } else {
          ASSERT_TRUE(got.ok()) << k;
          ASSERT_EQ(*got, it->second);
        }
      }
    }
    ASSERT_EQ(map->count(), model.size());
  }
  uint64_t bytes = 0;
  for (const auto& [k, v] : model) {
    absl::StatusOr<std::string_view> got = map->Get(k);
    ASSERT_TRUE(got.ok()) << k;
    EXPECT_EQ(*got, v);
    bytes += k.size() + v.size();
  }
  EXPECT_EQ(map->live_bytes(), bytes);
  EXPECT_EQ(MapContents(*map), Contents(model.begin(), model.end()));
  // Compaction keeps the arena within a small multiple of the live data.
  EXPECT_LT(map->arena().used(), 4 * bytes + (8 << 20));
}

TEST(MapShard, EmptyKeysAndValuesAndReinsertAfterErase) {
  std::unique_ptr<MapShard> map = NewMap();
  ASSERT_TRUE(map->Put("", "empty key").ok());
  ASSERT_TRUE(map->Put("k", "").ok());
  EXPECT_EQ(*map->Get(""), "empty key");
  EXPECT_EQ(*map->Get("k"), "");
  EXPECT_TRUE(map->Erase(""));
  EXPECT_FALSE(map->Erase(""));
  EXPECT_FALSE(map->Contains(""));
  ASSERT_TRUE(map->Put("", "again").ok());
  EXPECT_EQ(*map->Get(""), "again");
  EXPECT_EQ(map->count(), 2u);
}

TEST(MapShard, ErasingEverythingLeavesAWorkingIndex) {
  std::unique_ptr<MapShard> map = NewMap();
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 5000; ++i) {
      ASSERT_TRUE(map->Put(std::to_string(i), std::to_string(round)).ok());
    }
    for (int i = 0; i < 5000; ++i) ASSERT_TRUE(map->Erase(std::to_string(i)));
    EXPECT_EQ(map->count(), 0u);
    EXPECT_EQ(map->live_bytes(), 0u);
    EXPECT_EQ(map->Get("1").status().code(), absl::StatusCode::kNotFound);
  }
}

TEST(MapShard, OverwritesCompactTheHeap) {
  std::unique_ptr<MapShard> map = NewMap();
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    // Ever-growing values relocate each time, leaving dead entries behind.
    ASSERT_TRUE(
        map->Put("key" + std::to_string(i % 100), std::string(i % 1000, 'v'))
            .ok());
  }
  EXPECT_EQ(map->count(), 100u);
  EXPECT_LT(map->arena().used(), 1u << 20);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(map->Get("key" + std::to_string(i))->size(),
              static_cast<size_t>((199900 + i) % 1000));
  }
}

TEST(MapShard, SizeLimitsAreResourceExhausted) {
  std::unique_ptr<MapShard> map = NewMap();
  const std::string big_key(kMaxKeyBytes + 1, 'k');
  const std::string big_value(kMaxValueBytes + 1, 'v');
  absl::Status s = map->Put(big_key, "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find(std::to_string(kMaxKeyBytes)), std::string::npos)
      << s;
  s = map->Put("k", big_value);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find(std::to_string(kMaxValueBytes)), std::string::npos)
      << s;
  EXPECT_EQ(map->count(), 0u);
  // The limits themselves are allowed.
  ASSERT_TRUE(
      map->Put(std::string(kMaxKeyBytes, 'k'), std::string(kMaxValueBytes, 'v'))
          .ok());
  EXPECT_EQ(map->Get(std::string(kMaxKeyBytes, 'k'))->size(), kMaxValueBytes);
}

TEST(MapShard, AdoptOfByteCopyIsIdentical) {
  std::unique_ptr<MapShard> map = FilledMap(30000, 1);
  for (int i = 0; i < 30000; i += 3) map->Erase("key" + std::to_string(i));
  absl::StatusOr<std::unique_ptr<MapShard>> copy =
      MapShard::Adopt(CopyOf(map->arena()));
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ((*copy)->count(), map->count());
  EXPECT_EQ((*copy)->live_bytes(), map->live_bytes());
  EXPECT_EQ(MapContents(**copy), MapContents(*map));
  // The copy is a fully working shard.
  ASSERT_TRUE((*copy)->Put("new", "value").ok());
  EXPECT_EQ(*(*copy)->Get("new"), "value");
  EXPECT_EQ(*(*copy)->Get("key1"), *map->Get("key1"));
}

TEST(MapShard, SplitAtMedianAndAbsorbBack) {
  std::unique_ptr<MapShard> map = FilledMap(50000, 2);
  const Contents original = MapContents(*map);
  std::optional<uint64_t> mid = map->MedianHash();
  ASSERT_TRUE(mid.has_value());
  absl::StatusOr<std::unique_ptr<MapShard>> high = map->SplitOff(*mid);
  ASSERT_TRUE(high.ok()) << high.status();
  EXPECT_EQ(map->count() + (*high)->count(), original.size());
  EXPECT_GT(map->count(), 24000u);
  EXPECT_GT((*high)->count(), 24000u);
  map->ForEach([&](std::string_view k, std::string_view) {
    EXPECT_LT(KeyHash(k), *mid);
  });
  (*high)->ForEach([&](std::string_view k, std::string_view) {
    EXPECT_GE(KeyHash(k), *mid);
  });
  for (const auto& [k, v] : original) {
    const MapShard& owner = KeyHash(k) < *mid ? *map : **high;
    absl::StatusOr<std::string_view> got = owner.Get(k);
    ASSERT_TRUE(got.ok()) << k;
    EXPECT_EQ(*got, v);
  }
  uint64_t bytes = 0;
  for (const auto& [k, v] : original) bytes += k.size() + v.size();
  EXPECT_EQ(map->live_bytes() + (*high)->live_bytes(), bytes);

  ASSERT_TRUE(map->Absorb(**high).ok());
  EXPECT_EQ(MapContents(*map), original);
  EXPECT_EQ(map->live_bytes(), bytes);
  EXPECT_EQ(map->Absorb(*map).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MapShard, MedianNeedsTwoDistinctHashes) {
  std::unique_ptr<MapShard> map = NewMap();
  EXPECT_EQ(map->MedianHash(), std::nullopt);
  ASSERT_TRUE(map->Put("only", "1").ok());
  EXPECT_EQ(map->MedianHash(), std::nullopt);
  ASSERT_TRUE(map->Put("second", "2").ok());
  std::optional<uint64_t> mid = map->MedianHash();
  ASSERT_TRUE(mid.has_value());
  EXPECT_EQ(*mid, std::max(KeyHash("only"), KeyHash("second")));
  absl::StatusOr<std::unique_ptr<MapShard>> high = map->SplitOff(*mid);
  ASSERT_TRUE(high.ok());
  EXPECT_EQ(map->count(), 1u);
  EXPECT_EQ((*high)->count(), 1u);
}

// Scans in batches of about `batch` bytes from position 0, calling
// between(next) after each batch; the keys seen, in order, and whether the
// positions never went back.
std::vector<std::string> ScanAll(
    const MapShard& map, size_t batch, uint64_t lo = 0,
    uint64_t hi = UINT64_MAX,
    const std::function<void(uint64_t)>& between = {}) {
  std::vector<std::string> keys;
  uint64_t at = 0;
  uint32_t last = 0;
  while (at < kScanEnd) {
    uint64_t next =
        map.Scan(lo, hi, at, kScanEnd, batch,
                 [&](uint32_t pos, std::string_view k, std::string_view) {
                   EXPECT_GE(pos, at);
                   EXPECT_GE(pos, last);
                   EXPECT_EQ(pos, ScanPosition(KeyHash(k)));
                   last = pos;
                   keys.emplace_back(k);
                 });
    EXPECT_GT(next, at);
    at = next;
    if (between) between(at);
  }
  return keys;
}

TEST(MapShard, ScanSeesEveryEntryOnceInPositionOrder) {
  std::unique_ptr<MapShard> map = FilledMap(20000, 3);
  const Contents original = MapContents(*map);
  std::vector<std::string> keys = ScanAll(*map, 4096);
  EXPECT_EQ(keys.size(), original.size());
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(),
            original.size());
  // One batch for everything gives the same order.
  EXPECT_EQ(ScanAll(*map, SIZE_MAX), keys);
  // A hash range: only its keys.
  const uint64_t mid = uint64_t{1} << 63;
  std::vector<std::string> low = ScanAll(*map, 4096, 0, mid);
  size_t want = 0;
  for (const auto& [k, v] : original) want += KeyHash(k) < mid;
  EXPECT_EQ(low.size(), want);
  for (const auto& k : low) EXPECT_LT(KeyHash(k), mid);
}

// The index grows (rehash), entries are rewritten and erased
// between batches: every entry there throughout is still seen exactly once.
TEST(MapShard, ScanSurvivesGrowthAndRewritesBetweenBatches) {
  std::unique_ptr<MapShard> map = FilledMap(2000, 4);
  const Contents original = MapContents(*map);
  std::set<std::string> erased;
  int round = 0;
  std::vector<std::string> keys =
      ScanAll(*map, 2048, 0, UINT64_MAX, [&](uint64_t) {
        if (++round > 8) return;
        const std::string tag = "new-" + std::to_string(round) + "-";
        for (int i = 0; i < 1000; ++i)  // grows the index several times
          ASSERT_TRUE(
              map->Put(tag + std::to_string(i), std::string(40, 'n')).ok());
        for (int i = 0; i < 1000; ++i)  // rewrites: dead bytes, compaction
          ASSERT_TRUE(
              map->Put(tag + std::to_string(i), std::string(80, 'm')).ok());
        for (int i = 0; i < 1000; i += 2) map->Erase(tag + std::to_string(i));
      });
  ASSERT_GT(round, 8);
  std::map<std::string, int> times;
  for (const auto& k : keys) ++times[k];
  for (const auto& [k, v] : original) EXPECT_EQ(times[k], 1) << k;
  for (const auto& [k, n] : times) EXPECT_EQ(n, 1) << k;
}

// --- Adopt of bad bytes. ---------------------------------------------------

TEST(Adopt, RejectsGarbageAndTruncation) {
  auto adopt_bytes = [](std::string_view bytes) {
    absl::StatusOr<Arena> a = Arena::Create();
    EXPECT_TRUE(a.ok());
    EXPECT_TRUE(a->WriteAt(0, bytes, bytes.size()).ok());
    return MapShard::Adopt(*std::move(a)).status();
  };
  EXPECT_EQ(adopt_bytes("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(adopt_bytes(std::string(4096, '\x5a')).code(),
            absl::StatusCode::kInvalidArgument);

  std::unique_ptr<MapShard> map = FilledMap(2000, 3);
  const std::string bytes(map->arena().data(), map->arena().used());
  // Truncated anywhere: the index or an entry falls off the end.
  for (size_t cut : {size_t{8}, size_t{64}, size_t{100}, bytes.size() / 2,
                     bytes.size() - 1}) {
    absl::StatusCode code = adopt_bytes(bytes.substr(0, cut)).code();
    EXPECT_TRUE(code == absl::StatusCode::kInvalidArgument ||
                code == absl::StatusCode::kDataLoss)
        << cut << ": " << code;
  }
  // Right bytes, wrong kind.
  EXPECT_EQ(VectorShard::Adopt(CopyOf(map->arena())).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QueueShard::Adopt(CopyOf(map->arena())).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A wrong format version.
  std::string wrong_version = bytes;
  wrong_version[4] = 9;
  EXPECT_EQ(adopt_bytes(wrong_version).code(),
            absl::StatusCode::kInvalidArgument);
  // A corrupt index offset.
  std::string bad_index = bytes;
  uint64_t far = 1ull << 40;
  memcpy(&bad_index[32], &far, 8);
  EXPECT_EQ(adopt_bytes(bad_index).code(), absl::StatusCode::kDataLoss);
}

TEST(Adopt, RandomCorruptionNeverCrashes) {
  std::unique_ptr<MapShard> map = FilledMap(300, 4);
  absl::StatusOr<std::unique_ptr<VectorShard>> vec = VectorShard::Create(5);
  absl::StatusOr<std::unique_ptr<QueueShard>> queue = QueueShard::Create();
  ASSERT_TRUE(vec.ok() && queue.ok());
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE((*vec)->PushBack(std::string(i % 50, 'v')).ok());
    ASSERT_TRUE((*queue)->Push(std::string(i % 50, 'q')).ok());
  }
  std::mt19937_64 rng(5);
  int adopted = 0;
  for (const Arena* source :
       {&map->arena(), &(*vec)->arena(), &(*queue)->arena()}) {
    for (int trial = 0; trial < 3000; ++trial) {
      std::string bytes(source->data(), source->used());
      const int flips = 1 + rng() % 4;
      for (int f = 0; f < flips; ++f) {
        // Mostly the header and the first index entries, where it matters.
        size_t at =
            rng() % (trial % 2 == 0 ? std::min<size_t>(bytes.size(), 512)
                                    : bytes.size());
        bytes[at] = static_cast<char>(rng());
      }
      absl::StatusOr<Arena> a = Arena::Create();
      ASSERT_TRUE(a->WriteAt(0, bytes, bytes.size()).ok());
      if (source == &map->arena()) {
        auto m = MapShard::Adopt(*std::move(a));
        if (!m.ok()) continue;
        ++adopted;
        (*m)->ForEach([](std::string_view, std::string_view) {});
        for (int i = 0; i < 300; ++i) {
          std::string k = "key" + std::to_string(i);
          (*m)->Get(k).status().IgnoreError();
          if (i % 3 == 0) (*m)->Erase(k);
          if (i % 3 == 1) (*m)->Put(k, std::string(i, 'x')).IgnoreError();
        }
      } else if (source == &(*vec)->arena()) {
        auto v = VectorShard::Adopt(*std::move(a));
        if (!v.ok()) continue;
        ++adopted;
        VectorContents(**v);
        for (uint64_t i = 0; i < 300; ++i) {
          (*v)->Set((*v)->first() + i, std::string(i, 'x')).IgnoreError();
        }
      } else {
        auto q = QueueShard::Adopt(*std::move(a));
        if (!q.ok()) continue;
        ++adopted;
        for (int i = 0; i < 100; ++i) (*q)->Push("x").IgnoreError();
        Drain(**q);
      }
    }
  }
  // Flips in value bytes are not corruption the format can see.
  EXPECT_GT(adopted, 0);
}

// --- Pre-copy migration. ---------------------------------------------------

TEST(PreCopy, MapDirtyRunsReproduceTheSource) {
  std::unique_ptr<MapShard> map = FilledMap(20000, 6);
  map->arena().TrackWrites(true);
  Arena target = CopyOf(map->arena());
  std::mt19937_64 rng(8);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 3000; ++i) {
      const std::string k = "key" + std::to_string(rng() % 30000);
      switch (rng() % 3) {
        case 0:
          ASSERT_TRUE(map->Put(k, Value(rng, 200)).ok());
          break;
        case 1:
          ASSERT_TRUE(map->Put(k, Value(rng, 4)).ok());
          break;
        default:
          map->Erase(k);
      }
    }
    ApplyDirty(map->arena(), target);
    ASSERT_TRUE(SameBytes(map->arena(), target)) << "round " << round;
  }
  absl::StatusOr<std::unique_ptr<MapShard>> copy =
      MapShard::Adopt(std::move(target));
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(MapContents(**copy), MapContents(*map));
}

TEST(PreCopy, SplitWhileTrackingResendsEverything) {
  std::unique_ptr<MapShard> map = FilledMap(5000, 9);
  map->arena().TrackWrites(true);
  Arena target = CopyOf(map->arena());
  absl::StatusOr<std::unique_ptr<MapShard>> high =
      map->SplitOff(*map->MedianHash());
  ASSERT_TRUE(high.ok());
  EXPECT_TRUE(map->arena().tracking());
  ApplyDirty(map->arena(), target);
  ASSERT_TRUE(SameBytes(map->arena(), target));
  absl::StatusOr<std::unique_ptr<MapShard>> copy =
      MapShard::Adopt(std::move(target));
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(MapContents(**copy), MapContents(*map));
}

TEST(PreCopy, VectorAndQueueDirtyRunsReproduceTheSource) {
  absl::StatusOr<std::unique_ptr<VectorShard>> vec = VectorShard::Create(0);
  absl::StatusOr<std::unique_ptr<QueueShard>> queue = QueueShard::Create();
  ASSERT_TRUE(vec.ok() && queue.ok());
  std::mt19937_64 rng(10);
  for (int i = 0; i < 5000; ++i) {
    ASSERT_TRUE((*vec)->PushBack(Value(rng, 100)).ok());
    ASSERT_TRUE((*queue)->Push(Value(rng, 100)).ok());
  }
  (*vec)->arena().TrackWrites(true);
  (*queue)->arena().TrackWrites(true);
  Arena vec_target = CopyOf((*vec)->arena());
  Arena queue_target = CopyOf((*queue)->arena());
  for (int i = 0; i < 4000; ++i) {
    ASSERT_TRUE((*vec)->Set(rng() % (*vec)->count(), Value(rng, 150)).ok());
    if (i % 2 == 0) {
      ASSERT_TRUE((*vec)->PushBack(Value(rng, 30)).ok());
    }
    ASSERT_TRUE((*queue)->Push(Value(rng, 100)).ok());
    ASSERT_TRUE((*queue)->Pop().has_value());
    ASSERT_TRUE((*queue)->Pop().has_value());
  }
  ApplyDirty((*vec)->arena(), vec_target);
  ApplyDirty((*queue)->arena(), queue_target);
  EXPECT_TRUE(SameBytes((*vec)->arena(), vec_target));
  EXPECT_TRUE(SameBytes((*queue)->arena(), queue_target));
  auto vec_copy = VectorShard::Adopt(std::move(vec_target));
  auto queue_copy = QueueShard::Adopt(std::move(queue_target));
  ASSERT_TRUE(vec_copy.ok()) << vec_copy.status();
  ASSERT_TRUE(queue_copy.ok()) << queue_copy.status();
  EXPECT_EQ(VectorContents(**vec_copy), VectorContents(**vec));
  EXPECT_EQ(Drain(**queue_copy), Drain(**queue));
}

// --- VectorShard. ----------------------------------------------------------

TEST(VectorShard, PushGetSetRange) {
  absl::StatusOr<std::unique_ptr<VectorShard>> created =
      VectorShard::Create(100);
  ASSERT_TRUE(created.ok());
  VectorShard& vec = **created;
  std::vector<std::string> model;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 20000; ++i) {
    std::string v = Value(rng, 60);
    absl::StatusOr<uint64_t> index = vec.PushBack(v);
    ASSERT_TRUE(index.ok());
    EXPECT_EQ(*index, 100u + i);
    model.push_back(v);
  }
  for (int i = 0; i < 50000; ++i) {
    const uint64_t at = rng() % model.size();
    std::string v = Value(rng, i % 2 == 0 ? 10 : 300);  // Smaller / bigger.
    ASSERT_TRUE(vec.Set(100 + at, v).ok());
    model[at] = v;
  }
  EXPECT_EQ(vec.first(), 100u);
  EXPECT_EQ(vec.count(), model.size());
  uint64_t bytes = 0;
  for (size_t i = 0; i < model.size(); ++i) {
    ASSERT_EQ(*vec.Get(100 + i), model[i]);
    bytes += model[i].size();
  }
  EXPECT_EQ(vec.live_bytes(), bytes);
  EXPECT_EQ(vec.Get(99).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(vec.Get(100 + model.size()).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(vec.Set(99, "x").code(), absl::StatusCode::kOutOfRange);

  absl::StatusOr<std::vector<std::string_view>> range = vec.Range(150, 10);
  ASSERT_TRUE(range.ok());
  ASSERT_EQ(range->size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ((*range)[i], model[50 + i]);
  range = vec.Range(100 + model.size() - 3, 10);  // Clipped.
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(range->size(), 3u);
  range = vec.Range(100 + model.size(), 10);
  ASSERT_TRUE(range.ok());
  EXPECT_TRUE(range->empty());
  EXPECT_EQ(vec.Range(50, 10).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(vec.Range(100 + model.size() + 1, 1).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_LT(vec.arena().used(), 8 * bytes + (1 << 20));  // Compacted.

  EXPECT_EQ(vec.PushBack(std::string(kMaxValueBytes + 1, 'v')).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(vec.Set(100, std::string(kMaxValueBytes + 1, 'v')).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(VectorShard, SplitAbsorbAndAdopt) {
  absl::StatusOr<std::unique_ptr<VectorShard>> created = VectorShard::Create(7);
  ASSERT_TRUE(created.ok());
  VectorShard& vec = **created;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(vec.PushBack("value" + std::to_string(i)).ok());
  }
  const std::vector<std::string> original = VectorContents(vec);

  EXPECT_EQ(vec.SplitOff(6).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(vec.SplitOff(1008).status().code(), absl::StatusCode::kOutOfRange);
  absl::StatusOr<std::unique_ptr<VectorShard>> high = vec.SplitOff(607);
  ASSERT_TRUE(high.ok()) << high.status();
  EXPECT_EQ(vec.first(), 7u);
  EXPECT_EQ(vec.count(), 600u);
  EXPECT_EQ((*high)->first(), 607u);
  EXPECT_EQ((*high)->count(), 400u);
  EXPECT_EQ(*(*high)->Get(607), "value600");
  EXPECT_EQ(vec.Get(607).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*vec.Get(606), "value599");

  absl::StatusOr<std::unique_ptr<VectorShard>> copy =
      VectorShard::Adopt(CopyOf((*high)->arena()));
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ((*copy)->first(), 607u);
  EXPECT_EQ(VectorContents(**copy), VectorContents(**high));

  absl::StatusOr<std::unique_ptr<VectorShard>> stranger =
      VectorShard::Create(5000);
  ASSERT_TRUE(stranger.ok());
  EXPECT_EQ(vec.Absorb(**stranger).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(vec.Absorb(**copy).ok());
  EXPECT_EQ(VectorContents(vec), original);
  EXPECT_EQ(vec.count(), 1000u);
  absl::StatusOr<uint64_t> next = vec.PushBack("more");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, 1007u);

  // Splitting at either end gives an empty half.
  absl::StatusOr<std::unique_ptr<VectorShard>> empty = vec.SplitOff(1008);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->count(), 0u);
  EXPECT_EQ((*empty)->first(), 1008u);
  absl::StatusOr<std::unique_ptr<VectorShard>> all = vec.SplitOff(7);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(vec.count(), 0u);
  EXPECT_EQ((*all)->count(), 1001u);
}

// --- QueueShard. -----------------------------------------------------------

TEST(QueueShard, FifoAcrossPushesPopsAndCompaction) {
  absl::StatusOr<std::unique_ptr<QueueShard>> created = QueueShard::Create();
  ASSERT_TRUE(created.ok());
  QueueShard& queue = **created;
  std::deque<std::string> model;
  std::mt19937_64 rng(12);
  uint64_t max_used = 0;
  for (int i = 0; i < 300000; ++i) {
    // Phases of growth and of draining, so the ring both wraps and grows.
    const bool push = (i / 20000) % 2 == 0 ? rng() % 3 != 0 : rng() % 3 == 0;
    if (push) {
      std::string v = Value(rng, 200);
      ASSERT_TRUE(queue.Push(v).ok());
      model.push_back(v);
    } else {
      std::optional<std::string> v = queue.Pop();
      if (model.empty()) {
        ASSERT_FALSE(v.has_value());
      } else {
        ASSERT_TRUE(v.has_value());
        ASSERT_EQ(*v, model.front());
        model.pop_front();
      }
    }
    ASSERT_EQ(queue.count(), model.size());
    max_used = std::max<uint64_t>(max_used, queue.arena().used());
  }
  uint64_t bytes = 0;
  for (const std::string& v : model) bytes += v.size();
  EXPECT_EQ(queue.live_bytes(), bytes);
  // 300k values of ~100 bytes passed through; the arena stayed bounded.
  EXPECT_LT(max_used, 8u << 20);
  EXPECT_EQ(Drain(queue), std::vector<std::string>(model.begin(), model.end()));
  EXPECT_EQ(queue.count(), 0u);
  EXPECT_EQ(queue.live_bytes(), 0u);
  EXPECT_EQ(queue.Push(std::string(kMaxValueBytes + 1, 'v')).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(QueueShard, AbsorbAppendsInOrderAndAdoptCopies) {
  absl::StatusOr<std::unique_ptr<QueueShard>> a = QueueShard::Create();
  absl::StatusOr<std::unique_ptr<QueueShard>> b = QueueShard::Create();
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<std::string> want;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE((*a)->Push(std::to_string(i)).ok());
  for (int i = 0; i < 40; ++i) ASSERT_TRUE((*a)->Pop().has_value());
  for (int i = 40; i < 100; ++i) want.push_back(std::to_string(i));
  for (int i = 0; i < 3000; ++i) {
    ASSERT_TRUE((*b)->Push("b" + std::to_string(i)).ok());
    if (i % 3 == 0) (*b)->Pop();
  }
  absl::StatusOr<std::unique_ptr<QueueShard>> b_copy =
      QueueShard::Adopt(CopyOf((*b)->arena()));
  ASSERT_TRUE(b_copy.ok()) << b_copy.status();
  std::vector<std::string> b_values = Drain(**b_copy);
  want.insert(want.end(), b_values.begin(), b_values.end());

  ASSERT_TRUE((*a)->Absorb(**b).ok());
  EXPECT_EQ((*a)->count(), want.size());
  EXPECT_EQ((*a)->Absorb(**a).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<QueueShard>> a_copy =
      QueueShard::Adopt(CopyOf((*a)->arena()));
  ASSERT_TRUE(a_copy.ok()) << a_copy.status();
  EXPECT_EQ(Drain(**a_copy), want);
  EXPECT_EQ(Drain(**a), want);
}

}  // namespace
}  // namespace silt::proclets
