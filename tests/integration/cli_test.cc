// Drives the `silt` CLI against a real silt-gateway, as a user at a shell
// would.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/gateway_process.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("silt-cli");
    auto gw = GatewayProcess::Start(dir_ + "/data");
    ASSERT_TRUE(gw.ok()) << gw.status();
    gw_ = std::make_unique<GatewayProcess>(*std::move(gw));
  }
  void TearDown() override {
    gw_.reset();
    std::filesystem::remove_all(dir_);
  }
  RunResult Silt(std::vector<std::string> args, const std::string& input = "") {
    args.insert(args.begin(), SILT_CLI_BIN);
    return RunCommand(
        args, input,
        {{"OPENFAAS_CONFIG", dir_ + "/config"}, {"OPENFAAS_URL", gw_->url()}});
  }
  void Login() {
    auto r = Silt({"login", "--password-stdin"}, gw_->password() + "\n");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
  std::unique_ptr<GatewayProcess> gw_;
};

TEST_F(CliTest, LoginSavesFaasCliConfig) {
  auto r = Silt({"list"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "unauthorized")) << r.err;

  r = Silt({"login", "-u", "admin", "--password-stdin"}, "wrong\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "incorrect")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/config/config.yml"));

  Login();
  std::ifstream in(dir_ + "/config/config.yml");
  std::string config((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
  EXPECT_TRUE(absl::StrContains(config, "gateway: " + gw_->url())) << config;
  EXPECT_TRUE(absl::StrContains(config, "auth: basic")) << config;
  EXPECT_EQ(Silt({"list"}).exit_code, 0);

  r = Silt({"logout"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Silt({"list"}).exit_code, 1);
}

TEST_F(CliTest, DeployListDescribeRemoveFromStackFile) {
  Login();
  WriteFile("env.yml",
            "environment:\n  FROM_FILE: \"yes\"\n  OVERRIDDEN: file\n");
  std::filesystem::create_directories(dir_ + "/hello");
  std::filesystem::create_directories(dir_ + "/echo");
  WriteFile("hello/handler.sh", "#!/bin/sh\necho hello\n");
  WriteFile("echo/README", "echo\n");
  std::string stack = WriteFile("stack.yml", R"(version: 1.0
provider:
  name: openfaas
  gateway: http://127.0.0.1:8080
functions:
  hello:
    lang: exec
    handler: ./hello
    image: hello:${TAG:-latest}
    fprocess: sh handler.sh
    environment_file: [env.yml]
    environment:
      OVERRIDDEN: inline
    labels:
      com.openfaas.scale.min: "2"
    limits:
      memory: 64Mi
  echo:
    lang: exec
    handler: ./echo
    image: echo:1
    fprocess: cat
)");
  // Deploying before anything is built or pushed fails clearly.
  auto r = Silt({"deploy", "-f", stack});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(
      r.err, "is neither a Silt bundle nor an imported image"))
      << r.err;
  r = Silt({"build", "-f", stack});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "Built hello: sha256:")) << r.out;
  r = Silt({"deploy", "-f", stack});
  EXPECT_EQ(r.exit_code, 1);  // built but not pushed
  EXPECT_TRUE(absl::StrContains(r.err, "push it first")) << r.err;
  r = Silt({"push", "-f", stack});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = Silt({"deploy", "-f", stack});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "Deploying: hello.")) << r.out;
  EXPECT_TRUE(
      absl::StrContains(r.out, "URL: " + gw_->url() + "/function/hello"))
      << r.out;

  auto s = json::parse(gw_->Call("GET", "/system/function/hello").body);
  EXPECT_TRUE(
      absl::StartsWith(s["image"].get<std::string>(), "hello:latest@sha256:"))
      << s;
  EXPECT_EQ(s["envProcess"], "sh handler.sh");
  EXPECT_EQ(s["envVars"],
            json({{"FROM_FILE", "yes"}, {"OVERRIDDEN", "inline"}}));
  EXPECT_EQ(s["limits"]["memory"], "64Mi");
  EXPECT_EQ(s["replicas"], 2);

  // A second deploy updates in place (PUT) rather than failing.
  r = Silt({"deploy", "-f", stack, "--filter", "echo", "-e", "X=1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(json::parse(
                gw_->Call("GET", "/system/function/echo").body)["envVars"]["X"],
            "1");

  r = Silt({"list"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "Function")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "hello")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "echo")) << r.out;
  r = Silt({"list", "-v"});
  EXPECT_TRUE(absl::StrContains(r.out, "hello:latest@sha256:")) << r.out;
  r = Silt({"list", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(json::parse(r.out).size(), 2u);

  r = Silt({"describe", "hello"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "Status:           Not Ready")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "Replicas:         2")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "com.openfaas.scale.min: 2")) << r.out;
  r = Silt({"describe", "ghost"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "No such function: ghost")) << r.err;

  r = Silt({"remove", "echo"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(gw_->Call("GET", "/system/function/echo").status, 404);
  r = Silt({"remove", "echo"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "No existing function to remove"))
      << r.err;
  r = Silt({"rm", "-f", stack});  // hello is removed, echo is already gone
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(gw_->Call("GET", "/system/function/hello").status, 404);
}

TEST_F(CliTest, DeployErrorsAreClear) {
  Login();
  auto r = Silt({"deploy", "-f", dir_ + "/missing.yml"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "missing.yml")) << r.err;
  std::string bad = WriteFile(
      "bad.yml", "provider:\n  name: faas\nfunctions:\n  a:\n    image: x\n");
  r = Silt({"deploy", "-f", bad});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "provider.name")) << r.err;
  r = Silt({"deploy", "--image", "x", "--name", "Bad_Name"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "invalid function name")) << r.err;
  r = Silt({"deploy", "--image", "x", "--name", "ok", "--secret", "nope"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "unable to find secret: nope")) << r.err;
}

