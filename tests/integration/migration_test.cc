// Memory proclets across nodes: splits under growth and migrations that fail
// half way, on a cluster whose nodes run in their own network namespaces
// (tests/common/cluster.h), driven over HTTP as a user would.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "invoker/proto/proclets.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;

class MigrationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    auto r = BuildProbe("silt-mig-suite", &suite_dir_);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static void TearDownTestSuite() {
    if (!suite_dir_.empty()) std::filesystem::remove_all(suite_dir_);
  }

  // node-a offers far more memory than node-b: new shards go to node-a.
  void StartCluster(std::vector<std::string> gateway_flags = {}) {
    if (geteuid() != 0)
      GTEST_SKIP() << "nodes run in network namespaces, instances in "
                      "cgroups: run as root";
    dir_ = MakeTempDir("silt-mig");
    ClusterOptions options;
    options.gateway_flags.insert(options.gateway_flags.end(),
                                 gateway_flags.begin(), gateway_flags.end());
    auto c = Cluster::Start(dir_, options);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    ASSERT_TRUE(
        cluster_->AddNode({.name = "node-a", .memory_mib = 1 << 20}).ok());
    ASSERT_TRUE(cluster_->AddNode({.name = "node-b", .memory_mib = 4096}).ok());
    ASSERT_TRUE(cluster_->WaitNodes(2).ok());
    auto r = cluster_->Silt({"push", "-f", suite_dir_ + "/stack.yml"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    // The function runs on node-b, its state lives on node-a.
    image_ = "probe@" + r.out.substr(r.out.find("sha256:"), 71);
    Deploy("probe", "node-b");
  }
  void Deploy(const std::string& name, const std::string& node) {
    json d = {{"service", name},
              {"image", image_},
              {"constraints", {"node.name==" + node}}};
    ASSERT_EQ(
        cluster_->gateway().Call("POST", "/system/functions", d.dump()).status,
        200);
  }
  void TearDown() override {
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  deploy::HttpResult Invoke(const std::string& path,
                            const std::string& function = "probe") {
    return cluster_->gateway().Call("POST", "/function/" + function + path, "",
                                    /*with_auth=*/false);
  }
  deploy::HttpResult Migrate(uint64_t id, const std::string& node) {
    return cluster_->gateway().Call(
        "POST", absl::StrCat("/system/proclets/", id, "/migrate"),
        json{{"node", node}}.dump());
  }

  json Proclets(const std::string& structure) {
    auto all =
        json::parse(cluster_->gateway().Call("GET", "/system/proclets").body,
                    nullptr, false);
    json out = json::array();
    for (const auto& p : all)
      if (p.value("structure", "") == structure) out.push_back(p);
    return out;
  }

  static std::string suite_dir_;
  std::string dir_, image_;
  std::unique_ptr<Cluster> cluster_;
};

std::string MigrationTest::suite_dir_;

TEST_F(MigrationTest, TargetKilledMidCopyLosesNothing) {
  StartCluster();
  if (IsSkipped()) return;
  // ~6 MiB in one shard on node-a: 6 batches of 1000 keys, 1 KB values.
  const std::string value(1000, 'x');
  for (int b = 0; b < 6; ++b) {
    auto r =
        Invoke(absl::StrCat("/kv/mput?name=big&n=1000&p=b", b, "k&v=", value));
    ASSERT_EQ(r.status, 200) << r.body;
  }
  json shards = Proclets("big");
  ASSERT_EQ(shards.size(), 1u) << shards.dump();
  ASSERT_EQ(shards[0]["node"], "node-a");
  uint64_t id = shards[0]["id"];
  // node-a sends at 20 Mbit/s: the copy takes seconds, time to kill node-b
  // in the middle of it.
  ASSERT_TRUE(
      cluster_
          ->ShapeLink("node-a", "tbf rate 20mbit burst 32kbit latency 2000ms")
          .ok());
  deploy::HttpResult moved;
  std::thread migrate([&] {
    moved = cluster_->gateway().Call(
        "POST", absl::StrCat("/system/proclets/", id, "/migrate"),
        R"({"node":"node-b"})");
  });
  bool copying = Eventually([&] {
    json s = Proclets("big");
    return s.size() == 1 && s[0].value("state", "") == "migrating";
  });
  cluster_->StopNode("node-b", SIGKILL);
  migrate.join();
  ASSERT_TRUE(copying) << Proclets("big").dump();
  EXPECT_NE(moved.status, 200) << moved.body;
  ASSERT_TRUE(cluster_->ShapeLink("node-a", "pfifo").ok());

  // The shard stayed on node-a, serving, with every value.
  shards = Proclets("big");
  ASSERT_EQ(shards.size(), 1u) << shards.dump();
  EXPECT_EQ(shards[0]["node"], "node-a") << shards.dump();
  EXPECT_EQ(shards[0]["state"], "active") << shards.dump();
  // node-b is gone; the function runs on node-a now.
  ASSERT_TRUE(cluster_->WaitNodes(1).ok());
  json d = json::parse(
      cluster_->gateway().Call("GET", "/system/function/probe").body);
  json update = {{"service", "probe"}, {"image", d["image"]}};
  ASSERT_EQ(cluster_->gateway()
                .Call("PUT", "/system/functions", update.dump())
                .status,
            200);
  for (int b = 0; b < 6; ++b) {
    auto r =
        Invoke(absl::StrCat("/kv/mget?name=big&n=1000&p=b", b, "k&v=", value));
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body, "1000") << "batch " << b;
  }
  auto w = Invoke("/kv/put?name=big&k=after&v=1");
  EXPECT_EQ(w.status, 200) << w.body;
  EXPECT_EQ(Invoke("/kv/get?name=big&k=after").body, "1");
}

// Writers that grow a shard (inserts: its arena grows, its index is
// rebuilt) and rewrite it while it moves back and forth between the nodes:
// afterwards every acknowledged write is there, exactly as written, and
// nothing else is.
TEST_F(MigrationTest, MovesUnderGrowingAndRewritingWritersLoseNothing) {
  StartCluster();
  if (IsSkipped()) return;
  // ~3 MiB to begin with: every move pre-copies in more than one round.
  const std::string value(1000, 'x');
  for (int b = 0; b < 3; ++b)
    ASSERT_EQ(
        Invoke(absl::StrCat("/kv/mput?name=ch&n=1000&p=b", b, "k&v=", value))
            .status,
        200);
  json shards = Proclets("ch");
  ASSERT_EQ(shards.size(), 1u) << shards.dump();
  uint64_t id = shards[0]["id"];
  auto size = [&] {
    auto r = Invoke("/kv/size?name=ch");
    return r.status == 200 ? std::atol(r.body.c_str()) : -1L;
  };

  constexpr int kWriters = 3;
  std::vector<deploy::HttpResult> wrote(kWriters);
  std::atomic<int> done{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w)
    writers.emplace_back([&, w] {
      wrote[w] = Invoke(
          absl::StrCat("/kv/churn?name=ch&p=w", w, "_&v=y&n=20000&ms=8000"));
      ++done;
    });
  ASSERT_TRUE(Eventually([&] { return size() > 3000 + 300; }));
  for (const char* to : {"node-b", "node-a", "node-b", "node-a"}) {
    auto r = Migrate(id, to);
    EXPECT_EQ(r.status, 200) << r.body;
  }
  // Otherwise the moves above did not overlap the writes.
  EXPECT_EQ(done.load(), 0) << "writers finished before the moves did";
  for (auto& t : writers) t.join();

  long total = 3000;
  for (int w = 0; w < kWriters; ++w) {
    ASSERT_EQ(wrote[w].status, 200) << wrote[w].body;
    long inserted = 0, rewritten = 0;
    ASSERT_EQ(sscanf(wrote[w].body.c_str(), "%ld %ld", &inserted, &rewritten),
              2)
        << wrote[w].body;
    total += inserted;
    EXPECT_EQ(Invoke(absl::StrCat("/kv/mget?name=ch&n=", rewritten, "&p=w", w,
                                  "_&v=y"))
                  .body,
              std::to_string(rewritten));
  }
  for (int b = 0; b < 3; ++b)
    EXPECT_EQ(
        Invoke(absl::StrCat("/kv/mget?name=ch&n=1000&p=b", b, "k&v=", value))
            .body,
        "1000");
  EXPECT_EQ(size(), total);
  EXPECT_EQ(Proclets("ch").size(), 1u) << "the shard split: fewer writes";
}

TEST_F(MigrationTest, ShardsSplitAsTheyGrowAndMergeAsTheyShrink) {
  StartCluster({"--shard-split-mib", "1"});
  if (IsSkipped()) return;
  const std::string value(1000, 'y');
  for (int b = 0; b < 4; ++b) {
    auto r =
        Invoke(absl::StrCat("/kv/mput?name=grow&n=1000&p=g", b, "k&v=", value));
    ASSERT_EQ(r.status, 200) << r.body;
  }
  // ~4 MiB against a 1 MiB split size: the directory splits from the load
  // reports until every shard is small again.
  ASSERT_TRUE(Eventually([&] {
    json s = Proclets("grow");
    if (s.size() < 4) return false;
    for (const auto& p : s)
      if (p.value("bytes", uint64_t{0}) > (2u << 20)) return false;
    return true;
  })) << Proclets("grow").dump();
  for (int b = 0; b < 4; ++b) {
    auto r =
        Invoke(absl::StrCat("/kv/mget?name=grow&n=1000&p=g", b, "k&v=", value));
    EXPECT_EQ(r.body, "1000") << "batch " << b << ": " << r.body;
  }
  EXPECT_EQ(Invoke("/kv/size?name=grow").body, "4000");

  // Nearly everything erased: adjacent small shards merge (moving to one
  // node first where they are apart) until one is left, losing nothing.
  for (int b = 0; b < 4; ++b) {
    auto r = Invoke(absl::StrCat("/kv/merase?name=grow&n=1000&p=g", b, "k"));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body, "1000");
  }
  ASSERT_EQ(Invoke("/kv/mput?name=grow&n=100&p=left&v=v").status, 200);
  ASSERT_TRUE(Eventually([&] { return Proclets("grow").size() == 1; },
                         std::chrono::seconds(40)))
      << Proclets("grow").dump();
  EXPECT_EQ(Invoke("/kv/mget?name=grow&n=100&p=left&v=v").body, "100");
  EXPECT_EQ(Invoke("/kv/size?name=grow").body, "100");
  EXPECT_EQ(Invoke("/kv/get?name=grow&k=left7").body, "v7");
}

