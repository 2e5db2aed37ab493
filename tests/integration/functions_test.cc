// Functions end to end: real silt-gateway and silt-invoker processes on
// loopback, functions built, pushed and deployed with the `silt` CLI, called
// over HTTP as a user would.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/gateway_process.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;

// A TCP connection to the gateway at `url` ("http://HOST:PORT") whose reads
// and sends give up after `timeout_s`; -1 when it cannot connect.
int ConnectTo(const std::string& url, int timeout_s) {
  std::string hostport = url.substr(url.find("//") + 2);
  size_t colon = hostport.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(std::stoi(hostport.substr(colon + 1)));
  inet_pton(AF_INET, hostport.substr(0, colon).c_str(), &addr.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// One GET over a plain socket whose response is read as it arrives: the head,
// then the body's chunks (chunked encoding) one at a time. Reads give up
// after 30 s, so that a test never hangs on a body that does not come.
class StreamReader {
 public:
  // With read_head false, only sends the request (head() stays empty).
  StreamReader(const std::string& url, const std::string& path,
               bool read_head = true) {
    std::string hostport = url.substr(url.find("//") + 2);
    fd_ = ConnectTo(url, 30);
    if (fd_ < 0) return;
    std::string req =
        "GET " + path + " HTTP/1.1\r\nHost: " + hostport + "\r\n\r\n";
    if (send(fd_, req.data(), req.size(), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(req.size()) ||
        !read_head)
      return;
    size_t end;
    while ((end = in_.find("\r\n\r\n")) == std::string::npos)
      if (!Fill()) return;
    head_ = in_.substr(0, end + 2);
    in_.erase(0, end + 4);
  }
  ~StreamReader() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  // The status line and headers (empty if none came).
  const std::string& head() const { return head_; }
  // The body read so far.
  const std::string& body() const { return body_; }
  bool ended() const { return ended_; }

  // Reads the next chunk into body(): false at the end (ended() says
  // whether the body ended properly, with its last chunk) or on an error.
  bool NextChunk() {
    if (ended_ || head_.empty()) return false;
    size_t eol;
    while ((eol = in_.find("\r\n")) == std::string::npos)
      if (!Fill()) return false;
    size_t size = std::stoul(in_.substr(0, eol), nullptr, 16);
    while (in_.size() < eol + 2 + size + 2)
      if (!Fill()) return false;
    body_.append(in_, eol + 2, size);
    last_chunk_ = size;
    in_.erase(0, eol + 2 + size + 2);
    if (size == 0) ended_ = true;
    return size > 0;
  }
  // Reads chunks until the body holds `text`; false if it ends first.
  bool ReadUntil(const std::string& text) {
    while (body_.find(text) == std::string::npos)
      if (!NextChunk()) return false;
    return true;
  }
  size_t last_chunk() const { return last_chunk_; }
  // Hands over the body read so far (for a long one checked as it comes).
  std::string TakeBody() { return std::exchange(body_, {}); }

 private:
  bool Fill() {
    char buf[64 << 10];
    ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    in_.append(buf, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  std::string in_, head_, body_;
  bool ended_ = false;
  size_t last_chunk_ = 0;
};

// POSTs `bytes` bytes (byte i is `byte(i)`) to `path` over a plain socket,
// made as they are sent, in parts of 1 MiB: chunked, or with their
// Content-Length. Returns the whole response (head and body; the request
// says Connection: close), or what came before an error.
std::string Upload(const std::string& url, const std::string& path,
                   uint64_t bytes, bool chunked, char (*byte)(uint64_t)) {
  std::string hostport = url.substr(url.find("//") + 2);
  int fd = ConnectTo(url, 60);
  if (fd < 0) return "";
  auto send_all = [fd](const std::string& s) {
    return send(fd, s.data(), s.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(s.size());
  };
  std::string out;
  if (send_all(absl::StrCat(
          "POST ", path, " HTTP/1.1\r\nHost: ", hostport,
          "\r\nConnection: close\r\n",
          chunked ? "Transfer-Encoding: chunked\r\n"
                  : absl::StrCat("Content-Length: ", bytes, "\r\n"),
          "\r\n"))) {
    std::string part;
    bool sent = true;
    for (uint64_t at = 0; sent && at < bytes; at += part.size()) {
      part.resize(std::min<uint64_t>(1 << 20, bytes - at));
      for (size_t j = 0; j < part.size(); ++j) part[j] = byte(at + j);
      sent = chunked ? send_all(absl::StrCat(absl::Hex(part.size()), "\r\n",
                                             part, "\r\n"))
                     : send_all(part);
    }
    if (sent && chunked) send_all("0\r\n\r\n");
    char buf[64 << 10];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
      out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

// What /proc/PID/status says of a process's memory, in KiB ("VmHWM").
uint64_t ProcStatusKiB(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0)
      return std::stoull(line.substr(field.size() + 1));
  }
  return 0;
}

// The probe's /stream body: byte i.
char StreamByte(uint64_t i) { return static_cast<char>((i * 131) ^ (i >> 16)); }

class FunctionsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    // One build of the probe function for the whole suite.
    auto r = BuildProbe("silt-fn-suite", &suite_dir_);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static void TearDownTestSuite() {
    if (!suite_dir_.empty()) std::filesystem::remove_all(suite_dir_);
  }

  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "instances run in namespaces and cgroups: run as root";
    dir_ = MakeTempDir("silt-fn");
    auto gw = GatewayProcess::Start(
        dir_ + "/gateway",
        {"--node-timeout-ms", "1000", "--max-function-body-mib", "128"});
    ASSERT_TRUE(gw.ok()) << gw.status();
    gw_ = std::make_unique<GatewayProcess>(*std::move(gw));
    auto r = Silt({"login", "--password-stdin"}, gw_->password());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    StartInvoker("node-a");
    WaitNodes(1);
    r = Silt({"push", "-f", suite_dir_ + "/stack.yml"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    image_ = "probe@" + r.out.substr(r.out.find("sha256:"), 71);
  }
  void TearDown() override {
    // SIGTERM: an invoker tears its instances down on the way out (killed,
    // it would leave them for its next start to clean up).
    for (auto& [name, p] : invokers_) p->Stop(SIGTERM);
    invokers_.clear();
    gw_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  RunResult Silt(std::vector<std::string> args, const std::string& input = "") {
    args.insert(args.begin(), SILT_CLI_BIN);
    return RunCommand(
        args, input,
        {{"OPENFAAS_CONFIG", dir_ + "/config"}, {"OPENFAAS_URL", gw_->url()}});
  }

  void StartInvoker(const std::string& name,
                    std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {SILT_INVOKER_BIN,
                                     "--gateway",
                                     gw_->grpc_address(),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--data-dir",
                                     dir_ + "/" + name,
                                     "--node-name",
                                     name,
                                     "--idle-timeout",
                                     "1",
                                     "--report-interval-ms",
                                     "100",
                                     "--max-queue",
                                     "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = Process::Start(args);
    ASSERT_TRUE(p.ok()) << p.status();
    auto line = p->WaitForLine("listening on ", std::chrono::seconds(30));
    ASSERT_TRUE(line.ok()) << line.status();
    invokers_[name] = std::make_unique<Process>(*std::move(p));
  }

  void WaitNodes(size_t n) {
    deploy::HttpResult last;
    ASSERT_TRUE(Eventually([&] {
      last = gw_->Call("GET", "/system/nodes");
      return last.status == 200 && json::parse(last.body).size() == n;
    })) << "expected "
        << n << " invokers registered; /system/nodes: " << last.status << " "
        << last.body;
  }

  void Deploy(json d) {
    if (!d.contains("image")) d["image"] = image_;
    auto r = gw_->Call("PUT", "/system/functions", d.dump());
    if (r.status == 404) r = gw_->Call("POST", "/system/functions", d.dump());
    ASSERT_EQ(r.status, 200) << r.body;
  }

  uint64_t Available(const std::string& name) {
    auto r = gw_->Call("GET", "/system/function/" + name);
    if (r.status != 200) return 0;
    return json::parse(r.body).value("availableReplicas", uint64_t{0});
  }

  deploy::HttpResult Invoke(const std::string& method, const std::string& path,
                            const std::string& body = "",
                            const deploy::Headers& headers = {}) {
    return gw_->Call(method, path, body, /*with_auth=*/false, headers);
  }

  static std::string suite_dir_;
  std::string dir_;
  std::string image_;
  std::unique_ptr<GatewayProcess> gw_;
  std::map<std::string, std::unique_ptr<Process>> invokers_;
};

std::string FunctionsTest::suite_dir_;

TEST_F(FunctionsTest, NativeFunctionThroughTheGateway) {
  ASSERT_EQ(gw_->Call("POST", "/system/secrets",
                      R"({"name":"api-key","value":"k3y"})")
                .status,
            201);
  Deploy({{"service", "probe"},
          {"envVars", {{"GREETING", "hi"}}},
          {"secrets", {"api-key"}}});

  auto r = Invoke("POST", "/function/probe/a/b?x=1&y=2", "payload",
                  {{"X-Custom", "c1"}, {"Content-Type", "application/json"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "payload");
  EXPECT_EQ(r.Header("X-Method"), "POST");
  EXPECT_EQ(r.Header("X-Path"), "/a/b");
  EXPECT_EQ(r.Header("X-Query"), "x=1&y=2");
  EXPECT_EQ(r.Header("X-Seen-Custom"), "c1");
  EXPECT_FALSE(r.Header("X-Seen-Call-Id").empty());
  EXPECT_EQ(r.Header("X-Seen-Call-Id"), r.Header("X-Call-Id"));
  EXPECT_EQ(r.Header("X-Call-Id-In-Context"), r.Header("X-Call-Id"));
  EXPECT_TRUE(absl::StartsWith(r.Header("X-Seen-Forwarded-For"), "127.0.0.1:"));
  EXPECT_EQ(r.Header("Content-Type"),
            "application/json");  // the request's, as faasd does
  EXPECT_FALSE(r.Header("X-Start-Time").empty());
  EXPECT_TRUE(r.Header("X-Silt-Start") == "boot" ||
              r.Header("X-Silt-Start") == "warm");
  double ms = -1;
  EXPECT_TRUE(absl::SimpleAtod(r.Header("X-Silt-Start-Ms"), &ms));

  r = Invoke("GET", "/function/probe.openfaas-fn/state");
  EXPECT_EQ(r.body, "initialized:probe");  // init ran before the first call
  EXPECT_EQ(r.Header("X-Silt-Start"), "warm");
  EXPECT_EQ(r.Header("Content-Type"), "text/plain; charset=utf-8");
  EXPECT_EQ(Invoke("GET", "/function/probe/env?name=GREETING").body, "hi");
  EXPECT_EQ(Invoke("GET", "/function/probe/secret?name=api-key").body, "k3y");
  // Updating the secret replaces the instances: the next call sees the new
  // value.
  ASSERT_EQ(
      gw_->Call("PUT", "/system/secrets", R"({"name":"api-key","value":"n3w"})")
          .status,
      200);
  EXPECT_EQ(Invoke("GET", "/function/probe/secret?name=api-key").body, "n3w");

  for (const char* m : {"GET", "PUT", "PATCH", "DELETE", "OPTIONS"}) {
    r = Invoke(m, "/function/probe/", "");
    EXPECT_EQ(r.status, 200) << m;
    EXPECT_EQ(r.Header("X-Method"), m);
    EXPECT_EQ(r.Header("X-Path"), "/");
  }
  r = Invoke("HEAD", "/function/probe");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "");

  // Client-sent call ids reach the function and are not echoed back.
  r = Invoke("GET", "/function/probe", "", {{"X-Call-Id", "mine-123"}});
  EXPECT_EQ(r.Header("X-Seen-Call-Id"), "mine-123");
  EXPECT_EQ(r.Header("X-Call-Id"), "");

  // Redirects reach the client unfollowed.
  r = Invoke("GET", "/function/probe/redirect");
  EXPECT_EQ(r.status, 302);
  EXPECT_EQ(r.Header("Location"), "/elsewhere");

  // Large bodies go through (streamed) and come back whole.
  std::string big(8 << 20, 'z');
  big[12345] = 'q';
  r = Invoke("POST", "/function/probe", big);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body, big);

  EXPECT_GE(Available("probe"), 1u);
}

// Function state: a sharded map, vector and queue through the SDK of a
// deployed C++ function; shards placed on the node with the most free memory
// (not where the instance runs), kept across cold starts, moved live under
// concurrent writers without losing an acknowledged write, and reported lost
// with the node's name when their node is killed.
TEST_F(FunctionsTest, StateStructuresPlacedMovedAndLost) {
  // node-b offers far more memory than this machine has: it gets the shards.
  StartInvoker("node-b", {"--memory", "100000000"});
  WaitNodes(2);
  Deploy({{"service", "probe"}});
  auto ok = [&](const std::string& path, const std::string& body = "") {
    auto r = Invoke("POST", "/function/probe" + path, body);
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    return r.body;
  };
  EXPECT_EQ(ok("/kv/put?k=a&v=1"), "ok");
  EXPECT_EQ(ok("/kv/get?k=a"), "1");
  EXPECT_EQ(ok("/kv/size"), "1");
  EXPECT_EQ(ok("/kv/erase?k=a"), "erased");
  auto r = Invoke("GET", "/function/probe/kv/get?k=a");
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_EQ(ok("/kv/mput?n=200&p=key&v=val"), "ok");
  EXPECT_EQ(ok("/kv/mget?n=200&p=key&v=val"), "200");
  EXPECT_EQ(ok("/vec/push?name=v&v=7"), "0");
  EXPECT_EQ(ok("/vec/push?name=v&v=9"), "1");
  EXPECT_EQ(ok("/vec/get?name=v&i=1"), "9");
  EXPECT_EQ(ok("/vec/size?name=v"), "2");
  ok("/q/push?name=q", "first");
  ok("/q/push?name=q", "second");
  EXPECT_EQ(ok("/q/pop?name=q"), "first");
  EXPECT_EQ(ok("/q/pop?name=q"), "second");
  r = Invoke("GET", "/function/probe/q/pop?name=q&ms=50");
  EXPECT_EQ(r.status, 408) << r.body;

  // Bad input: a clear error, nothing changed.
  r = Invoke("GET", "/function/probe/vec/push?name=kv&v=1");
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "is a map, not a vector")) << r.body;
  r = Invoke("GET", "/function/probe/kv/get?name=Bad!&k=a");
  EXPECT_EQ(r.status, 400) << r.body;
  r = Invoke("POST", "/function/probe/kv/put?k=big", std::string(2 << 20, 'x'));
  EXPECT_EQ(r.status, 413) << r.body;
  EXPECT_EQ(ok("/kv/size"), "200");

  // Placement: every shard on node-b, the node with the most free memory.
  auto procs = json::parse(gw_->Call("GET", "/system/proclets").body);
  ASSERT_EQ(procs.size(), 3u) << procs.dump();
  for (const auto& p : procs) EXPECT_EQ(p["node"], "node-b") << p.dump();
  auto st = gw_->Call("GET", "/system/state/kv");
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(json::parse(st.body)["kind"], "map");
  EXPECT_EQ(gw_->Call("GET", "/system/state/nope").status, 404);

  // State outlives instances: a new instance (boot) sees it.
  r = Invoke("GET", "/function/probe/kv/get?k=key7", "",
             {{"X-Silt-Cold-Start", "boot"}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "val7");

  // Live migration of the map's shard to node-a under concurrent writers:
  // every acknowledged write is there afterwards.
  uint64_t kv_id = 0;
  for (const auto& p : procs)
    if (p["structure"] == "kv") kv_id = p["id"];
  std::atomic<bool> stop{false};
  std::atomic<int> acked{0};
  std::thread writer([&] {
    for (int i = 0; !stop && i < 5000; ++i) {
      auto w = Invoke("GET", "/function/probe/kv/put?k=w" + std::to_string(i) +
                                 "&v=x" + std::to_string(i));
      if (w.status != 200) break;
      acked = i + 1;
    }
  });
  ASSERT_TRUE(Eventually([&] { return acked > 20; }));
  auto mig = gw_->Call("POST",
                       "/system/proclets/" + std::to_string(kv_id) + "/migrate",
                       R"({"node": "node-a"})");
  EXPECT_EQ(mig.status, 200) << mig.body;
  int at_migration = acked;
  ASSERT_TRUE(Eventually([&] { return acked > at_migration + 20; }));
  stop = true;
  writer.join();
  EXPECT_EQ(ok("/kv/mget?n=" + std::to_string(acked.load()) + "&p=w&v=x"),
            std::to_string(acked.load()));
  procs = json::parse(gw_->Call("GET", "/system/proclets").body);
  for (const auto& p : procs) {
    if (p["id"] == kv_id) {
      EXPECT_EQ(p["node"], "node-a") << p.dump();
    }
  }
  // Bad migrations: unknown node, not a number.
  EXPECT_EQ(gw_->Call("POST",
                      "/system/proclets/" + std::to_string(kv_id) + "/migrate",
                      R"({"node": "nowhere"})")
                .status,
            404);
  EXPECT_EQ(gw_->Call("POST", "/system/proclets/x/migrate", "{}").status, 400);

  // The same through the CLI.
  auto cli = Silt({"state", "list"});
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_TRUE(absl::StrContains(cli.out, "kv.openfaas-fn")) << cli.out;
  cli = Silt({"proclets", "list", "--function", "probe", "-o", "json"});
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_EQ(json::parse(cli.out).size(), 3u) << cli.out;
  cli = Silt({"nodes"});
  EXPECT_TRUE(absl::StrContains(cli.out, "node-b")) << cli.out;
  cli = Silt({"proclets", "migrate", std::to_string(kv_id), "--to", "node-b"});
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_TRUE(absl::StrContains(cli.out, "node-a -> node-b")) << cli.out;
  cli = Silt({"node", "drain", "node-b"});
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_TRUE(absl::StrContains(cli.out, "3 proclet(s) moved")) << cli.out;
  EXPECT_EQ(ok("/kv/get?k=key3"), "val3");
  EXPECT_EQ(ok("/vec/get?name=v&i=0"), "7");
  cli = Silt({"node", "drain", "node-b"});  // then back, for what follows
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  cli = Silt({"node", "drain", "node-a"});
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  cli = Silt({"proclets", "migrate", std::to_string(kv_id), "--to", "node-a"});
  EXPECT_EQ(cli.exit_code, 0) << cli.err;

  // Deleting the structure forgets it: the next use starts empty.
  EXPECT_EQ(gw_->Call("DELETE", "/system/state/v").status, 202);
  EXPECT_EQ(ok("/vec/size?name=v"), "0");

  // node-b dies without handing its shards over: calls get a clear error
  // naming it, never an empty value.
  invokers_["node-b"]->Stop(SIGKILL);
  invokers_.erase("node-b");
  ASSERT_TRUE(Eventually([&] {
    auto g = Invoke("GET", "/function/probe/q/pop?name=q");
    return g.status == 503 && absl::StrContains(g.body, "node-b");
  }));
  EXPECT_EQ(ok("/kv/get?k=key3"), "val3");  // on node-a since the move
}

TEST_F(FunctionsTest, MemoryLimitKillsOnlyThatInstance) {
  Deploy({{"service", "probe"}, {"limits", {{"memory", "64Mi"}}}});
  EXPECT_EQ(Invoke("GET", "/function/probe/alloc?mb=16").status, 200);
  auto r = Invoke("GET", "/function/probe/alloc?mb=200");
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "out of memory")) << r.body;
  r = Invoke("GET", "/function/probe/alloc?mb=16");
  EXPECT_EQ(r.status, 200) << r.body;
  auto logs = Silt({"logs", "probe"});
  EXPECT_TRUE(absl::StrContains(logs.out, "out of memory"))
      << logs.out << logs.err;
}

TEST_F(FunctionsTest, SeccompViolationAndCrashEndOnlyThatInstance) {
  Deploy({{"service", "probe"}});
  EXPECT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  auto r = Invoke("GET", "/function/probe/forbidden");
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "forbidden system call")) << r.body;
  EXPECT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  r = Invoke("GET", "/function/probe/crash");
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "crashed with signal")) << r.body;
  r = Invoke("GET", "/function/probe/state");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "initialized:probe");

  // Both deaths are counted, by reason, and start tiers are measured.
  auto m = deploy::Send({.url = gw_->metrics_url() + "/metrics"});
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(absl::StrContains(
      m->body,
      "silt_instance_failures_total{function_name=\"probe.openfaas-"
      "fn\",reason=\"seccomp\"} 1"))
      << m->body;
  EXPECT_TRUE(absl::StrContains(
      m->body,
      "silt_instance_failures_total{function_name=\"probe.openfaas-"
      "fn\",reason=\"crash\"} 1"));
  EXPECT_TRUE(absl::StrContains(
      m->body,
      "silt_function_start_seconds_count{function_name=\"probe."
      "openfaas-fn\",tier=\"warm\"}"));
}