TEST_F(CliTest, Secrets) {
  Login();
  auto r = Silt({"secret", "create", "api-key"}, "s3cret\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Silt({"secret", "create", "token", "--from-literal", "abc"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Silt({"secret", "create", "token", "--from-literal", "abc"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "already exists")) << r.err;
  r = Silt({"secret", "create", "token", "--from-literal", "new", "--replace"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string file = WriteFile("value.txt", "from-file");
  r = Silt({"secret", "update", "token", "--from-file", file});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Silt({"secret", "list"});
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "api-key")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "token")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "s3cret")) << r.out;
  EXPECT_EQ(Silt({"secret", "remove", "token"}).exit_code, 0);
  r = Silt({"secret", "remove", "token"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "unable to find secret: token"))
      << r.err;
  r = Silt({"secret", "create", "empty"}, "");
  EXPECT_EQ(r.exit_code, 1);
}

TEST_F(CliTest, Namespaces) {
  Login();
  auto r = Silt({"namespace", "create", "dev"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Silt({"namespace", "list"});
  EXPECT_TRUE(absl::StrContains(r.out, " - openfaas-fn")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, " - dev")) << r.out;
  r = Silt({"deploy", "--image", gw_->PushTestBundle("img"), "--name", "fn",
            "-n", "dev"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "/function/fn.dev")) << r.out;
  r = Silt({"namespace", "remove", "dev"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "remove them first")) << r.err;
  EXPECT_EQ(Silt({"remove", "fn", "-n", "dev"}).exit_code, 0);
  EXPECT_EQ(Silt({"namespace", "remove", "dev"}).exit_code, 0);
}

TEST_F(CliTest, VersionShowsGatewayAndProvider) {
  Login();
  auto r = Silt({"version"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "name:          silt")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "uri:     " + gw_->url())) << r.out;
}

