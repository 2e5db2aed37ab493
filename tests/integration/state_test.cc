// The any-language state API end to end: Python functions (classic and http
// mode) reach sharded maps, vectors and queues through SILT_STATE_URL, a
// loopback HTTP server inside their sandbox. Two nodes in their own network
// namespaces: the Python functions run on node-a, the shards live on node-b
// (which offers far more memory), next to the C++ probe function, which reads
// what Python wrote through the SDK. Errors are HTTP statuses that change
// nothing; the state and the API's address survive the instance being
// replaced (boot, restore, fork).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cluster.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;

// The test's Python function: runs the state API requests it is given (a
// JSON list of {"m": METHOD, "p": PATH, "b": hex body | "n": body size}; "m"
// RAW sends the hex bytes "b" as they are, ENV answers SILT_STATE_URL) and
// answers, for each, [status, hex body, X-Silt-State-Code]. Classic mode
// reads the list on stdin; "serve" is the http-mode server on port 5000.
constexpr char kDriver[] = R"py(import http.server
import json
import os
import socket
import sys
import urllib.error
import urllib.request


def call(method, path, body):
    req = urllib.request.Request(os.environ["SILT_STATE_URL"] + path,
                                 data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return [r.status, r.read().hex(), ""]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().hex(), e.headers.get("X-Silt-State-Code", "")]


def raw(data):
    host, port = os.environ["SILT_STATE_URL"][len("http://"):].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    status = int(out.split(b" ")[1]) if out.startswith(b"HTTP/1.1 ") else 0
    return [status, out.hex(), ""]


def run(script):
    out = []
    for step in json.loads(script):
        if step["m"] == "RAW":
            out.append(raw(bytes.fromhex(step["b"])))
        elif step["m"] == "ENV":
            out.append([200, os.environ.get("SILT_STATE_URL", "").encode().hex(), ""])
        else:
            body = bytes.fromhex(step["b"]) if "b" in step else None
            if "n" in step:
                body = b"x" * step["n"]
            out.append(call(step["m"], step["p"], body))
    return json.dumps(out)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        out = run(self.rfile.read(n)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, fmt, *args):
        pass


if sys.argv[1:] == ["serve"]:
    http.server.HTTPServer(("127.0.0.1", 5000), Handler).serve_forever()
else:
    print(run(sys.stdin.read()))
)py";

// How long to wait for what the daemons do in the background (snapshots).
constexpr std::chrono::seconds kBackground{30};

// One state API request as the Python function saw it.
struct Step {
  int status = 0;
  std::string body;
  std::string code;  // X-Silt-State-Code
};

json Req(const std::string& method, const std::string& path,
         std::optional<std::string> body = std::nullopt) {
  json s = {{"m", method}, {"p", path}};
  if (body) s["b"] = absl::BytesToHexString(*body);
  return s;
}

json Raw(const std::string& bytes) {
  return {{"m", "RAW"}, {"b", absl::BytesToHexString(bytes)}};
}

class StateApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    suite_dir_ = MakeTempDir("silt-state-suite");
    std::filesystem::create_directories(suite_dir_ + "/driver");
    std::ofstream(suite_dir_ + "/driver/handler.py") << kDriver;
    std::ofstream(suite_dir_ + "/stack.yml")
        << "version: 1.0\nprovider:\n  name: openfaas\nfunctions:\n"
        << "  probe:\n    lang: cpp\n    handler: " << SILT_SOURCE_DIR
        << "/tests/functions/probe\n    image: probe\n"
        << "    constraints: [\"node.name==node-b\"]\n"
        << "  statepy:\n    lang: python\n    handler: ./driver\n"
        << "    image: statepy\n    fprocess: python3 handler.py\n"
        << "    constraints: [\"node.name==node-a\"]\n"
        << "  statepyhttp:\n    lang: python\n    handler: ./driver\n"
        << "    image: statepyhttp\n    fprocess: python3 handler.py serve\n"
        << "    environment:\n      mode: http\n"
        << "      upstream_url: http://127.0.0.1:5000\n"
        << "    constraints: [\"node.name==node-a\"]\n";
    auto r =
        RunCommand({SILT_CLI_BIN, "build", "-f", suite_dir_ + "/stack.yml"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static void TearDownTestSuite() {
    if (!suite_dir_.empty()) std::filesystem::remove_all(suite_dir_);
  }

  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "instances run in namespaces and cgroups, nodes in "
                      "network namespaces: run as root";
    dir_ = MakeTempDir("silt-state");
    auto c = Cluster::Start(dir_);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    // node-b offers far more memory than node-a: it gets the shards.
    auto s = cluster_->AddNode({.name = "node-a", .memory_mib = 4096});
    ASSERT_TRUE(s.ok()) << s;
    s = cluster_->AddNode({.name = "node-b", .memory_mib = 1 << 20});
    ASSERT_TRUE(s.ok()) << s;
    s = cluster_->WaitNodes(2);
    ASSERT_TRUE(s.ok()) << s;
    for (const char* cmd : {"push", "deploy"}) {
      auto r = cluster_->Silt({cmd, "-f", suite_dir_ + "/stack.yml"});
      ASSERT_EQ(r.exit_code, 0) << cmd << ": " << r.out << r.err;
    }
  }
  void TearDown() override {
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  deploy::HttpResult Invoke(const std::string& method, const std::string& path,
                            const std::string& body = "",
                            const deploy::Headers& headers = {}) {
    return cluster_->gateway().Call(method, path, body, /*with_auth=*/false,
                                    headers);
  }

  // Runs `script` in the Python function `fn`; one Step per request.
  std::vector<Step> Py(const json& script, const std::string& fn = "statepy",
                       const deploy::Headers& headers = {},
                       std::string* start_tier = nullptr) {
    auto r = Invoke("POST", "/function/" + fn, script.dump(), headers);
    if (start_tier) *start_tier = std::string(r.Header("X-Silt-Start"));
    std::vector<Step> out;
    EXPECT_EQ(r.status, 200) << fn << ": " << r.body;
    json j = json::parse(r.body, nullptr, false);
    if (!j.is_array() || j.size() != script.size()) {
      ADD_FAILURE() << fn << " answered " << r.body;
      out.resize(script.size());
      return out;
    }
    for (const auto& s : j) {
      Step step;
      step.status = s[0].get<int>();
      step.body = absl::HexStringToBytes(s[1].get<std::string>());
      step.code = s[2].get<std::string>();
      out.push_back(std::move(step));
    }
    return out;
  }
  Step Py1(const json& req, const std::string& fn = "statepy") {
    return Py(json::array({req}), fn)[0];
  }

  // A call to the C++ probe function (its /kv, /vec and /q routes use the
  // SDK); "<status> <body>".
  std::string Probe(const std::string& path, const std::string& body = "") {
    auto r = Invoke("POST", "/function/probe" + path, body);
    return absl::StrCat(r.status, " ", r.body);
  }

  // Whether a node holds a snapshot of the function's current version.
  bool HasSnapshot(const std::string& fn) {
    auto r = cluster_->gateway().Call("GET", "/system/snapshots/" + fn);
    if (r.status != 200) return false;
    json snaps = json::parse(r.body, nullptr, false);
    if (!snaps.is_array()) return false;
    for (const auto& s : snaps)
      if (s.value("current", false) && !s["nodes"].empty()) return true;
    return false;
  }
  bool WaitSnapshot(const std::string& fn) {
    return Eventually([&] { return HasSnapshot(fn); }, kBackground);
  }

  // What to look at when a snapshot does not come: the catalog and the
  // function's logs (the invoker's snapshot errors included).
  std::string Diagnostics(const std::string& fn) {
    return absl::StrCat(
        "snapshots: ",
        cluster_->gateway().Call("GET", "/system/snapshots/" + fn).body,
        "\nlogs:\n", cluster_->Silt({"logs", fn, "--lines", "50"}).out);
  }

  static bool HaveCriu() {
    return RunCommand({"/usr/local/sbin/criu", "--version"}).exit_code == 0;
  }

  static std::string suite_dir_;
  std::string dir_;
  std::unique_ptr<Cluster> cluster_;
};

std::string StateApiTest::suite_dir_;

TEST_F(StateApiTest, PythonUsesMapsVectorsAndQueues) {
  // Maps: keys are percent-decoded path segments, values raw bytes.
  const std::string binary("v\0\xff\n1", 5);
  auto s = Py({Req("PUT", "/state/maps/py-kv/alpha", "1"),
               Req("GET", "/state/maps/py-kv/alpha"),
               Req("HEAD", "/state/maps/py-kv/alpha"),
               Req("PUT", "/state/maps/py-kv/a%20b%2Fc%C3%BC", binary),
               Req("GET", "/state/maps/py-kv/a%20b%2Fc%C3%BC"),
               Req("GET", "/state/maps/py-kv"),
               Req("DELETE", "/state/maps/py-kv/alpha"),
               Req("GET", "/state/maps/py-kv/alpha"),
               Req("HEAD", "/state/maps/py-kv/alpha"),
               Req("DELETE", "/state/maps/py-kv/alpha")});
  EXPECT_EQ(s[0].status, 204);
  EXPECT_EQ(s[1].status, 200);
  EXPECT_EQ(s[1].body, "1");
  EXPECT_EQ(s[2].status, 200);
  EXPECT_EQ(s[3].status, 204);
  EXPECT_EQ(s[4].status, 200);
  EXPECT_EQ(s[4].body, binary);
  EXPECT_EQ(s[5].body, R"({"size":2})");
  EXPECT_EQ(s[6].status, 204);
  EXPECT_EQ(s[7].status, 404);
  EXPECT_EQ(s[7].code, "not found");
  EXPECT_EQ(s[7].body, "map \"py-kv\" has no key \"alpha\"\n");
  EXPECT_EQ(s[8].status, 404);
  EXPECT_EQ(s[9].status, 404);

  // Queues: FIFO; a pop waits up to timeout_ms, then 408.
  s = Py({Req("POST", "/state/queues/py-q", "first"),
          Req("POST", "/state/queues/py-q", "second"),
          Req("GET", "/state/queues/py-q"),
          Req("POST", "/state/queues/py-q/pop"),
          Req("POST", "/state/queues/py-q/pop?timeout_ms=1000"),
          Req("POST", "/state/queues/py-q/pop?timeout_ms=100"),
          Req("GET", "/state/queues/py-q")});
  EXPECT_EQ(s[0].status, 204);
  EXPECT_EQ(s[1].status, 204);
  EXPECT_EQ(s[2].body, R"({"size":2})");
  EXPECT_EQ(s[3].body, "first");
  EXPECT_EQ(s[4].body, "second");
  EXPECT_EQ(s[5].status, 408);
  EXPECT_EQ(s[5].code, "timeout");
  EXPECT_TRUE(absl::StrContains(s[5].body, "stayed empty for 100 ms"))
      << s[5].body;
  EXPECT_EQ(s[6].body, R"({"size":0})");

  // Vectors: push_back answers the index.
  s = Py({Req("POST", "/state/vectors/py-v", "x"),
          Req("POST", "/state/vectors/py-v", "y"),
          Req("GET", "/state/vectors/py-v/1"),
          Req("PUT", "/state/vectors/py-v/1", "Y"),
          Req("GET", "/state/vectors/py-v/1"),
          Req("GET", "/state/vectors/py-v"),
          Req("GET", "/state/vectors/py-v/5"),
          Req("PUT", "/state/vectors/py-v/5", "z")});
  EXPECT_EQ(s[0].body, R"({"index":0})");
  EXPECT_EQ(s[1].body, R"({"index":1})");
  EXPECT_EQ(s[2].body, "y");
  EXPECT_EQ(s[3].status, 204);
  EXPECT_EQ(s[4].body, "Y");
  EXPECT_EQ(s[5].body, R"({"size":2})");
  EXPECT_EQ(s[6].status, 404);
  EXPECT_EQ(s[7].status, 404);

  // Bad input: a clear error, and nothing changes.
  json big = Req("PUT", "/state/maps/py-kv/big");
  big["n"] = 2 << 20;
  s = Py(
      {Req("POST", "/state/vectors/py-kv", "1"),
       Req("POST", "/state/queues/py-v", "1"), Req("GET", "/state/maps/Bad!/k"),
       Req("GET", "/state/maps/py-kv/%zz"),
       Req("GET", "/state/vectors/py-v/first"), big,
       Req("POST", "/state/maps/py-kv"), Req("GET", "/state/sets/x"),
       Raw("garbage\r\n\r\n"),
       Raw("PUT /state/maps/py-kv/k HTTP/1.1\r\nContent-Length: nine\r\n\r\n"),
       Raw("PUT /state/maps/py-kv/k HTTP/1.1\r\n"
           "Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"),
       Req("GET", "/state/maps/py-kv"), Req("GET", "/state/vectors/py-v"),
       Req("GET", "/state/queues/py-q")});
  EXPECT_EQ(s[0].status, 409) << s[0].body;
  EXPECT_EQ(s[0].code, "wrong kind");
  EXPECT_TRUE(absl::StrContains(s[0].body, "is a map, not a vector"))
      << s[0].body;
  EXPECT_EQ(s[1].status, 409) << s[1].body;
  EXPECT_EQ(s[2].status, 400) << s[2].body;
  EXPECT_EQ(s[2].code, "invalid");
  EXPECT_TRUE(absl::StrContains(s[2].body, "[a-z0-9._-]")) << s[2].body;
  EXPECT_EQ(s[3].status, 400) << s[3].body;
  EXPECT_TRUE(absl::StrContains(s[3].body, "percent-encoding")) << s[3].body;
  EXPECT_EQ(s[4].status, 400) << s[4].body;
  EXPECT_EQ(s[5].status, 413) << s[5].body;
  EXPECT_EQ(s[5].code, "too large");
  EXPECT_TRUE(absl::StrContains(s[5].body, "exceeds the limit")) << s[5].body;
  EXPECT_EQ(s[6].status, 405) << s[6].body;
  EXPECT_EQ(s[7].status, 404) << s[7].body;
  EXPECT_EQ(s[8].status, 400) << s[8].body;
  EXPECT_EQ(s[9].status, 400) << s[9].body;
  EXPECT_EQ(s[10].status, 411) << s[10].body;
  EXPECT_EQ(s[11].body, R"({"size":1})");
  EXPECT_EQ(s[12].body, R"({"size":2})");
  EXPECT_EQ(s[13].body, R"({"size":0})");
  EXPECT_EQ(Py1(Req("GET", "/state/maps/py-kv/big")).status, 404);
  // The API still serves after all that.
  EXPECT_EQ(Py1(Req("GET", "/state/vectors/py-v/0")).body, "x");

  // One state for every language: the C++ SDK (probe, on node-b) reads what
  // Python (node-a) wrote and the other way round; an int64_t element is its
  // 8 little-endian bytes.
  EXPECT_EQ(Py1(Req("PUT", "/state/maps/py-kv/plain", "from python")).status,
            204);
  EXPECT_EQ(Probe("/kv/get?name=py-kv&k=plain"), "200 from python");
  EXPECT_EQ(Probe("/kv/put?name=shared&k=from-cpp&v=hello"), "200 ok");
  EXPECT_EQ(Py1(Req("GET", "/state/maps/shared/from-cpp")).body, "hello");
  EXPECT_EQ(Probe("/q/push?name=py-q", "job"), "200 ok");
  EXPECT_EQ(Py1(Req("POST", "/state/queues/py-q/pop?timeout_ms=5000")).body,
            "job");
  EXPECT_EQ(Py1(Req("POST", "/state/vectors/py-nums",
                    std::string("\x2a\0\0\0\0\0\0\0", 8)))
                .body,
            R"({"index":0})");
  EXPECT_EQ(Probe("/vec/get?name=py-nums&i=0"), "200 42");
  EXPECT_EQ(Probe("/vec/push?name=py-nums&v=7"), "200 1");
  EXPECT_EQ(Py1(Req("GET", "/state/vectors/py-nums/1")).body,
            std::string("\x07\0\0\0\0\0\0\0", 8));

  // The gateway lists them, and the shards are on node-b: every request
  // above crossed from node-a.
  auto st = cluster_->gateway().Call("GET", "/system/state/py-kv");
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(json::parse(st.body)["kind"], "map");
  st = cluster_->gateway().Call("GET", "/system/state/py-q");
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(json::parse(st.body)["kind"], "queue");
  auto procs =
      json::parse(cluster_->gateway().Call("GET", "/system/proclets").body);
  int py_shards = 0;
  for (const auto& p : procs) {
    if (!absl::StartsWith(p.value("structure", ""), "py-")) continue;
    ++py_shards;
    EXPECT_EQ(p["node"], "node-b") << p.dump();
  }
  EXPECT_EQ(py_shards, 4) << procs.dump();
}

// A long-running function server (http mode) reaches the API too, and a pop
// waiting there gets what another instance pushes meanwhile.
TEST_F(StateApiTest, HttpModeServerWaitsOnAQueue) {
  auto url = Py1({{"m", "ENV"}}, "statepyhttp");
  EXPECT_TRUE(absl::StartsWith(url.body, "http://127.0.0.1:")) << url.body;
  std::vector<Step> popped;
  std::thread waiter([&] {
    popped = Py({Req("POST", "/state/queues/py-ready", "1"),
                 Req("POST", "/state/queues/py-wait/pop?timeout_ms=20000")},
                "statepyhttp");
  });
  // The marker comes right before the pop: push once it is there.
  EXPECT_TRUE(Eventually(
      [&] {
        return Py1(Req("GET", "/state/queues/py-ready")).body ==
               R"({"size":1})";
      },
      kBackground));
  EXPECT_EQ(Py1(Req("POST", "/state/queues/py-wait", "wake up")).status, 204);
  waiter.join();
  ASSERT_EQ(popped.size(), 2u);
  EXPECT_EQ(popped[1].status, 200) << popped[1].body;
  EXPECT_EQ(popped[1].body, "wake up");
}

// State outlives instances, and each new instance finds the API where its
// SILT_STATE_URL says: after a boot, a restore and a fork (the worker stops
// the API before its checkpoint: an image must hold no socket of it).
TEST_F(StateApiTest, StateSurvivesBootRestoreAndFork) {
  auto s = Py({Req("PUT", "/state/maps/py-kept/k", "v1"),
               Req("POST", "/state/queues/py-kept-q", "a"),
               Req("POST", "/state/queues/py-kept-q", "b"),
               Req("POST", "/state/queues/py-kept-q", "c")});
  for (const auto& step : s) EXPECT_EQ(step.status, 204) << step.body;

  std::string tier;
  s = Py({Req("GET", "/state/maps/py-kept/k"),
          Req("POST", "/state/queues/py-kept-q/pop")},
         "statepy", {{"X-Silt-Cold-Start", "boot"}}, &tier);
  EXPECT_EQ(tier, "boot");
  EXPECT_EQ(s[0].body, "v1");
  EXPECT_EQ(s[1].body, "a");

  if (!HaveCriu()) {
    GTEST_SKIP() << "CRIU 4.1 is not installed (deploy/setup.sh): restore "
                    "and fork not tested";
  }
  ASSERT_TRUE(WaitSnapshot("statepy")) << Diagnostics("statepy");
  s = Py({Req("GET", "/state/maps/py-kept/k"),
          Req("POST", "/state/queues/py-kept-q/pop"),
          Req("PUT", "/state/maps/py-kept/k", "v2")},
         "statepy", {{"X-Silt-Cold-Start", "restore"}}, &tier);
  EXPECT_EQ(tier, "restore");
  EXPECT_EQ(s[0].body, "v1");
  EXPECT_EQ(s[1].body, "b");
  EXPECT_EQ(s[2].status, 204);
  s = Py({Req("GET", "/state/maps/py-kept/k"),
          Req("POST", "/state/queues/py-kept-q/pop")},
         "statepy", {{"X-Silt-Cold-Start", "fork"}}, &tier);
  EXPECT_EQ(tier, "fork");
  EXPECT_EQ(s[0].body, "v2");
  EXPECT_EQ(s[1].body, "c");
  // The instance that was checkpointed after its boot serves on.
  EXPECT_EQ(Py1(Req("GET", "/state/maps/py-kept/k")).body, "v2");

  // Two clones at once share their template's network namespace: the second
  // finds the port taken and listens on another, which its calls are told.
  std::vector<Step> first;
  std::string first_tier;
  std::thread a([&] {
    first = Py({{{"m", "ENV"}},
                Req("POST", "/state/queues/py-fork-ready", "1"),
                Req("POST", "/state/queues/py-fork-go/pop?timeout_ms=20000")},
               "statepy", {{"X-Silt-Cold-Start", "fork"}}, &first_tier);
  });
  EXPECT_TRUE(Eventually(
      [&] {
        return Py1(Req("GET", "/state/queues/py-fork-ready")).body ==
               R"({"size":1})";
      },
      kBackground));
  s = Py({{{"m", "ENV"}}, Req("POST", "/state/queues/py-fork-go", "go")},
         "statepy", {{"X-Silt-Cold-Start", "fork"}}, &tier);
  a.join();
  EXPECT_EQ(tier, "fork");
  EXPECT_EQ(first_tier, "fork");
  EXPECT_EQ(s[1].status, 204) << s[1].body;
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[2].body, "go");
  EXPECT_NE(first[0].body, s[0].body) << "both clones on one port?";
}

