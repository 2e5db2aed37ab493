// The daemons' gRPC request handlers under arbitrary requests: every method an
// invoker serves (Invoker, ProcletHost) and every one the gateway serves to
// invokers (Control) gets mutated copies of valid requests and random bytes,
// sent raw through a generic stub so that they reach the server's own parsing.
// Both daemons must stay up and keep serving calls. (Deterministic: the same
// inputs every run, so a failure reproduces.)
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster.h"
#include "gateway/proto/control.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "invoker/proto/invoker.pb.h"
#include "invoker/proto/proclets.pb.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace pb = silt::invoker::v1;
namespace cpb = silt::control::v1;
namespace ppb = silt::proclets::v1;

// One call of `method` with `bytes` as its (only) request message; reads at
// most a few answers. The status code, or -1 when the call could not start.
int CallRaw(const std::shared_ptr<grpc::Channel>& channel,
            const std::string& method, const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(500));
  auto call = stub.PrepareCall(&ctx, method, &cq);
  if (!call) return -1;
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](void* t) { return cq.Next(&tag, &ok) && tag == t && ok; };
  call->StartCall(reinterpret_cast<void*>(1));
  if (step(reinterpret_cast<void*>(1))) {
    grpc::Slice slice(bytes.data(), bytes.size());
    grpc::ByteBuffer request(&slice, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    if (step(reinterpret_cast<void*>(2))) {
      call->WritesDone(reinterpret_cast<void*>(3));
      step(reinterpret_cast<void*>(3));
      for (int i = 0; i < 4; ++i) {
        grpc::ByteBuffer answer;
        call->Read(&answer, reinterpret_cast<void*>(4));
        if (!step(reinterpret_cast<void*>(4))) break;
      }
    }
  }
  ctx.TryCancel();
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(5)) {
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status.error_code();
}

// Valid requests to start from, per method.
struct Method {
  std::string name;
  std::vector<std::string> seeds;
};

std::string Mutate(const std::string& seed, std::mt19937& rng) {
  std::string s = seed;
  int edits = 1 + static_cast<int>(rng() % 8);
  for (int i = 0; i < edits; ++i) {
    switch (rng() % 5) {
      case 0:  // flip a byte
        if (!s.empty()) s[rng() % s.size()] ^= static_cast<char>(rng());
        break;
      case 1:  // truncate
        if (!s.empty()) s.resize(rng() % s.size());
        break;
      case 2:  // insert random bytes
        s.insert(s.empty() ? 0 : rng() % s.size(),
                 std::string(1 + rng() % 16, static_cast<char>(rng())));
        break;
      case 3:  // a huge varint where a length or number goes
        s.insert(s.empty() ? 0 : rng() % s.size(),
                 std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 10));
        break;
      default:  // random bytes altogether
        s.assign(rng() % 64, '\0');
        for (char& c : s) c = static_cast<char>(rng());
    }
  }
  return s;
}

class RpcFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "an invoker needs root (namespaces, cgroups): run as "
                      "root";
    dir_ = MakeTempDir("silt-rpc-fuzz");
    auto c = Cluster::Start(dir_);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    ASSERT_TRUE(cluster_->AddNode({.name = "node-a"}).ok());
    ASSERT_TRUE(cluster_->WaitNodes(1).ok());
    std::string image = cluster_->gateway().PushExecBundle(
        "echo", "sh run.sh", {{"run.sh", "cat\n"}});
    json d = {{"service", "echo"}, {"image", image}};
    ASSERT_EQ(
        cluster_->gateway().Call("POST", "/system/functions", d.dump()).status /
            100,
        2);
    image_ = image;
  }
  void TearDown() override {
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  bool Alive(Process& p) { return p.pid() > 0 && kill(p.pid(), 0) == 0; }

  bool EchoAnswers() {
    auto r =
        cluster_->gateway().Call("POST", "/function/echo", "still here", false);
    return r.status == 200 && r.body == "still here";
  }

  // Sends `rounds` requests to each method: every tenth a seed as it is, the
  // others mutated.
  void Hammer(const std::string& address, const std::vector<Method>& methods,
              int rounds) {
    auto channel =
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    for (const auto& m : methods) {
      std::mt19937 rng(std::hash<std::string>()(m.name));
      for (int i = 0; i < rounds; ++i) {
        const std::string& seed = m.seeds[rng() % m.seeds.size()];
        CallRaw(channel, m.name, i % 10 == 0 ? seed : Mutate(seed, rng));
      }
    }
  }

  std::string dir_, image_;
  std::unique_ptr<Cluster> cluster_;
};