// An instance on the node that holds a map shard reads it in place (it maps
// the shard's arena); while the shard moves away and back under a stream of
// writes, a reader there never sees a value go back, and maps it again once
// it is home.
TEST_F(MigrationTest, ReadsOnTheShardsNodeComeFromItsArenaAndFollowMoves) {
  StartCluster();
  if (IsSkipped()) return;
  Deploy("probe-a", "node-a");
  ASSERT_EQ(Invoke("/kv/put?name=rd&k=x&v=1").status, 200);
  json shards = Proclets("rd");
  ASSERT_EQ(shards.size(), 1u) << shards.dump();
  ASSERT_EQ(shards[0]["node"], "node-a");
  uint64_t id = shards[0]["id"];
  auto first = Invoke("/kv/watch?name=rd&k=x&until=1&ms=5000", "probe-a");
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(first.body, "reads=1 last=1 mapped=1");

  constexpr int kWrites = 400;
  deploy::HttpResult watched;
  std::thread reader([&] {
    watched = Invoke(
        absl::StrCat("/kv/watch?name=rd&k=x&until=", kWrites, "&ms=50000"),
        "probe-a");
  });
  int failed_writes = 0;
  for (int v = 2; v <= kWrites; ++v) {
    if (v == kWrites / 3) {
      EXPECT_EQ(Migrate(id, "node-b").status, 200);
    } else if (v == 2 * kWrites / 3) {
      EXPECT_EQ(Migrate(id, "node-a").status, 200);
    }
    failed_writes +=
        Invoke(absl::StrCat("/kv/put?name=rd&k=x&v=", v)).status != 200;
  }
  reader.join();
  EXPECT_EQ(failed_writes, 0);
  ASSERT_EQ(watched.status, 200) << watched.body;
  EXPECT_NE(watched.body.find(absl::StrCat("last=", kWrites)),
            std::string::npos)
      << watched.body;
  // Home again: the instance maps the shard's arena once more (it looks for
  // shards that came to its node about once a second).
  deploy::HttpResult home;
  EXPECT_TRUE(Eventually([&] {
    home = Invoke("/kv/watch?name=rd&k=x&until=1&ms=5000", "probe-a");
    return home.body.find("mapped=1") != std::string::npos;
  })) << home.body;

  // Away on node-b, the shard is read through the invokers and node-a's
  // instance lets go of the old arena (at its first read that finds it
  // retired; under load that read may still come first).
  ASSERT_EQ(Migrate(id, "node-b").status, 200);
  deploy::HttpResult away;
  EXPECT_TRUE(Eventually([&] {
    away = Invoke("/kv/watch?name=rd&k=x&until=1&ms=5000", "probe-a");
    EXPECT_EQ(away.body.substr(0, away.body.find(" mapped")),
              absl::StrCat("reads=1 last=", kWrites));
    return away.body.find("mapped=0") != std::string::npos;
  })) << away.body;
}