// An http-mode server's environment is fixed when it starts, before the
// worker parks for its checkpoint: the worker listens on the same port again
// after resuming, and after a restore.
TEST_F(StateApiTest, HttpModeServerKeepsItsAddressAcrossCheckpoints) {
  if (!HaveCriu()) GTEST_SKIP() << "CRIU 4.1 is not installed: no checkpoints";
  std::string tier;
  auto s = Py({{{"m", "ENV"}}, Req("PUT", "/state/maps/py-kept/h", "1")},
              "statepyhttp");
  std::string url = s[0].body;
  EXPECT_EQ(s[1].status, 204) << s[1].body;
  bool snapshot = false;
  ASSERT_TRUE(Eventually(
      [&] {
        snapshot = HasSnapshot("statepyhttp");
        return snapshot ||
               absl::StrContains(Diagnostics("statepyhttp"), "snapshot failed");
      },
      kBackground))
      << Diagnostics("statepyhttp");
  s = Py({{{"m", "ENV"}}, Req("GET", "/state/maps/py-kept/h")}, "statepyhttp");
  EXPECT_EQ(s[0].body, url);
  EXPECT_EQ(s[1].status, 200) << s[1].body;
  EXPECT_EQ(s[1].body, "1");
  if (!snapshot) {
    // CRIU 4.1 on some kernels cannot dump a listening TCP socket (the
    // function's own HTTP server): the function then always boots, which is
    // what the resume above covered. Nothing to restore.
    EXPECT_TRUE(
        absl::StrContains(Diagnostics("statepyhttp"), "snapshot failed"));
    fprintf(stderr,
            "note: CRIU could not checkpoint the http-mode function here; "
            "restore not exercised: %s\n",
            Diagnostics("statepyhttp").c_str());
    return;
  }
  s = Py({{{"m", "ENV"}},
          Req("GET", "/state/maps/py-kept/h"),
          Req("PUT", "/state/maps/py-kept/h", "2")},
         "statepyhttp", {{"X-Silt-Cold-Start", "restore"}}, &tier);
  EXPECT_EQ(tier, "restore");
  EXPECT_EQ(s[0].body, url);
  EXPECT_EQ(s[1].status, 200) << s[1].body;
  EXPECT_EQ(s[1].body, "1");
  EXPECT_EQ(s[2].status, 204);
  EXPECT_EQ(Py1(Req("GET", "/state/maps/py-kept/h"), "statepyhttp").body, "2");
}

