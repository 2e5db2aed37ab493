// The gateway's GPU directory: placement by each function's GPU memory labels
// (preferred where a GPU has it free, downgraded toward the minimum on the GPU
// with the most free, else the asking node's CPU cores), and the labels'
// validation. Nodes are described, not started: placement makes no RPC.
#include "gpu_directory.h"

#include <filesystem>

#include "gtest/gtest.h"
#include "store/secrets_key.h"
#include "store/store.h"

namespace silt::gateway {
namespace {

constexpr uint64_t kMi = 1 << 20;

std::vector<GpuNode> Nodes() {
  GpuNode a{.name = "a",
            .data_address = "10.0.0.1:1",
            .gpus = 1,
            .gpu_memory = 1024 * kMi,
            .gpu_model = "big",
            .gpu_compute = 90};
  GpuNode b{.name = "b",
            .data_address = "10.0.0.2:1",
            .gpus = 1,
            .gpu_memory = 512 * kMi,
            .gpu_model = "small",
            .gpu_compute = 75};
  GpuNode cpu{.name = "cpu", .data_address = "10.0.0.3:1"};
  return {a, b, cpu};
}

TEST(GpuDirectoryTest, PlacesPreferredThenDowngradesThenFallsBackToTheCpu) {
  GpuDirectory d(Nodes);
  const GpuNeeds needs{
      .min = 128 * kMi, .preferred = 768 * kMi, .max = 1024 * kMi};
  auto first = d.Open("ns", "f", "one", needs, "cpu");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->node, "a");
  EXPECT_EQ(first->backend, "cuda");
  EXPECT_EQ(first->memory_limit, 768 * kMi);
  // a has 256 MiB left, b 512: b, with what it has.
  auto second = d.Open("ns", "f", "two", needs, "cpu");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->node, "b");
  EXPECT_EQ(second->memory_limit, 512 * kMi);
  // 256 MiB free at most, below this one's minimum: the asking node's CPU.
  GpuNeeds picky = needs;
  picky.min = 384 * kMi;
  auto third = d.Open("ns", "g", "three", picky, "cpu");
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->node, "cpu");
  EXPECT_EQ(third->backend, "host");
  EXPECT_EQ(third->memory_limit, 768 * kMi);
  // Without a minimum, no downgrade: the CPU too.
  auto fourth = d.Open("ns", "g", "four", {.max = 300 * kMi}, "a");
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_EQ(fourth->node, "a");
  EXPECT_EQ(fourth->backend, "host");
  // Asked again: where it is.
  auto again = d.Open("ns", "f", "one", needs, "b");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id, first->id);
  EXPECT_EQ(again->node, "a");
}

// No GPU has a new proclet's minimum free: proclets already placed that
// declared a minimum give up allocation they do not use (down to that
// minimum, never below what they hold) rather than the new one going to CPU
// cores. The resizes go through the directory's seam to the nodes.
TEST(GpuDirectoryTest, MakesRoomByDowngradingProcletsTowardTheirMinimum) {
  std::vector<std::pair<std::string, uint64_t>> resized;
  uint64_t held_by_one = 100 * kMi;
  GpuDirectory d(Nodes, nullptr,
                 {.resize = [&](const GpuNode& holder, const GpuProcletView& p,
                                uint64_t bytes, absl::Duration) {
                   resized.push_back({p.name, bytes});
                   return std::pair<uint64_t, uint64_t>{
                       bytes, p.name == "one" ? held_by_one : 0};
                 }});
  const GpuNeeds needs{.min = 128 * kMi, .preferred = 768 * kMi};
  ASSERT_EQ(d.Open("ns", "f", "one", needs, "cpu")->node, "a");  // 768 of 1024
  ASSERT_EQ(d.Open("ns", "f", "two", needs, "cpu")->node, "b");  // 512 of 512
  // 256 MiB free on a, none on b; this one needs 384: "one" gives 128 up.
  GpuNeeds bigger = needs;
  bigger.min = 384 * kMi;
  auto three = d.Open("ns", "g", "three", bigger, "cpu");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->node, "a");
  EXPECT_EQ(three->backend, "cuda");
  EXPECT_EQ(three->memory_limit, 384 * kMi);
  ASSERT_EQ(resized.size(), 1u);
  EXPECT_EQ(resized[0], (std::pair<std::string, uint64_t>{"one", 640 * kMi}));
  // Nothing left to give on any GPU (a: "one" holds 600 of its 640 and
  // "three" sits at its minimum; b: "two" could give 384, not 512): CPU.
  held_by_one = 600 * kMi;
  d.Report("a", {{.ns = "ns",
                  .function = "f",
                  .name = "one",
                  .backend = "cuda",
                  .memory_used = 600 * kMi,
                  .memory_limit = 640 * kMi},
                 {.ns = "ns",
                  .function = "g",
                  .name = "three",
                  .backend = "cuda",
                  .memory_limit = 384 * kMi}});
  GpuNeeds huge = needs;
  huge.min = 512 * kMi;
  auto four = d.Open("ns", "h", "four", huge, "cpu");
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->backend, "host");
  EXPECT_EQ(resized.size(), 1u);
}