TEST_F(FunctionsTest, ExecTimeoutIs504) {
  Deploy({{"service", "probe"}, {"envVars", {{"exec_timeout", "500ms"}}}});
  auto r = Invoke("GET", "/function/probe/sleep?ms=3000");
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_EQ(Invoke("GET", "/function/probe/sleep?ms=1").status, 200);
}

// The timeout counts from the call's arrival: a cold start that outlasts it
// (64 MiB of state filled in init, then checkpointed) leaves the call no
// time, and it still times out. The invoker once waited for the reply
// without a limit then, and a slow batch run answered 200.
TEST_F(FunctionsTest, ExecTimeoutIs504AfterALongColdStart) {
  Deploy({{"service", "probe"},
          {"envVars", {{"exec_timeout", "100ms"}, {"STATE_MB", "64"}}}});
  auto r = Invoke("GET", "/function/probe/sleep?ms=2000");
  EXPECT_EQ(r.status, 504) << r.body << " (a " << r.Header("X-Silt-Start")
                           << " start of " << r.Header("X-Silt-Start-Ms")
                           << " ms)";
}

// A classic-mode call ends when its process exits, even if a child it left
// still holds its stdout; the leftovers die with the call.
TEST_F(FunctionsTest, ClassicCallEndsWhenItsProcessExits) {
  std::string image = gw_->PushExecBundle(
      "leftover", "sh run.sh",
      {{"run.sh", "echo started; sleep 600 & echo done\n"}});
  Deploy({{"service", "leftover"},
          {"image", image},
          {"envVars", {{"exec_timeout", "120s"}}}});
  for (int i = 0; i < 3; ++i) {
    auto r = Invoke("POST", "/function/leftover", "x");
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body, "started\ndone\n");
  }
}

