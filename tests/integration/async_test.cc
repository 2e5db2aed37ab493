// Durable async calls as a user drives them: /async-function answers 202, the
// call runs, its result reaches the X-Callback-Url; failures are retried and
// then dead-lettered (silt async list|retry|remove); every accepted call runs
// although the gateway and the invoker are killed with SIGKILL meanwhile.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/callback_server.h"
#include "common/cluster.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

class AsyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "async calls run on invokers, which need root for "
                      "namespaces and cgroups: run as root";
    dir_ = MakeTempDir("silt-async");
    ClusterOptions o;
    o.gateway_flags = {
        "--node-timeout-ms",  "1000", "--async-attempts",       "3",
        "--async-backoff-ms", "50",   "--async-max-backoff-ms", "300"};
    auto c = Cluster::Start(dir_, o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    ASSERT_TRUE(cluster_->AddNode({.name = "node-a"}).ok());
    ASSERT_TRUE(cluster_->WaitNodes(1).ok());
    auto cb = CallbackServer::Start();
    ASSERT_TRUE(cb.ok()) << cb.status();
    callbacks_ = *std::move(cb);
  }
  void TearDown() override {
    callbacks_.reset();
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  GatewayProcess& gw() { return cluster_->gateway(); }

  // An exec function running `script` (sh) per call.
  void DeployScript(const std::string& name, const std::string& script,
                    json labels = json::object()) {
    std::string image =
        gw().PushExecBundle(name, "sh run.sh", {{"run.sh", script}});
    json d = {{"service", name}, {"image", image}, {"labels", labels}};
    auto r = gw().Call("POST", "/system/functions", d.dump());
    ASSERT_EQ(r.status / 100, 2) << r.body;
  }

  deploy::HttpResult Async(const std::string& fn, const std::string& body,
                           deploy::Headers headers = {}) {
    headers.emplace_back("X-Callback-Url", callbacks_->url() + "done");
    return gw().Call("POST", "/async-function/" + fn, body, false, headers);
  }

  json Queue(const std::string& query = "") {
    auto r = gw().Call("GET", "/system/async" + query);
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  }

  // Polls the queue until `done` holds for it (never a fixed sleep).
  bool WaitQueue(const std::function<bool(const json&)>& done,
                 std::chrono::seconds timeout = std::chrono::seconds(60)) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (done(Queue())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  std::string dir_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<CallbackServer> callbacks_;
};

TEST_F(AsyncTest, AcceptedCallRunsAndItsResultIsCalledBack) {
  DeployScript("echo", "cat\n");
  auto r = Async("echo", "hello async", {{"Content-Type", "text/plain"}});
  ASSERT_EQ(r.status, 202) << r.body;
  EXPECT_EQ(r.body, "");
  std::string id(r.Header("X-Call-Id"));
  ASSERT_FALSE(id.empty());

  auto got = callbacks_->WaitFor(1, std::chrono::seconds(60));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].method, "POST");
  EXPECT_EQ(got[0].target, "/done");
  EXPECT_EQ(got[0].body, "hello async");
  EXPECT_EQ(got[0].Header("X-Call-Id"), id);
  EXPECT_EQ(got[0].Header("X-Function-Status"), "200");
  EXPECT_EQ(got[0].Header("X-Function-Name"), "echo");
  double secs = -1;
  EXPECT_TRUE(absl::SimpleAtod(got[0].Header("X-Duration-Seconds"), &secs));
  EXPECT_GE(secs, 0);
  // Done and delivered: nothing left in the queue.
  EXPECT_TRUE(WaitQueue([](const json& q) { return q.empty(); })) << Queue();
  auto m = deploy::Send({.url = gw().metrics_url() + "/metrics"});
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(absl::StrContains(
      m->body,
      "silt_async_callbacks_total{function_name=\"echo.openfaas-fn\"} 1"))
      << m->body;
}

TEST_F(AsyncTest, BadAsyncRequestsAreClearErrors) {
  DeployScript("echo", "cat\n");
  EXPECT_EQ(gw().Call("GET", "/async-function/echo", "", false).status, 405);
  EXPECT_EQ(gw().Call("POST", "/async-function/nope", "x", false).status, 404);
  auto ftp = gw().Call("POST", "/async-function/echo", "x", false,
                       {{"X-Callback-Url", "ftp://example.com/x"}});
  EXPECT_EQ(ftp.status, 400);
  EXPECT_TRUE(absl::StrContains(ftp.body, "http://")) << ftp.body;
  auto https = gw().Call("POST", "/async-function/echo", "x", false,
                         {{"X-Callback-Url", "https://example.com/x"}});
  EXPECT_EQ(https.status, 400);
  EXPECT_TRUE(absl::StrContains(https.body, "https")) << https.body;
  auto id = gw().Call("POST", "/async-function/echo", "x", false,
                      {{"X-Call-Id", "has spaces in it"}});
  EXPECT_EQ(id.status, 400);
  EXPECT_TRUE(absl::StrContains(id.body, "X-Call-Id")) << id.body;
  EXPECT_EQ(gw().Call("GET", "/system/async?state=bogus").status, 400);
  EXPECT_EQ(gw().Call("POST", "/system/async/no-such-call/retry").status, 404);
  EXPECT_EQ(gw().Call("GET", "/system/async", "", false).status, 401);
  // A client retrying the same request (same X-Call-Id) is accepted once.
  for (int i = 0; i < 2; ++i) {
    auto r = Async("echo", "once", {{"X-Call-Id", "client-id-1"}});
    EXPECT_EQ(r.status, 202) << r.body;
    EXPECT_EQ(r.Header("X-Call-Id"), "client-id-1");
  }
  auto got = callbacks_->WaitFor(1, std::chrono::seconds(60));
  ASSERT_GE(got.size(), 1u);
  EXPECT_EQ(got[0].Header("X-Call-Id"), "client-id-1");
}