// examples/state-python: a visit counter and a shared work queue.
TEST_F(StateApiTest, PythonExampleCountsVisitsAndWorksTasks) {
  std::string work = dir_ + "/example";
  std::filesystem::copy(std::string(SILT_SOURCE_DIR) + "/examples/state-python",
                        work, std::filesystem::copy_options::recursive);
  auto r = cluster_->Silt({"up", "-f", work + "/stack.yml"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(Invoke("GET", "/function/visits/home").body,
            "home: 1 visit(s), visit #1 overall\n");
  EXPECT_EQ(Invoke("GET", "/function/visits/about").body,
            "about: 1 visit(s), visit #2 overall\n");
  EXPECT_EQ(Invoke("GET", "/function/visits/home").body,
            "home: 2 visit(s), visit #3 overall\n");
  // The counts are ordinary state: the C++ SDK reads them.
  EXPECT_EQ(Probe("/kv/get?name=visits&k=home"), "200 2");

  auto sub = Invoke("POST", "/function/tasks/submit", "paint the fence");
  EXPECT_EQ(sub.status, 202) << sub.body;
  auto w = Invoke("POST", "/function/tasks/work");
  EXPECT_EQ(w.status, 200) << w.body;
  EXPECT_EQ(w.body, "PAINT THE FENCE\n");
  EXPECT_EQ(Invoke("POST", "/function/tasks/work").status, 204);
  auto res = Invoke("GET", "/function/tasks/result?task=paint%20the%20fence");
  EXPECT_EQ(res.status, 200) << res.body;
  EXPECT_EQ(res.body, "PAINT THE FENCE\n");
  EXPECT_EQ(Invoke("GET", "/function/tasks/result?task=nothing").status, 404);
}

}  // namespace
}  // namespace silt::testing