// A split whose answer never reached the gateway (the node split; the call
// timed out or the gateway went away) is learnt from the node's reports: the
// upper half appears in the directory, so that moving the lower half does
// not strand it. Here the split is asked of the node behind the gateway's
// back, which is exactly what the gateway sees when the answer is lost.
TEST_F(MigrationTest, ASplitWhoseAnswerWasLostIsRecordedFromReports) {
  StartCluster();
  if (IsSkipped()) return;
  ASSERT_EQ(Invoke("/kv/mput?name=lost&n=400&p=k&v=v").status, 200);
  json shards = Proclets("lost");
  ASSERT_EQ(shards.size(), 1u) << shards.dump();
  uint64_t id = shards[0]["id"];
  auto stub = silt::proclets::v1::ProcletHost::NewStub(grpc::CreateChannel(
      cluster_->grpc_address("node-a"), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  silt::proclets::v1::SplitShardRequest req;
  req.set_id(id);
  req.set_new_id(900000);
  silt::proclets::v1::SplitShardResponse res;
  ASSERT_TRUE(stub->SplitShard(&ctx, req, &res).ok());

  ASSERT_TRUE(Eventually([&] { return Proclets("lost").size() == 2; }))
      << Proclets("lost").dump();
  shards = Proclets("lost");
  EXPECT_EQ(shards[1]["id"], 900000) << shards.dump();
  EXPECT_EQ(shards[1]["node"], "node-a") << shards.dump();
  EXPECT_EQ(Invoke("/kv/size?name=lost").body, "400");
  // The lower half moves alone; every key is still there.
  ASSERT_EQ(Migrate(id, "node-b").status, 200);
  EXPECT_EQ(Invoke("/kv/mget?name=lost&n=400&p=k&v=v").body, "400");
  EXPECT_EQ(Invoke("/kv/get?name=lost&k=k399").body, "v399");
}

// The data port answers only peers that open with the cluster's key: a
// stranger on the network gets the connection closed, not state.
TEST_F(MigrationTest, DataPortRefusesConnectionsWithoutTheClusterKey) {
  StartCluster();
  if (IsSkipped()) return;
  ASSERT_EQ(Invoke("/kv/put?name=secret&k=a&v=1").status, 200);
  uint64_t id = Proclets("secret")[0]["id"];
  std::string data;
  for (const auto& n :
       json::parse(cluster_->gateway().Call("GET", "/system/nodes").body))
    if (n["name"] == "node-a") data = n["dataAddress"];
  ASSERT_FALSE(data.empty());
  auto attempt = [&](const std::string& first) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(std::stoi(data.substr(data.rfind(':') + 1)));
    inet_pton(AF_INET, data.substr(0, data.rfind(':')).c_str(), &sa.sin_addr);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    // A shard request: map size of shard `id`.
    std::string req(1, '\x01');
    req.append(reinterpret_cast<const char*>(&id), 8);
    req.append(8, '\0');
    req.push_back(14);  // StateOp::kMapSize
    std::string frames;
    for (const std::string& f : {first, req}) {
      uint32_t len = f.size();
      frames.append(reinterpret_cast<const char*>(&len), 4);
      frames += f;
    }
    EXPECT_EQ(write(fd, frames.data(), frames.size()),
              static_cast<ssize_t>(frames.size()));
    char buf[256];
    ssize_t n = read(fd, buf, sizeof(buf));
    close(fd);
    return n;
  };
  // No hello, and a hello with a wrong key: closed without an answer.
  EXPECT_EQ(attempt(std::string(1, '\x01')), 0);
  std::string wrong(1, '\x06');
  uint32_t len = 32;
  wrong.append(reinterpret_cast<const char*>(&len), 4);
  wrong.append(32, 'k');
  EXPECT_EQ(attempt(wrong), 0);
  EXPECT_EQ(Invoke("/kv/get?name=secret&k=a").body, "1");
}

}  // namespace
}  // namespace silt::testing