// faas-cli describe right after an answer says Ready: the reply carries the
// node's instance count; replicas is never below what runs.
TEST_F(FunctionsTest, AvailableReplicasIsRightTheMomentACallAnswers) {
  Deploy({{"service", "probe"}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  auto s = json::parse(gw_->Call("GET", "/system/function/probe").body);
  EXPECT_GE(s.value("availableReplicas", 0), 1) << s;
  EXPECT_GE(s.value("replicas", 0), s.value("availableReplicas", 0)) << s;
  EXPECT_EQ(s["labels"]["faas_function"], "probe") << s;
  auto d = Silt({"describe", "probe"});
  EXPECT_TRUE(absl::StrContains(d.out, "Status:           Ready")) << d.out;
}

// Makes `call` `n` times at once; the answers ("STATUS BODY"), sorted.
std::vector<std::string> AtOnce(
    int n, const std::function<deploy::HttpResult()>& call) {
  std::mutex mu;
  std::vector<std::string> seen;
  std::vector<std::thread> calls;
  for (int i = 0; i < n; ++i) {
    calls.emplace_back([&] {
      auto r = call();
      std::lock_guard<std::mutex> l(mu);
      seen.push_back(absl::StrCat(r.status, " ", r.body));
    });
  }
  for (auto& c : calls) c.join();
  std::sort(seen.begin(), seen.end());
  return seen;
}

// Warm calls to a node on the gateway's machine go straight to an instance
// the node lent the gateway (gateway/src/instance_leases.h): the invoker is
// not on their path. On a leased instance a whole answer, a streamed one, a
// 5xx, a crash and a timeout each end as they do through the call port.
TEST_F(FunctionsTest, WarmCallsGoStraightToALeasedInstance) {
  Deploy({{"service", "probe"}, {"envVars", {{"exec_timeout", "1s"}}}});
  auto leased = [&]() -> uint64_t {
    auto m = deploy::Send({.url = gw_->metrics_url() + "/metrics"});
    if (!m.ok()) return 0;
    const std::string k = "silt_gateway_calls_total{path=\"lease\"} ";
    size_t at = m->body.find(k);
    uint64_t n = 0;
    if (at != std::string::npos)
      (void)absl::SimpleAtoi(
          m->body.substr(at + k.size(), m->body.find('\n', at) - at - k.size()),
          &n);
    return n;
  };
  for (int i = 0; i < 30; ++i) {
    auto r = Invoke("GET", "/function/probe/state");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body, "initialized:probe");
  }
  EXPECT_GE(leased(), 20u) << "warm calls did not take the lease path";

  // Each of a streamed answer, a timeout and a crash, after warm calls,
  // until it went over a lease (a lease that broke is replaced by one the
  // gateway asks for after a call through the call port).
  auto over_lease = [&](const std::function<void()>& call) {
    for (int round = 0; round < 8; ++round) {
      for (int i = 0; i < 5; ++i)
        EXPECT_EQ(Invoke("GET", "/function/probe/state").status, 200);
      uint64_t before = leased();
      call();
      if (leased() == before + 1) return true;
    }
    return false;
  };
  EXPECT_TRUE(over_lease([&] {
    auto whole = Invoke("GET", "/function/probe/events?n=1&q=unused");
    EXPECT_EQ(whole.status, 200);
    EXPECT_EQ(whole.body, "data: event 1\n\ndata: end\n\n");
    EXPECT_EQ(whole.Header("X-Silt-Start"), "warm");
  }));
  EXPECT_TRUE(over_lease([&] {
    auto slow = Invoke("GET", "/function/probe/sleep?ms=3000");
    EXPECT_EQ(slow.status, 504) << slow.body;
  }));
  EXPECT_TRUE(over_lease([&] {
    // How it died, as the node saw it.
    auto crash = Invoke("GET", "/function/probe/crash");
    EXPECT_EQ(crash.status, 502) << crash.body;
    EXPECT_TRUE(absl::StartsWith(crash.body, "function probe instance ") &&
                absl::StrContains(crash.body, "crashed with signal"))
        << crash.body;
  }));
  auto after = Invoke("GET", "/function/probe/state");
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.body, "initialized:probe");
  std::string logs;
  EXPECT_TRUE(Eventually([&] {
    logs = Silt({"logs", "probe"}).out;
    return absl::StrContains(logs, "timed out");
  })) << logs;
}