// A function that needs a compute capability is placed and moved only onto
// GPUs that have it.
TEST(GpuDirectoryTest, ComputeCapabilityLimitsTheGpus) {
  GpuDirectory d(Nodes);
  // b has no proclet and the most free after one goes to a; an 8.0 one still
  // goes to a (9.0), never to b (7.5).
  ASSERT_EQ(d.Open("ns", "f", "one", {.preferred = 768 * kMi}, "cpu")->node,
            "a");
  auto sm80 =
      d.Open("ns", "g", "two", {.preferred = 128 * kMi, .compute = 80}, "cpu");
  ASSERT_TRUE(sm80.ok()) << sm80.status();
  EXPECT_EQ(sm80->node, "a");
  EXPECT_EQ(sm80->backend, "cuda");
  auto moved = d.Migrate(sm80->id, "b", "");
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(moved.status().message().find("compute capability 7.5"),
            std::string::npos)
      << moved.status();
  // Nothing has 10.0: CPU cores.
  auto sm100 = d.Open("ns", "h", "three",
                      {.preferred = 16 * kMi, .compute = 100}, "cpu");
  ASSERT_TRUE(sm100.ok()) << sm100.status();
  EXPECT_EQ(sm100->backend, "host");
  auto labels = ParseGpuLabels({{"com.silt.gpu.compute-capability", "8.6"}});
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(labels->compute, 86u);
  for (const char* bad : {"eight", "8", "8.10", ".5", "0.5", "8.x"})
    EXPECT_FALSE(
        ParseGpuLabels({{"com.silt.gpu.compute-capability", bad}}).ok())
        << bad;
}

// The rebalancer's half: the GPU directory's moves, through its seam to the
// nodes. `Moves` records them and answers as the source node would.
struct Moves {
  std::vector<std::string> made;  // "id node backend"
  GpuDirectory::NodeCalls Calls() {
    return {
        .move = [this](const GpuNode& source, const GpuNode& target,
                       const GpuProcletView& p,
                       const std::string& backend) -> absl::StatusOr<GpuMove> {
          made.push_back(p.id + " " + target.name + " " + backend);
          return GpuMove{.from_backend = p.backend,
                         .to_backend = backend,
                         .bytes = p.memory_used};
        }};
  }
};

// What a node reports of one proclet; `busy_s` of device time so far.
GpuProcletView Held(const GpuProcletView& placed, const std::string& backend,
                    double busy_s) {
  GpuProcletView v = placed;
  v.backend = backend;
  v.memory_used = v.memory_limit / 2;
  v.busy_ns = static_cast<uint64_t>(busy_s * 1e9);
  return v;
}

// Settled at once: every Rebalance may act on the latest reports.
constexpr GpuRebalanceOptions kAtOnce{.settle = absl::ZeroDuration()};