TEST_F(CliTest, HelpOnEveryCommandAndUnreachableGateway) {
  for (auto cmd :
       std::vector<std::vector<std::string>>{{"--help"},
                                             {"login", "--help"},
                                             {"list", "--help"},
                                             {"describe", "--help"},
                                             {"remove", "--help"},
                                             {"deploy", "--help"},
                                             {"secret", "create", "--help"},
                                             {"namespace", "list", "--help"},
                                             {"version", "--help"}}) {
    auto r = Silt(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd[0];
    EXPECT_TRUE(absl::StrContains(r.out, "Usage")) << cmd[0] << ": " << r.out;
  }
  auto r = Silt({"frobnicate"});
  EXPECT_NE(r.exit_code, 0);
  r = Silt({"list", "-g", "http://127.0.0.1:1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(
      r.err, "Cannot connect to OpenFaaS on URL: http://127.0.0.1:1"))
      << r.err;
}

TEST_F(CliTest, UnknownCommandsNameTheWordAndSuggestTheNearest) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (
      const Case& c : std::vector<Case>{
          {{"lsit"}, R"(silt: unknown command "lsit"; did you mean "list"?)"},
          {{"nodez"},
           R"(silt: unknown command "nodez"; did you mean "nodes"?)"},
          {{"secrets", "list"},
           R"(silt: unknown command "secrets"; did you mean "secret"?)"},
          {{"secret", "lst"},
           R"(silt secret: unknown command "lst"; did you mean "list"?)"},
          {{"node", "drian", "n1"},
           R"(silt node: unknown command "drian"; did you mean "drain"?)"},
          {{"namespace", "-g", "http://127.0.0.1:1", "crate", "dev"},
           R"(silt namespace: unknown command "crate"; did you mean "create"?)"},
          {{"frobnicate"},
           R"(silt: unknown command "frobnicate"; run "silt --help")"},
          // --help after an unknown word is an error, not the help.
          {{"lsit", "--help"}, R"(unknown command "lsit")"},
          {{"secret", "lst", "--help"}, R"(unknown command "lst")"},
          {{"list", "--bogus", "--help"},
           R"(silt list: unexpected argument "--bogus")"},
      }) {
    std::string cmd = absl::StrJoin(c.args, " ");
    auto r = Silt(c.args);
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, c.message)) << cmd << ": " << r.err;
    EXPECT_FALSE(absl::StrContains(r.out, "Usage")) << cmd << ": " << r.out;
  }
}

// A port free right now on 127.0.0.1.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

// Two `silt local` side by side: each with its own --listen port (before the
// --grpc-listen and --metrics-listen flags both took the fixed :8081 and
// :8082), one with an explicit metrics port, one with the defaults (port 0).
TEST_F(CliTest, TwoLocalsOnOneMachine) {
  if (geteuid() != 0) GTEST_SKIP() << "the invoker needs root";
  std::string metrics = absl::StrCat("127.0.0.1:", FreePort());
  std::vector<std::vector<std::string>> extra = {{"--metrics-listen", metrics},
                                                 {}};
  std::vector<Process> locals;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> args = {
        SILT_CLI_BIN, "local",
        "--data-dir", absl::StrCat(dir_, "/local", i),
        "--listen",   absl::StrCat("127.0.0.1:", FreePort()),
        "--no-auth"};
    args.insert(args.end(), extra[i].begin(), extra[i].end());
    auto p = Process::Start(args);
    ASSERT_TRUE(p.ok()) << p.status();
    locals.push_back(*std::move(p));
  }
  RunResult r =
      Silt({"new", "hi", "--lang", "exec", "-f", dir_ + "/stack.yml"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int i = 0; i < 2; ++i) {
    auto m = locals[i].WaitForLine("metrics on ", std::chrono::seconds(60));
    ASSERT_TRUE(m.ok()) << m.status() << locals[i].output();
    std::string metrics_url = "http://" + m->substr(11);
    if (i == 0) {
      EXPECT_EQ(metrics_url, "http://" + metrics);
    }
    auto l = locals[i].WaitForLine("listening on ", std::chrono::seconds(60));
    ASSERT_TRUE(l.ok()) << l.status() << locals[i].output();
    std::string url = "http://" + l->substr(13);
    for (const std::string& base : {url, metrics_url}) {
      auto h = deploy::Send({.url = base + "/healthz"});
      ASSERT_TRUE(h.ok()) << base << ": " << h.status();
      EXPECT_EQ(h->status, 200) << base;
    }
    r = Silt({"up", "-f", dir_ + "/stack.yml", "-g", url});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    r = Silt({"invoke", "hi", "-g", url}, absl::StrCat("local ", i));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, absl::StrCat("Hello from hi: local ", i, "\n"));
  }
  for (Process& p : locals) {
    int status = p.Stop(SIGTERM);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
}

}  // namespace
}  // namespace silt::testing