// A function at its maximum (one instance) whose instance is lent to the
// gateway still serves calls that reach it through the call port (those
// that find the lease busy): the invoker recalls the lease, and no call
// waits for its time to run out.
TEST_F(FunctionsTest, ALentInstanceComesBackForCallsThroughTheCallPort) {
  Deploy({{"service", "probe"}, {"labels", {{"com.openfaas.scale.max", "1"}}}});
  for (int i = 0; i < 10; ++i)
    ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  for (int round = 0; round < 3; ++round) {
    auto seen = AtOnce(
        2, [&] { return Invoke("GET", "/function/probe/sleep?ms=200"); });
    EXPECT_EQ(seen, (std::vector<std::string>{"200 slept", "200 slept"}))
        << absl::StrJoin(seen, " | ");
  }
  // A large upload (streamed: through the call port) to the instance just
  // lent and recalled: its channel blocks again on the invoker's side.
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  std::string big(8 << 20, 'z');
  big[4321] = 'q';
  auto r = Invoke("POST", "/function/probe", big);
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 200);
  EXPECT_TRUE(r.body == big);
  EXPECT_EQ(Available("probe"), 1u);
}

TEST_F(FunctionsTest, FullQueueIs429) {
  // One instance, one queued call (--max-queue 1): of four concurrent slow
  // calls two run (one after the other) and two are refused.
  Deploy({{"service", "probe"}, {"labels", {{"com.openfaas.scale.max", "1"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  auto seen =
      AtOnce(4, [&] { return Invoke("GET", "/function/probe/sleep?ms=1500"); });
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0], "200 slept") << absl::StrJoin(seen, " | ");
  EXPECT_EQ(seen[1], "200 slept") << absl::StrJoin(seen, " | ");
  EXPECT_TRUE(absl::StartsWith(seen[2], "429 ")) << absl::StrJoin(seen, " | ");
  EXPECT_TRUE(absl::StartsWith(seen[3], "429 ")) << absl::StrJoin(seen, " | ");
}

TEST_F(FunctionsTest, ScaleUpToZeroAndBackFromZero) {
  Deploy({{"service", "probe"}});
  EXPECT_TRUE(Eventually([&] { return Available("probe") == 1; }));
  ASSERT_EQ(gw_->Call("POST", "/system/scale-function/probe",
                      R"({"serviceName":"probe","replicas":3})")
                .status,
            200);
  EXPECT_TRUE(Eventually([&] { return Available("probe") == 3; }))
      << Available("probe");
  // State written before the function scales to zero is there after.
  ASSERT_EQ(
      Invoke("POST", "/function/probe/kv/put?k=before-zero&v=kept").status,
      200);
  ASSERT_EQ(gw_->Call("POST", "/system/scale-function/probe",
                      R"({"serviceName":"probe","replicas":0})")
                .status,
            200);
  // Idle instances are reaped after the invoker's idle timeout (1 s here).
  EXPECT_TRUE(Eventually([&] { return Available("probe") == 0; }))
      << Available("probe");
  auto r = Invoke("GET", "/function/probe/state");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "initialized:probe");
  // Scaled from zero: a cold start, from the snapshot the first boot took.
  EXPECT_TRUE(r.Header("X-Silt-Start") == "boot" ||
              r.Header("X-Silt-Start") == "restore" ||
              r.Header("X-Silt-Start") == "fork")
      << r.Header("X-Silt-Start");
  r = Invoke("GET", "/function/probe/kv/get?k=before-zero");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "kept");
}

TEST_F(FunctionsTest, KilledInvokerItsFunctionsMoveToTheOther) {
  StartInvoker("node-b");
  WaitNodes(2);
  Deploy({{"service", "probe"}, {"labels", {{"com.openfaas.scale.min", "2"}}}});
  EXPECT_TRUE(Eventually([&] { return Available("probe") == 2; }))
      << Available("probe");
  auto nodes = json::parse(gw_->Call("GET", "/system/nodes").body);
  for (const auto& n : nodes)
    EXPECT_EQ(n["instances"], 1) << n;  // spread over both

  invokers_["node-a"]->Stop(SIGKILL);
  invokers_.erase("node-a");
  WaitNodes(1);
  // Both replicas now live on node-b, and calls keep working.
  EXPECT_TRUE(Eventually([&] { return Available("probe") == 2; }))
      << Available("probe");
  for (int i = 0; i < 5; ++i) {
    auto r = Invoke("GET", "/function/probe/state");
    EXPECT_EQ(r.status, 200) << r.body;
  }
}

TEST_F(FunctionsTest, LogsFollow) {
  Deploy({{"service", "probe"}});
  ASSERT_EQ(Invoke("GET", "/function/probe/log?text=first-line").status, 200);
  auto r = Silt({"logs", "probe", "-o", "raw"});
  EXPECT_TRUE(absl::StrContains(r.out, "first-line\n")) << r.out << r.err;

  auto follower = Process::Start(
      {SILT_CLI_BIN, "logs", "probe", "--tail", "-o", "raw"},
      {{"OPENFAAS_CONFIG", dir_ + "/config"}, {"OPENFAAS_URL", gw_->url()}});
  ASSERT_TRUE(follower.ok());
  ASSERT_TRUE(
      follower->WaitForLine("first-line", std::chrono::seconds(10)).ok());
  ASSERT_EQ(Invoke("GET", "/function/probe/log?text=followed-line").status,
            200);
  EXPECT_TRUE(
      follower->WaitForLine("followed-line", std::chrono::seconds(10)).ok())
      << follower->output();
  follower->Stop(SIGTERM);

  auto raw = gw_->Call("GET", "/system/logs?name=probe&tail=1");
  EXPECT_EQ(raw.Header("Content-Type"), "application/x-ndjson");
  auto line = json::parse(raw.body.substr(0, raw.body.find('\n')));
  EXPECT_EQ(line["name"], "probe");
  EXPECT_EQ(line["namespace"], "openfaas-fn");
  EXPECT_TRUE(line["timestamp"].get<std::string>().ends_with("Z"));
}

// A function's response streams: each server-sent event reaches the caller
// before the next is written (the probe writes event i+1 only after this test
// has read event i and put an item in a queue), through a client reading it
// in parts, and the same response whole through one that reads to the end.
TEST_F(FunctionsTest, EventStreamReachesTheCallerAsItIsWritten) {
  Deploy({{"service", "probe"}});
  StreamReader sse(gw_->url(), "/function/probe/events?n=3&q=sse-go");
  ASSERT_TRUE(absl::StartsWith(sse.head(), "HTTP/1.1 200")) << sse.head();
  EXPECT_TRUE(absl::StrContains(sse.head(), "text/event-stream")) << sse.head();
  EXPECT_TRUE(absl::StrContains(absl::AsciiStrToLower(sse.head()),
                                "transfer-encoding: chunked"))
      << sse.head();
  for (int i = 1; i <= 3; ++i) {
    std::string event = absl::StrCat("data: event ", i, "\n\n");
    ASSERT_TRUE(sse.ReadUntil(event)) << "event " << i << ": " << sse.body();
    EXPECT_FALSE(absl::StrContains(sse.body(), absl::StrCat("event ", i + 1)))
        << sse.body();
    if (i < 3) {
      ASSERT_EQ(
          Invoke("POST", "/function/probe/q/push?name=sse-go", "go").status,
          200);
    }
  }
  while (sse.NextChunk()) {
  }
  EXPECT_TRUE(sse.ended()) << sse.body();
  EXPECT_EQ(sse.body(),
            "data: event 1\n\ndata: event 2\n\ndata: event 3\n\ndata: end\n\n");

  auto whole = Invoke("GET", "/function/probe/events?n=1&q=unused");
  EXPECT_EQ(whole.status, 200);
  EXPECT_EQ(whole.body, "data: event 1\n\ndata: end\n\n");
  EXPECT_EQ(whole.Header("Content-Type"), "text/event-stream");
  EXPECT_FALSE(whole.Header("X-Silt-Start").empty());
}

// A body far larger than any frame or buffer (the call path's frames stop at
// 65 MiB) streams through both daemons, byte for byte, while neither one's
// peak memory grows by more than a small bound.
TEST_F(FunctionsTest, LargeStreamedBodyPassesWithBoundedMemory) {
  Deploy({{"service", "probe"}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  pid_t gateway = gw_->process().pid();
  pid_t invoker = invokers_["node-a"]->pid();
  uint64_t gw_before = ProcStatusKiB(gateway, "VmHWM");
  uint64_t inv_before = ProcStatusKiB(invoker, "VmHWM");
  constexpr uint64_t kMiB = 200;
  StreamReader r(gw_->url(), absl::StrCat("/function/probe/stream?mb=", kMiB));
  ASSERT_TRUE(absl::StartsWith(r.head(), "HTTP/1.1 200")) << r.head();
  uint64_t at = 0, wrong = 0;
  while (r.NextChunk()) {
    std::string part = r.TakeBody();
    for (size_t j = 0; j < part.size(); ++j)
      if (part[j] != StreamByte(at + j)) ++wrong;
    at += part.size();
  }
  EXPECT_TRUE(r.ended());
  EXPECT_EQ(at, kMiB << 20);
  EXPECT_EQ(wrong, 0u);
  uint64_t gw_growth = ProcStatusKiB(gateway, "VmHWM") - gw_before;
  uint64_t inv_growth = ProcStatusKiB(invoker, "VmHWM") - inv_before;
  printf("streamed %lu MiB: gateway peak RSS +%lu KiB, invoker +%lu KiB\n",
         static_cast<unsigned long>(kMiB),
         static_cast<unsigned long>(gw_growth),
         static_cast<unsigned long>(inv_growth));
#if !defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(gw_growth, 32u << 10);
  EXPECT_LT(inv_growth, 32u << 10);
#else
  // Not under ASan: its quarantine keeps freed memory (256 MiB by default),
  // so the daemons' peak RSS there says nothing about what they hold.
  (void)gw_growth;
  (void)inv_growth;
#endif
}

// A request body far larger than any buffer streams through both daemons
// to the function (which holds it whole, as its handler takes it), with a
// Content-Length and chunked: their peak RSS stays flat.
TEST_F(FunctionsTest, LargeUploadPassesWithBoundedMemory) {
  Deploy({{"service", "probe"}, {"limits", {{"memory", "1Gi"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  pid_t gateway = gw_->process().pid();
  pid_t invoker = invokers_["node-a"]->pid();
  uint64_t gw_before = ProcStatusKiB(gateway, "VmHWM");
  uint64_t inv_before = ProcStatusKiB(invoker, "VmHWM");
  constexpr uint64_t kBytes = uint64_t{100} << 20;
  for (bool chunked : {false, true}) {
    std::string r = Upload(gw_->url(), "/function/probe/count", kBytes, chunked,
                           StreamByte);
    EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200")) << r.substr(0, 300);
    EXPECT_TRUE(absl::EndsWith(r, absl::StrCat("size=", kBytes, " wrong=0")))
        << (chunked ? "chunked: " : "sized: ") << r.substr(0, 600);
  }
  uint64_t gw_growth = ProcStatusKiB(gateway, "VmHWM") - gw_before;
  uint64_t inv_growth = ProcStatusKiB(invoker, "VmHWM") - inv_before;
  printf("uploaded 2 x 100 MiB: gateway peak RSS +%lu KiB, invoker +%lu KiB\n",
         static_cast<unsigned long>(gw_growth),
         static_cast<unsigned long>(inv_growth));
#if !defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(gw_growth, 32u << 10);
  EXPECT_LT(inv_growth, 32u << 10);
#else
  (void)gw_growth;  // ASan's quarantine: see LargeStreamedBody... above
  (void)inv_growth;
#endif
  // A small body still comes whole, on the same path.
  auto small = Invoke("POST", "/function/probe/count", std::string(1000, 'x'));
  EXPECT_EQ(small.status, 200);
  EXPECT_TRUE(absl::StartsWith(small.body, "size=1000 ")) << small.body;
}

// A streamed body over the route's limit (--max-function-body-mib, 128 in
// this suite) is 413: sized, at its head; chunked, once it passes the limit
// (the call is then abandoned). The function goes on answering.
TEST_F(FunctionsTest, AStreamedBodyOverTheLimitIs413) {
  Deploy({{"service", "probe"}, {"limits", {{"memory", "1Gi"}}}});
  constexpr uint64_t kOver = uint64_t{129} << 20;
  for (bool chunked : {false, true}) {
    std::string r =
        Upload(gw_->url(), "/function/probe/count", kOver, chunked, StreamByte);
    EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 413")) << r.substr(0, 300);
    EXPECT_TRUE(absl::StrContains(r, "too large")) << r.substr(0, 600);
  }
  auto r = Invoke("POST", "/function/probe/count", "abc");
  EXPECT_EQ(r.status, 200) << r.body;
}

// A caller that leaves mid-stream ends the call: the gateway notices its
// connection close, drops the call's connection to the invoker, and the
// invoker ends the instance (its log says why); the function goes on
// answering.
TEST_F(FunctionsTest, CallerLeavingMidStreamEndsTheCall) {
  Deploy({{"service", "probe"}});
  {
    StreamReader sse(gw_->url(), "/function/probe/events?n=3&q=leave-go");
    ASSERT_TRUE(sse.ReadUntil("data: event 1\n\n")) << sse.body();
  }
  std::string logs;
  EXPECT_TRUE(Eventually([&] {
    logs = Silt({"logs", "probe"}).out;
    return absl::StrContains(logs, "went away mid-stream");
  })) << logs;
  EXPECT_EQ(Invoke("GET", "/function/probe/state").status, 200);
}

// A caller that leaves while a whole (not streamed) answer is being made:
// the call runs to its end, its instance goes back to the pool and serves
// the next call warm, and nothing of the dropped call is left anywhere.
TEST_F(FunctionsTest, CallerLeavingMidCallLeavesItsInstanceUsable) {
  Deploy({{"service", "probe"}, {"labels", {{"com.openfaas.scale.max", "1"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  {
    StreamReader dropped(gw_->url(), "/function/probe/sleep?ms=300",
                         /*read_head=*/false);
  }  // closed with the call in flight
  // One instance at most: the next call waits for the dropped one to end,
  // then gets that same instance, warm.
  auto r = Invoke("GET", "/function/probe/identity");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("X-Silt-Start"), "warm");
  EXPECT_TRUE(Eventually([&] { return Available("probe") == 1; }))
      << Available("probe");
}

// A handler that fails after its head is out: the caller sees the body cut
// short (no last chunk), not a made-up ending.
TEST_F(FunctionsTest, HandlerFailingMidStreamCutsTheBodyShort) {
  Deploy({{"service", "probe"}});
  StreamReader r(gw_->url(), "/function/probe/throw-midway");
  ASSERT_TRUE(absl::StartsWith(r.head(), "HTTP/1.1 200")) << r.head();
  while (r.NextChunk()) {
  }
  EXPECT_FALSE(r.ended());
  EXPECT_EQ(r.body(), "first part\n");
  EXPECT_EQ(Invoke("GET", "/function/probe/state").status, 200);
}

// A function that declared itself thread-safe (SILT_CONCURRENCY; the probe
// does when PROBE_CONCURRENCY is set) takes that many calls at once in one
// instance, each with its own call id.
TEST_F(FunctionsTest, ThreadSafeFunctionTakesCallsAtOnceInOneInstance) {
  Deploy({{"service", "probe"},
          {"envVars", {{"PROBE_CONCURRENCY", "4"}}},
          {"labels", {{"com.openfaas.scale.max", "1"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  // /overlap?n=4 answers once four calls were inside together (or after 10
  // s with fewer): one instance at most, so all four must share it.
  auto seen =
      AtOnce(4, [&] { return Invoke("GET", "/function/probe/overlap?n=4"); });
  std::set<std::string> instances, call_ids;
  for (const auto& s : seen) {
    EXPECT_TRUE(absl::StartsWith(s, "200 together=4 instance=")) << s;
    std::vector<std::string> f = absl::StrSplit(s, ' ');
    ASSERT_EQ(f.size(), 4u) << s;
    instances.insert(f[2]);
    call_ids.insert(f[3]);
  }
  EXPECT_EQ(instances.size(), 1u) << absl::StrJoin(seen, " | ");
  EXPECT_EQ(call_ids.size(), 4u) << absl::StrJoin(seen, " | ");
  // It serves on, one call or several, and it still counts as one instance.
  EXPECT_EQ(Invoke("GET", "/function/probe/identity").status, 200);
  EXPECT_TRUE(Eventually([&] { return Available("probe") == 1; }));
}

// Without the declaration, calls to one instance never overlap: of two calls
// at once to a one-instance function, each runs alone.
TEST_F(FunctionsTest, CallsToAFunctionThatDeclaredNothingDoNotOverlap) {
  Deploy({{"service", "probe"}, {"labels", {{"com.openfaas.scale.max", "1"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  auto seen = AtOnce(2, [&] {
    return Invoke("GET", "/function/probe/overlap?n=2&wait_ms=300");
  });
  for (const auto& s : seen)
    EXPECT_TRUE(absl::StartsWith(s, "200 together=1 ")) << s;
}

// A call of a shared instance that times out ends that call only: the
// instance takes no more calls, its other calls run on, and it stops when
// they end.
TEST_F(FunctionsTest, ATimedOutCallRetiresItsSharedInstance) {
  Deploy({{"service", "probe"},
          {"envVars", {{"PROBE_CONCURRENCY", "4"}, {"exec_timeout", "1s"}}},
          {"labels", {{"com.openfaas.scale.max", "1"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  // `stuck` waits for 99 calls (never) and times out; `other` answers once
  // it was inside together with `stuck`: both ran in the one instance.
  deploy::HttpResult stuck, other;
  std::thread t([&] {
    stuck = Invoke("GET", "/function/probe/overlap?n=99&wait_ms=10000");
  });
  other = Invoke("GET", "/function/probe/overlap?n=2&wait_ms=10000");
  t.join();
  EXPECT_EQ(stuck.status, 504) << stuck.body;
  ASSERT_EQ(other.status, 200) << other.body;
  EXPECT_TRUE(absl::StartsWith(other.body, "together=2 ")) << other.body;
  std::string retired = std::vector<std::string>(
      absl::StrSplit(other.body, ' '))[1];  // instance=ID
  // The next call gets a new instance.
  auto next = Invoke("GET", "/function/probe/identity");
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_NE("instance=" + next.body, retired);
  auto logs = Silt({"logs", "probe"});
  EXPECT_NE(logs.out.find("it takes no more calls"), std::string::npos)
      << logs.out;
}

// The com.silt.concurrency label lowers what the function declared (never
// raises it), and is checked at deploy.
TEST_F(FunctionsTest, ConcurrencyLabelLowersWhatTheFunctionDeclared) {
  Deploy({{"service", "probe"},
          {"envVars", {{"PROBE_CONCURRENCY", "4"}}},
          {"labels",
           {{"com.openfaas.scale.max", "1"}, {"com.silt.concurrency", "2"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  // Three calls, two at a time: the third waits for a place. Each waits up
  // to 2 s for a third call beside it (long enough that the first two meet
  // also on a loaded machine).
  auto seen = AtOnce(3, [&] {
    return Invoke("GET", "/function/probe/overlap?n=3&wait_ms=2000");
  });
  for (const auto& s : seen)
    EXPECT_TRUE(absl::StartsWith(s, "200 together=2 ")) << s;
  for (const char* bad : {"0", "1025", "many"}) {
    json d = {{"service", "probe"},
              {"image", image_},
              {"labels", {{"com.silt.concurrency", bad}}}};
    auto r = gw_->Call("PUT", "/system/functions", d.dump());
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
    EXPECT_NE(r.body.find("com.silt.concurrency"), std::string::npos)
        << bad << ": " << r.body;
  }
}

TEST_F(FunctionsTest, ExamplesDeployAndAnswer) {
  std::string examples = std::string(SILT_SOURCE_DIR) + "/examples";
  std::string work = dir_ + "/examples";
  std::filesystem::copy(examples, work,
                        std::filesystem::copy_options::recursive);
  for (const char* ex : {"hello", "lookup", "python", "python-http", "state"}) {
    auto r = Silt({"up", "-f", work + "/" + ex + "/stack.yml"});
    ASSERT_EQ(r.exit_code, 0) << ex << ": " << r.out << r.err;
  }
  auto r = Invoke("POST", "/function/hello", "Silt");
  EXPECT_EQ(r.body, "Hello, Silt!\n");
  r = Invoke("POST", "/function/primes", "97");
  EXPECT_EQ(r.body, "97 is prime (prime number 25)\n");
  r = Invoke("POST", "/function/primes", "91");
  EXPECT_EQ(r.body, "91 is not prime\n");
  r = Invoke("POST", "/function/wordcount/x", "one two three\nfour\n");
  ASSERT_EQ(r.status, 200) << r.body;
  auto wc = json::parse(r.body);
  EXPECT_EQ(wc["words"], 4);
  EXPECT_EQ(wc["lines"], 2);
  EXPECT_EQ(wc["path"], "/x");
  r = Invoke("POST", "/function/greeter/path", "Ada");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(absl::StartsWith(r.body, "Hi Ada, I have answered")) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "at /path")) << r.body;
  auto second = Invoke("GET", "/function/greeter");
  EXPECT_TRUE(absl::StartsWith(second.body, "Hi stranger")) << second.body;
  {
    // An http-mode server's unsized body streams as it writes it.
    StreamReader sse(gw_->url(), "/function/greeter/events?n=2&q=greet-go");
    ASSERT_TRUE(absl::StartsWith(sse.head(), "HTTP/1.1 200")) << sse.head();
    ASSERT_TRUE(sse.ReadUntil("data: event 1\n\n")) << sse.body();
    auto go = Invoke("POST", "/function/greeter/go?q=greet-go");
    EXPECT_EQ(go.status, 204) << go.body << go.Header("X-Silt-Start");
    ASSERT_TRUE(sse.ReadUntil("data: event 2\n\n")) << sse.body();
    while (sse.NextChunk()) {
    }
    EXPECT_TRUE(sse.ended());
    EXPECT_EQ(sse.body(), "data: event 1\n\ndata: event 2\n\n");
  }
  // The http-mode server restored from its snapshot (CRIU holds its
  // listening socket) answers, and what it writes to stderr after the
  // restore reaches the function's log.
  EXPECT_TRUE(Eventually([&] {
    auto restored = Invoke("POST", "/function/greeter/restored", "Bo",
                           {{"X-Silt-Cold-Start", "restore"}});
    return restored.status == 200 &&
           restored.Header("X-Silt-Start") == "restore" &&
           absl::StartsWith(restored.body, "Hi Bo");
  }));
  EXPECT_TRUE(Eventually([&] {
    return absl::StrContains(Silt({"logs", "greeter"}).out, "/restored");
  }));
  // examples/state: a shared map and a job queue.
  EXPECT_EQ(Invoke("PUT", "/function/catalog?sku=42", "a lamp").body,
            "stored 42\n");
  EXPECT_EQ(Invoke("GET", "/function/catalog?sku=42").body, "a lamp");
  EXPECT_EQ(Invoke("GET", "/function/catalog?sku=7").status, 404);
  EXPECT_EQ(Invoke("POST", "/function/jobs?op=submit", "job one").status, 202);
  EXPECT_EQ(Invoke("POST", "/function/jobs?op=work").body, "JOB ONE\n");
  EXPECT_EQ(Invoke("POST", "/function/jobs?op=work").status, 204);
}

TEST(SiltLocal, StartsGatewayAndInvokerAndStopsCleanly) {
  if (geteuid() != 0) GTEST_SKIP() << "the invoker needs root";
  std::string dir = MakeTempDir("silt-local");
  auto p = Process::Start({SILT_CLI_BIN, "local", "--data-dir", dir, "--listen",
                           "127.0.0.1:0", "--no-auth"});
  ASSERT_TRUE(p.ok());
  auto line = p->WaitForLine("listening on ", std::chrono::seconds(30));
  ASSERT_TRUE(line.ok()) << line.status();
  std::string url = "http://" + line->substr(13);
  auto r = deploy::Send({.url = url + "/system/nodes"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(json::parse(r->body).size(), 1u);
  int status = p->Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::filesystem::remove_all(dir);
}

// ---- snapshots (CRIU): checkpoint after init, restore, fork ----

class SnapshotTest : public FunctionsTest {
 protected:
  void SetUp() override {
    FunctionsTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto v = RunCommand({"/usr/local/sbin/criu", "--version"});
    if (v.exit_code != 0)
      GTEST_SKIP() << "CRIU 4.1 is not installed: run deploy/setup.sh";
  }

  // The function's snapshots as the gateway's catalog lists them.
  json Snapshots(const std::string& name) {
    auto r = gw_->Call("GET", "/system/snapshots/" + name);
    if (r.status != 200) return json::array();
    return json::parse(r.body);
  }

  // Waits until the current version has a snapshot on `nodes` nodes.
  std::string WaitSnapshot(const std::string& name, size_t nodes = 1) {
    std::string id;
    EXPECT_TRUE(Eventually([&] {
      for (const auto& s : Snapshots(name)) {
        if (s.value("current", false) && s["nodes"].size() >= nodes) {
          id = s.value("id", "");
          return true;
        }
      }
      return false;
    })) << Snapshots(name).dump();
    return id;
  }

  deploy::HttpResult Cold(const std::string& tier, const std::string& path) {
    return Invoke("GET", path, "", {{"X-Silt-Cold-Start", tier}});
  }
};

TEST_F(SnapshotTest, RestoreAndForkKeepInitState) {
  Deploy({{"service", "probe"}, {"envVars", {{"STATE_MB", "8"}}}});
  auto r = Invoke("GET", "/function/probe/heap");
  ASSERT_EQ(r.status, 200) << r.body;
  std::string id = WaitSnapshot("probe");
  ASSERT_FALSE(id.empty());
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/node-a/snapshots/" + id +
                                      "/manifest.json"));

  for (const char* tier : {"restore", "fork", "boot"}) {
    r = Cold(tier, "/function/probe/heap");
    EXPECT_EQ(r.status, 200) << tier << ": " << r.body;
    EXPECT_EQ(r.body, "8 MiB intact") << tier;
    EXPECT_EQ(r.Header("X-Silt-Start"), tier);
    double ms = -1;
    EXPECT_TRUE(absl::SimpleAtod(r.Header("X-Silt-Start-Ms"), &ms) && ms > 0)
        << tier << " " << r.Header("X-Silt-Start-Ms");
    r = Cold(tier, "/function/probe/state");
    EXPECT_EQ(r.body, "initialized:probe") << tier;
    // How an instance of each tier died is told (a clone is not the
    // invoker's child). /crash aborts: pid 1 of a sandbox ignores its own
    // SIGABRT, so abort() ends it with SIGSEGV; a clone is not pid 1.
    r = Cold(tier, "/function/probe/crash");
    EXPECT_EQ(r.status, 502) << tier << ": " << r.body;
    EXPECT_TRUE(absl::StrContains(r.body, "crashed with signal "))
        << tier << ": " << r.body;
  }
  r = Invoke("GET", "/function/probe", "", {{"X-Silt-Cold-Start", "later"}});
  EXPECT_EQ(r.status, 400);

  auto d = Silt({"describe", "probe"});
  EXPECT_NE(d.out.find("Snapshot:         ready (" + id), std::string::npos)
      << d.out;
  auto l = Silt({"snapshot", "list"});
  EXPECT_NE(l.out.find(id), std::string::npos) << l.out;
  EXPECT_NE(l.out.find("node-a"), std::string::npos) << l.out;
  auto metrics = deploy::Send({.url = gw_->metrics_url() + "/metrics"}).value();
  EXPECT_NE(metrics.body.find("tier=\"restore\""), std::string::npos);
  EXPECT_NE(metrics.body.find("tier=\"fork\""), std::string::npos);
}

// Every start tier runs the instance as root of its own user namespace,
// which is an unprivileged host id of the function's own: root-only host
// files stay closed, the function's secrets open, and restored and forked
// clones keep the id they were checkpointed with.
TEST_F(SnapshotTest, EveryTierRunsAsTheFunctionsOwnUnprivilegedHostId) {
  ASSERT_EQ(gw_->Call("POST", "/system/secrets",
                      R"({"name":"api-key","value":"k3y"})")
                .status,
            201);
  Deploy({{"service", "probe"}, {"secrets", {"api-key"}}});
  Deploy({{"service", "other"}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  WaitSnapshot("probe");
  std::string probe_ids = Invoke("GET", "/function/probe/whoami").body;
  std::string other_ids = Invoke("GET", "/function/other/whoami").body;
  EXPECT_TRUE(absl::StartsWith(probe_ids, "uid=0 gid=0 maps 0->")) << probe_ids;
  EXPECT_TRUE(absl::EndsWith(probe_ids, "x1")) << probe_ids;
  EXPECT_NE(probe_ids, other_ids) << "each function has its own host id";
  uint64_t host = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(probe_ids.substr(20, probe_ids.size() - 22), &host))
      << probe_ids;
  EXPECT_GE(host, 1u << 30);
  for (const char* tier : {"boot", "restore", "fork", "criu"}) {
    auto r = Cold(tier, "/function/probe/whoami");
    EXPECT_EQ(r.Header("X-Silt-Start"), tier);
    EXPECT_EQ(r.body, probe_ids) << tier;
    r = Cold(tier, "/function/probe/read?path=/etc/shadow");
    EXPECT_EQ(r.status, 403) << tier << ": " << r.body;
    EXPECT_EQ(r.body, "denied: Permission denied") << tier;
    r = Cold(tier, "/function/probe/secret?name=api-key");
    EXPECT_EQ(r.body, "k3y") << tier;
  }
  // The node's data dir (images, instances' secrets) is root's alone.
  EXPECT_EQ(std::filesystem::status(dir_ + "/node-a").permissions() &
                std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
}

// silt-restorer maps the image's pages instead of copying them (the restored
// process's memory is backed by pages-1.img); with --criu-restore, CRIU
// restores the same image by copying. Both keep the state.
TEST_F(SnapshotTest, RestorerMapsTheImageAndCriuRestoresItToo) {
  Deploy({{"service", "probe"}, {"envVars", {{"STATE_MB", "8"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/heap").status, 200);
  std::string id = WaitSnapshot("probe");
  for (int i = 0; i < 3; ++i) {  // a staged restorer, then fresh ones
    auto r = Cold("restore", "/function/probe/heap");
    EXPECT_EQ(r.body, "8 MiB intact");
    EXPECT_EQ(r.Header("X-Silt-Start"), "restore");
    r = Cold("restore", "/function/probe/maps");
    EXPECT_TRUE(absl::StrContains(r.body, "/pages-1.img")) << r.body;
    r = Cold("restore", "/function/probe/state");
    EXPECT_EQ(r.body, "initialized:probe");
  }
  // The fork template came from the restorer too: clones share its
  // file-backed memory.
  auto r = Cold("fork", "/function/probe/maps");
  EXPECT_TRUE(absl::StrContains(r.body, "/pages-1.img")) << r.body;
  auto logs = Silt({"logs", "probe"});
  EXPECT_FALSE(absl::StrContains(logs.out, "fast restore failed")) << logs.out;

  // The same node restarted with --criu-restore: CRIU restores the image it
  // finds on disk.
  invokers_["node-a"]->Stop(SIGTERM);
  invokers_.erase("node-a");
  StartInvoker("node-a", {"--criu-restore"});
  WaitNodes(1);
  EXPECT_TRUE(Eventually([&] {
    return Cold("restore", "/function/probe/heap").body == "8 MiB intact";
  }));
  r = Cold("restore", "/function/probe/maps");
  EXPECT_EQ(r.Header("X-Silt-Start"), "restore");
  EXPECT_FALSE(absl::StrContains(r.body, "/pages-1.img")) << r.body;
}

// Staged restorers and fork templates share the node's resident budget:
// with more functions than fit, what stays resident is within it. Every
// function keeps a staged restorer, but only the most recently started ones
// have their image's pages faulted in (those take at most half the budget);
// the others only map them.
TEST_F(SnapshotTest, ResidentBudgetKeepsTheMostRecentlyStartedFunctions) {
  constexpr uint64_t kBudgetMiB = 48;
  invokers_["node-a"]->Stop(SIGTERM);
  invokers_.erase("node-a");
  StartInvoker("node-a", {"--resident-memory-mib", std::to_string(kBudgetMiB)});
  WaitNodes(1);
  const std::vector<std::string> fns = {"p1", "p2", "p3", "p4"};
  for (const auto& f : fns) {
    Deploy({{"service", f}, {"envVars", {{"STATE_MB", "16"}}}});
    ASSERT_EQ(Invoke("GET", "/function/" + f + "/heap").body, "16 MiB intact");
    WaitSnapshot(f);
  }
  // Restored in order: p4 started last.
  for (const auto& f : fns) {
    auto r = Cold("restore", "/function/" + f + "/heap");
    EXPECT_EQ(r.body, "16 MiB intact") << f;
  }
  json all;
  auto field = [&](const std::string& f, const char* name) -> json {
    for (const auto& s : all)
      if (s.value("name", "") == f && s.value("current", false))
        return s.value(name, json());
    return json();
  };
  auto resident = [&](const std::string& f) {
    return field(f, "residentBytes").get<uint64_t>();
  };
  uint64_t total = 0;
  EXPECT_TRUE(Eventually([&] {
    all = json::parse(gw_->Call("GET", "/system/snapshots").body);
    total = 0;
    bool all_staged = true;
    for (const auto& f : fns) {
      total += resident(f);
      all_staged = all_staged && field(f, "staged").get<bool>();
    }
    // p4's image (16 MiB of heap) is faulted in; p1's only mapped.
    return all_staged && total <= (kBudgetMiB << 20) &&
           resident("p4") >= (16u << 20) && resident("p1") < (8u << 20);
  })) << all.dump();
  EXPECT_LE(total, kBudgetMiB << 20) << all.dump();
  // The metrics show what /system/snapshots just did (p4 resident); after
  // the restore below p1 is the most recent and p4 may be demoted.
  auto metrics = deploy::Send({.url = gw_->metrics_url() + "/metrics"}).value();
  EXPECT_TRUE(absl::StrContains(
      metrics.body,
      "silt_snapshot_resident_bytes{function_name=\"p4.openfaas-fn\","
      "node=\"node-a\"}"))
      << metrics.body;
  // p1 restores from its mapped-only restorer.
  auto r = Cold("restore", "/function/p1/heap");
  EXPECT_EQ(r.body, "16 MiB intact");
  EXPECT_EQ(r.Header("X-Silt-Start"), "restore");
  auto l = Silt({"snapshot", "list"});
  EXPECT_TRUE(absl::StrContains(l.out, "Resident")) << l.out;
}

// A restore that finds no restorer staged maps the image lazily; its first
// call records what it touched (the image's working set), and later
// restores from disk read that ahead in one pass. An update drops the old
// image's working set with the image.
TEST_F(SnapshotTest, LazyRestoresRecordTheWorkingSetAndReadItAhead) {
  invokers_["node-a"]->Stop(SIGTERM);
  invokers_.erase("node-a");
  StartInvoker("node-a", {"--resident-memory-mib", "0"});
  WaitNodes(1);
  Deploy({{"service", "probe"}, {"envVars", {{"STATE_MB", "8"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/heap").body, "8 MiB intact");
  std::string id = WaitSnapshot("probe");
  std::string ws = dir_ + "/node-a/working-sets/" + id;
  EXPECT_FALSE(std::filesystem::exists(ws)) << "booted, not restored";

  auto r = Cold("restore", "/function/probe/heap");
  EXPECT_EQ(r.body, "8 MiB intact");
  EXPECT_EQ(r.Header("X-Silt-Start"), "restore");
  // Recorded before the answer left: the 8 MiB heap the call read, and
  // not the whole image with the rest of it.
  auto ranges = [&] {
    std::ifstream in(ws);
    std::string line;
    uint64_t bytes = 0;
    std::getline(in, line);
    EXPECT_EQ(line, "silt-working-set 1");
    while (std::getline(in, line) && line != "end") {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      uint64_t len = 0;
      EXPECT_TRUE(f.size() == 2 && absl::SimpleAtoi(f[1], &len)) << line;
      bytes += len;
    }
    EXPECT_EQ(line, "end");
    return bytes;
  };
  uint64_t recorded = ranges();
  EXPECT_GE(recorded, 8u << 20);
  uint64_t image = std::filesystem::file_size(dir_ + "/node-a/snapshots/" + id +
                                              "/pages-1.img");
  EXPECT_LE(recorded, image);

  // From disk: the image leaves the page cache; the restore reads the
  // working set ahead and the call still finds its heap intact.
  for (int i = 0; i < 2; ++i) {
    int fd = open((dir_ + "/node-a/snapshots/" + id + "/pages-1.img").c_str(),
                  O_RDONLY);
    ASSERT_GE(fd, 0);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    r = Cold("restore", "/function/probe/heap");
    EXPECT_EQ(r.body, "8 MiB intact");
    EXPECT_EQ(r.Header("X-Silt-Start"), "restore");
  }
  EXPECT_EQ(ranges(), recorded) << "recorded once per image";

  // A new version: the old image goes, and its working set with it.
  Deploy({{"service", "probe"}, {"envVars", {{"STATE_MB", "4"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/heap").body, "4 MiB intact");
  EXPECT_TRUE(Eventually([&] { return !std::filesystem::exists(ws); }));
}

TEST_F(SnapshotTest, TenConcurrentColdStartsRestoreFromOneImage) {
  Deploy({{"service", "probe"}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  WaitSnapshot("probe");
  std::vector<deploy::HttpResult> results(10);
  std::vector<std::thread> threads;
  for (int i = 0; i < 10; ++i)
    threads.emplace_back(
        [&, i] { results[i] = Cold("restore", "/function/probe/identity"); });
  for (auto& t : threads) t.join();
  std::set<std::string> ids;
  for (const auto& r : results) {
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.Header("X-Silt-Start"), "restore");
    ids.insert(r.body);
  }
  EXPECT_EQ(ids.size(), 10u) << "each clone has its own identity";
}

TEST_F(SnapshotTest, ClonesDrawDifferentRandomNumbers) {
  Deploy({{"service", "probe"}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  WaitSnapshot("probe");
  for (const char* tier : {"fork", "restore"}) {
    auto a = Cold(tier, "/function/probe/random");
    auto b = Cold(tier, "/function/probe/random");
    ASSERT_EQ(a.status, 200) << a.body;
    ASSERT_EQ(b.status, 200) << b.body;
    EXPECT_EQ(a.Header("X-Silt-Start"), tier);
    EXPECT_EQ(b.Header("X-Silt-Start"), tier);
    std::vector<std::string> fa = absl::StrSplit(a.body, ' ');
    std::vector<std::string> fb = absl::StrSplit(b.body, ' ');
    ASSERT_EQ(fa.size(), 3u);
    ASSERT_EQ(fb.size(), 3u);
    EXPECT_NE(fa[0], fb[0]) << tier << ": the after-restore hook reseeds";
    EXPECT_NE(fa[1], fb[1]) << tier << ": random() is reseeded by Silt";
    EXPECT_EQ(fa[2], "1") << tier << ": the hook ran once";
    EXPECT_EQ(fb[2], "1") << tier << ": the hook ran once";
  }
}

TEST_F(SnapshotTest, CorruptedImageNeverRestoresTheCallBoots) {
  Deploy({{"service", "probe"}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  std::string id = WaitSnapshot("probe");
  std::string pages = dir_ + "/node-a/snapshots/" + id + "/pages-1.img";
  ASSERT_TRUE(std::filesystem::exists(pages));
  {
    std::fstream f(pages, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(100);
    f.write(&c, 1);
  }
  auto r = Invoke("GET", "/function/probe/state", "",
                  {{"X-Silt-Cold-Start", "restore"}});
  EXPECT_NE(r.status, 200) << "a corrupted image must not restore";
  // A normal cold start falls back to booting, and snapshots again.
  ASSERT_EQ(gw_->Call("POST", "/system/scale-function/probe",
                      R"({"serviceName":"probe","replicas":0})")
                .status,
            200);
  EXPECT_TRUE(Eventually([&] { return Available("probe") == 0; }));
  r = Invoke("GET", "/function/probe/state");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "initialized:probe");
  EXPECT_EQ(r.Header("X-Silt-Start"), "boot");
  auto logs = Silt({"logs", "probe"});
  EXPECT_NE(logs.out.find("does not match its checksum"), std::string::npos)
      << logs.out;
  // The catalog may still list the dropped image for a report interval: wait
  // for the new one on disk (sealed by rename, so the manifest is last).
  ASSERT_TRUE(Eventually([&] {
    return std::filesystem::exists(dir_ + "/node-a/snapshots/" + id +
                                   "/manifest.json");
  }));
  // Truncated: the same.
  std::filesystem::resize_file(pages, std::filesystem::file_size(pages) / 2);
  r = Cold("restore", "/function/probe/state");
  EXPECT_NE(r.status, 200);
  r = Invoke("GET", "/function/probe/state");
  EXPECT_EQ(r.status, 200);
}

TEST_F(SnapshotTest, InvokerWithoutTheImageFetchesItFromAPeer) {
  Deploy({{"service", "probe"}, {"envVars", {{"STATE_MB", "4"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/heap").status, 200);
  std::string id = WaitSnapshot("probe");
  StartInvoker("node-b");
  WaitNodes(2);
  // A replica on node-b: its first instance restores from node-a's image.
  ASSERT_EQ(gw_->Call("POST", "/system/scale-function/probe",
                      R"({"serviceName":"probe","replicas":2})")
                .status,
            200);
  WaitSnapshot("probe", 2);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/node-b/snapshots/" + id +
                                      "/manifest.json"));
  auto logs = Silt({"logs", "probe"});
  EXPECT_EQ(logs.out.find("restore failed"), std::string::npos) << logs.out;
}

TEST_F(SnapshotTest, UpdateInvalidatesDeleteRemoves) {
  Deploy({{"service", "probe"}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  std::string first = WaitSnapshot("probe");
  Deploy({{"service", "probe"}, {"envVars", {{"V", "2"}}}});
  auto r = Invoke("GET", "/function/probe/env?name=V");
  EXPECT_EQ(r.body, "2");
  std::string second = WaitSnapshot("probe");
  EXPECT_NE(first, second);
  EXPECT_TRUE(Eventually([&] {
    return !std::filesystem::exists(dir_ + "/node-a/snapshots/" + first);
  }));
  r = Cold("restore", "/function/probe/env?name=V");
  EXPECT_EQ(r.body, "2") << "restores come from the new version's image";

  auto del = Silt({"snapshot", "delete", "probe"});
  EXPECT_EQ(del.exit_code, 0) << del.err;
  EXPECT_TRUE(Eventually([&] {
    return !std::filesystem::exists(dir_ + "/node-a/snapshots/" + second);
  }));
  auto removed =
      gw_->Call("DELETE", "/system/functions", R"({"functionName":"probe"})");
  ASSERT_TRUE(removed.status == 200 || removed.status == 202) << removed.body;
  EXPECT_TRUE(Eventually([&] {
    return std::filesystem::is_empty(dir_ + "/node-a/snapshots") &&
           gw_->Call("GET", "/system/snapshots").body == "[]";
  }));
  EXPECT_EQ(gw_->Call("GET", "/system/snapshots/probe").status, 404);
}

TEST_F(SnapshotTest, NoSnapshotLabelAlwaysBoots) {
  Deploy({{"service", "probe"}, {"labels", {{"com.silt.snapshot", "false"}}}});
  ASSERT_EQ(Invoke("GET", "/function/probe/state").status, 200);
  auto r = Cold("boot", "/function/probe/state");
  EXPECT_EQ(r.Header("X-Silt-Start"), "boot");
  r = Cold("restore", "/function/probe/state");
  EXPECT_NE(r.status, 200);
  EXPECT_NE(r.body.find("does not use snapshots"), std::string::npos) << r.body;
  EXPECT_TRUE(Snapshots("probe").empty());
  auto d = Silt({"describe", "probe"});
  EXPECT_NE(d.out.find("Snapshot:         off"), std::string::npos) << d.out;
}

}  // namespace
}  // namespace silt::testing