// A proclet placed on CPU cores for want of room moves onto a GPU once one
// has room for it; until its node reported it twice (its use measured),
// nothing moves.
TEST(GpuDirectoryTest, AProcletOnCpuCoresMovesOntoAGpuWithRoom) {
  Moves moves;
  GpuDirectory d(Nodes, nullptr, moves.Calls(), kAtOnce);
  const GpuNeeds big{.preferred = 1024 * kMi};
  auto first = d.Open("ns", "f", "one", big, "cpu");
  ASSERT_EQ(first->node, "a");
  auto second = d.Open("ns", "g", "two", big, "cpu");
  ASSERT_EQ(second->backend, "host");  // b has 512 MiB, it wants 1024
  d.Report("cpu", {Held(*second, "host", 0)});
  d.Report("a", {Held(*first, "cuda", 0)});
  d.DropFunction("ns", "f");  // a's GPU is free now
  EXPECT_TRUE(d.Rebalance().empty()) << "measured once only";
  d.Report("cpu", {Held(*second, "host", 0)});
  auto steps = d.Rebalance();
  ASSERT_EQ(steps.size(), 1u);
  ASSERT_TRUE(steps[0].move.ok()) << steps[0].move.status();
  EXPECT_EQ(steps[0].why, GpuMoveWhy::kRoom);
  EXPECT_EQ(moves.made, std::vector<std::string>{second->id + " a cuda"});
  auto listed = d.List("ns");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].node, "a");
  EXPECT_EQ(listed[0].backend, "cuda");
  EXPECT_TRUE(d.Rebalance().empty()) << "it stays until measured again";
}

// A node's report made before a move can arrive after the move's answer:
// it neither takes the proclet back nor, once that node reports it gone,
// forgets it (a new id, its moves lost).
TEST(GpuDirectoryTest, AReportFromBeforeAMoveChangesNothing) {
  Moves moves;
  GpuDirectory d(Nodes, nullptr, moves.Calls());
  auto p = d.Open("ns", "f", "one", {.preferred = 128 * kMi}, "cpu");
  ASSERT_EQ(p->node, "a");
  d.Report("a", {Held(*p, "cuda", 0)});
  ASSERT_TRUE(d.Migrate(p->id, "b", "").ok());
  d.Report("a", {Held(*p, "cuda", 1)});  // stale: from before the move
  d.Report("a", {});
  d.Report("b", {});  // nor one of the target's from before it took it
  auto listed = d.List("");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id, p->id);
  EXPECT_EQ(listed[0].node, "b");
  EXPECT_EQ(listed[0].moves, 1u);
  d.Report("b", {Held(*p, "cuda", 0)});
  d.Report("b", {});  // now it is gone from b: forgotten
  EXPECT_TRUE(d.List("").empty());
}

// No GPU has room: a busy proclet on CPU cores takes the GPU of an idle one,
// which goes to its node's CPU cores; one that is busy on its GPU keeps it.
TEST(GpuDirectoryTest, AnIdleProcletGivesItsGpuToABusyOne) {
  Moves moves;
  GpuDirectory d(Nodes, nullptr, moves.Calls(), kAtOnce);
  auto idle = d.Open("ns", "idle", "p", {.preferred = 1024 * kMi}, "cpu");
  auto steady = d.Open("ns", "steady", "p", {.preferred = 512 * kMi}, "cpu");
  auto busy = d.Open("ns", "busy", "p", {.preferred = 768 * kMi}, "cpu");
  ASSERT_EQ(idle->node, "a");
  ASSERT_EQ(steady->node, "b");
  ASSERT_EQ(busy->backend, "host");
  // Twice each: utilisation is device time between the last two reports
  // (a second of it per report is all of the time: busy).
  for (double t : {0.0, 1000.0}) {
    d.Report("a", {Held(*idle, "cuda", 0)});
    d.Report("b", {Held(*steady, "cuda", t / 10)});
    d.Report("cpu", {Held(*busy, "host", t)});
  }
  auto steps = d.Rebalance();
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& s : steps) {
    EXPECT_TRUE(s.move.ok()) << s.move.status();
    EXPECT_EQ(s.why, GpuMoveWhy::kWanted);
  }
  EXPECT_EQ(moves.made, (std::vector<std::string>{idle->id + " a host",
                                                  busy->id + " a cuda"}))
      << steps[0].detail;
  EXPECT_NE(steps[0].detail.find("idle"), std::string::npos);
  // Both just moved: nothing more until each is measured where it is now.
  EXPECT_TRUE(d.Rebalance().empty());
}