std::string Bytes(const google::protobuf::Message& m) {
  return m.SerializeAsString();
}

TEST_F(RpcFuzzTest, InvokerAndGatewayHandlersSurviveArbitraryRequests) {
  ASSERT_TRUE(EchoAnswers());

  pb::LogsRequest logs;
  logs.set_name("echo");
  logs.set_namespace_("openfaas-fn");
  logs.set_tail(10);
  pb::FetchSnapshotRequest snap;
  snap.set_id("0123456789abcdef");
  ppb::CreateShardRequest create;
  create.mutable_shard()->set_id(77);
  ppb::DropShardsRequest drop;
  drop.add_ids(77);
  ppb::MigrateShardRequest migrate;
  migrate.set_id(77);
  migrate.set_target_node("node-x");
  migrate.set_target_data_address("127.0.0.1:1");
  ppb::SplitShardRequest split;
  split.set_id(77);
  split.set_new_id(78);
  ppb::MergeShardsRequest merge;
  merge.set_keep(77);
  merge.set_absorb(78);
  std::vector<Method> invoker_methods = {
      {"/silt.invoker.v1.Invoker/Logs", {Bytes(logs)}},
      {"/silt.invoker.v1.Invoker/FetchSnapshot", {Bytes(snap)}},
      {"/silt.proclets.v1.ProcletHost/CreateShard", {Bytes(create)}},
      {"/silt.proclets.v1.ProcletHost/DropShards", {Bytes(drop)}},
      {"/silt.proclets.v1.ProcletHost/MigrateShard", {Bytes(migrate)}},
      {"/silt.proclets.v1.ProcletHost/SplitShard", {Bytes(split)}},
      {"/silt.proclets.v1.ProcletHost/MergeShards", {Bytes(merge)}},
  };

  cpb::FetchBundleRequest bundle;
  bundle.set_digest(image_.substr(image_.find('@') + 1));
  cpb::FindSnapshotRequest find;
  find.set_id("0123456789abcdef");
  cpb::OpenStructureRequest open;
  open.set_namespace_("openfaas-fn");
  open.set_name("fuzzed");
  open.set_initial_shards(2);
  cpb::GetLayoutRequest layout;
  layout.set_namespace_("openfaas-fn");
  layout.set_name("fuzzed");
  cpb::DrainRequest drain;
  drain.set_node_name("no-such-node");
  std::vector<Method> gateway_methods = {
      {"/silt.invoker.v1.Control/FetchBundle", {Bytes(bundle)}},
      {"/silt.invoker.v1.Control/FindSnapshot", {Bytes(find)}},
      {"/silt.invoker.v1.Control/OpenStructure", {Bytes(open)}},
      {"/silt.invoker.v1.Control/GetLayout", {Bytes(layout)}},
      {"/silt.invoker.v1.Control/Drain", {Bytes(drain)}},
      // A fake invoker's first message, then nothing.
      {"/silt.invoker.v1.Control/Connect",
       {std::string("\x0a\x02\x0a\x00", 4)}},
  };

  constexpr int kRounds = 400;
  Hammer(cluster_->grpc_address("node-a"), invoker_methods, kRounds);
  Hammer(cluster_->gateway().grpc_address(), gateway_methods, kRounds);

  EXPECT_TRUE(Alive(cluster_->node("node-a"))) << "the invoker died";
  EXPECT_TRUE(Alive(cluster_->gateway().process())) << "the gateway died";
  // Both still serve: the node is (again) registered and calls go through.
  EXPECT_TRUE(cluster_->WaitNodes(1).ok());
  auto deadline = Clock::now() + std::chrono::seconds(30);
  bool answered = false;
  while (!answered && Clock::now() < deadline) {
    answered = EchoAnswers();
    if (!answered) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(answered);
}

}  // namespace
}  // namespace silt::testing