TEST_F(AsyncTest, FailingCallIsRetriedThenDeadLetteredAndRetriedFromTheCli) {
  DeployScript("fails", "echo broken; exit 3\n");
  auto r = Async("fails", "x");
  ASSERT_EQ(r.status, 202) << r.body;
  std::string id(r.Header("X-Call-Id"));

  // The callback hears about the failure once the attempts are spent.
  auto got = callbacks_->WaitFor(1, std::chrono::seconds(60));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].Header("X-Function-Status"), "500");
  EXPECT_EQ(got[0].Header("X-Silt-Attempts"), "3");
  EXPECT_TRUE(WaitQueue([](const json& q) {
    return q.size() == 1 && q[0].value("state", "") == "dead";
  })) << Queue();
  json dead = Queue("?state=dead&function=fails");
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0]["callId"], id);
  EXPECT_EQ(dead[0]["attempts"], 3);
  EXPECT_EQ(dead[0]["lastStatus"], 500);

  auto list = cluster_->Silt({"async", "list", "--dead"});
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_TRUE(absl::StrContains(list.out, id)) << list.out;
  EXPECT_TRUE(absl::StrContains(list.out, "dead")) << list.out;

  auto retry = cluster_->Silt({"async", "retry", "--all"});
  EXPECT_EQ(retry.exit_code, 0) << retry.err;
  EXPECT_TRUE(absl::StrContains(retry.out, "Retrying 1")) << retry.out;
  got = callbacks_->WaitFor(2, std::chrono::seconds(60));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].Header("X-Call-Id"), id);
  EXPECT_EQ(got[1].Header("X-Silt-Attempts"), "3");
  EXPECT_TRUE(WaitQueue([](const json& q) {
    return q.size() == 1 && q[0].value("state", "") == "dead";
  })) << Queue();

  auto rm = cluster_->Silt({"async", "remove", id});
  EXPECT_EQ(rm.exit_code, 0) << rm.err;
  EXPECT_TRUE(Queue().empty()) << Queue();
  EXPECT_NE(cluster_->Silt({"async", "remove", id}).exit_code, 0);
}

// com.silt.async.max-inflight=1: one run of the function at a time, in the
// order the calls came.
TEST_F(AsyncTest, AFunctionsRunsKeepToItsConcurrencyLimit) {
  DeployScript("single", "sleep 0.2; cat\n",
               {{"com.silt.async.max-inflight", "1"}});
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(Async("single", absl::StrCat(i)).status, 202);
  size_t most = 0;
  EXPECT_TRUE(WaitQueue([&](const json& q) {
    size_t running = 0;
    for (const auto& c : q)  // runs, not callback deliveries
      running += c.value("running", false) && c.value("state", "") == "queued";
    most = std::max(most, running);
    return q.empty();
  })) << Queue();
  EXPECT_EQ(most, 1u);
  auto got = callbacks_->WaitFor(5, std::chrono::seconds(10));
  ASSERT_EQ(got.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i].body, absl::StrCat(i));
}

// The durability promise: a 202 means the call runs, whatever dies meanwhile.
TEST_F(AsyncTest, AcceptedCallsRunDespiteKill9OfTheGatewayAndTheInvoker) {
  DeployScript("slow", "sleep 0.5; cat\n");
  std::set<std::string> accepted;
  auto enqueue = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      auto r = Async("slow", absl::StrCat("call-", i),
                     {{"X-Call-Id", absl::StrCat("call-", i)}});
      ASSERT_EQ(r.status, 202) << r.body;
      accepted.insert(absl::StrCat("call-", i));
    }
  };
  // No node: accepted calls wait (spending no attempts), through a crash.
  cluster_->StopNode("node-a", SIGKILL);
  enqueue(0, 10);
  ASSERT_TRUE(cluster_->RestartGateway(SIGKILL).ok());
  EXPECT_EQ(Queue().size(), 10u);
  ASSERT_TRUE(cluster_->AddNode({.name = "node-a"}).ok());

  // Kill the gateway while calls run, then the invoker.
  enqueue(10, 20);
  auto running = [](const json& q) {
    for (const auto& c : q)
      if (c.value("running", false)) return true;
    return false;
  };
  ASSERT_TRUE(WaitQueue(running)) << Queue();
  ASSERT_TRUE(cluster_->RestartGateway(SIGKILL).ok());
  enqueue(20, 30);
  ASSERT_TRUE(WaitQueue(running)) << Queue();
  cluster_->StopNode("node-a", SIGKILL);
  ASSERT_TRUE(cluster_->AddNode({.name = "node-a"}).ok());

  // Every accepted call ran and was called back (at least once), with its own
  // body.
  auto deadline = Clock::now() + std::chrono::seconds(120);
  std::set<std::string> done;
  while (Clock::now() < deadline && done.size() < accepted.size()) {
    for (const auto& c :
         callbacks_->WaitFor(done.size() + 1, std::chrono::seconds(1))) {
      if (c.Header("X-Function-Status") != "200") continue;
      EXPECT_EQ(c.body, c.Header("X-Call-Id"));
      done.insert(c.Header("X-Call-Id"));
    }
  }
  EXPECT_EQ(done, accepted);
  EXPECT_TRUE(WaitQueue([](const json& q) { return q.empty(); })) << Queue();
}

}  // namespace
}  // namespace silt::testing