// An operator's choices stay: a proclet moved by `silt proclets migrate` is
// pinned where it was put, and a reclaimed GPU takes nothing (placement,
// moves, the rebalancer) until released. Both outlive the gateway (the
// store).
TEST(GpuDirectoryTest, PinsAndReclaimsStayAcrossRestarts) {
  const std::string dir = ::testing::TempDir() + "/gpu-directory-store";
  std::filesystem::remove_all(dir);
  auto store = store::Store::Open(
      {.path = dir, .secrets_key = std::string(store::kSecretsKeyBytes, 'k')});
  ASSERT_TRUE(store.ok()) << store.status();
  Moves moves;
  const GpuNeeds small{.preferred = 128 * kMi};
  std::string pinned_id;
  {
    GpuDirectory d(Nodes, store->get(), moves.Calls(), kAtOnce);
    auto p = d.Open("ns", "f", "one", small, "cpu");
    ASSERT_EQ(p->node, "a");
    pinned_id = p->id;
    ASSERT_TRUE(d.Migrate(p->id, "cpu", "").ok());  // by an operator
    ASSERT_TRUE(d.Reclaim("b").ok());
    EXPECT_TRUE(d.Reclaimed("b"));
  }
  GpuDirectory d(Nodes, store->get(), moves.Calls(), kAtOnce);
  EXPECT_TRUE(d.Reclaimed("b"));
  EXPECT_FALSE(d.Reclaimed("a"));
  // Rebuilt from the nodes' reports, as after a gateway restart; the
  // function's instances ask for it again.
  GpuProcletView p{
      .ns = "ns", .function = "f", .name = "one", .memory_limit = 128 * kMi};
  d.Report("cpu", {Held(p, "host", 0)});
  d.Report("cpu", {Held(p, "host", 0)});
  ASSERT_EQ(d.Open("ns", "f", "one", small, "cpu")->node, "cpu");
  moves.made.clear();
  EXPECT_TRUE(d.Rebalance().empty()) << "pinned on CPU cores";
  // b's GPU: not for placement nor for moves, until released.
  auto other = d.Open("ns", "g", "two", {.preferred = 1024 * kMi}, "cpu");
  ASSERT_EQ(other->node, "a");
  auto third = d.Open("ns", "h", "three", small, "cpu");
  EXPECT_EQ(third->backend, "host") << third->node;
  auto to_b = d.Migrate(third->id, "b", "cuda");
  EXPECT_EQ(to_b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(to_b.status().message().find("silt gpu release b"),
            std::string::npos)
      << to_b.status();
  EXPECT_EQ(d.Release("a").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(d.Release("b").ok());
  d.Report("cpu", {Held(p, "host", 0), Held(*third, "host", 0)});
  d.Report("cpu", {Held(p, "host", 0), Held(*third, "host", 0)});
  auto steps = d.Rebalance();
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(moves.made, std::vector<std::string>{third->id + " b cuda"});
  // Deleting the function forgets its pin.
  d.DropFunction("ns", "f");
  EXPECT_TRUE((*store)->Scan(store::Table::kMeta, "gpu-pinned/")->empty());
  std::filesystem::remove_all(dir);
}

TEST(GpuDirectoryTest, LabelsAreQuantitiesInOrder) {
  auto ok = ParseGpuLabels({{"com.silt.gpu.min-memory", "64Mi"},
                            {"com.silt.gpu.preferred-memory", "1Gi"},
                            {"com.silt.gpu.max-memory", "2Gi"}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->min, 64 * kMi);
  EXPECT_EQ(ok->wanted(), 1024 * kMi);
  EXPECT_EQ(ParseGpuLabels({{"com.silt.gpu.max-memory", "1Gi"}})->wanted(),
            1024 * kMi);
  struct Bad {
    std::map<std::string, std::string> labels;
    const char* says;
  };
  for (const Bad& bad :
       {Bad{{{"com.silt.gpu.min-memory", "lots"}}, "min-memory=lots"},
        Bad{{{"com.silt.gpu.max-memory", "0"}}, "max-memory=0"},
        Bad{{{"com.silt.gpu.preferred-memory", "2Gi"},
             {"com.silt.gpu.max-memory", "1Gi"}},
            "preferred-memory is more than"},
        Bad{{{"com.silt.gpu.min-memory", "2Gi"},
             {"com.silt.gpu.max-memory", "1Gi"}},
            "min-memory is more than com.silt.gpu.max-memory"}}) {
    auto r = ParseGpuLabels(bad.labels);
    ASSERT_FALSE(r.ok()) << bad.says;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(bad.says), std::string::npos)
        << r.status();
  }
}

}  // namespace
}  // namespace silt::gateway
