// Drives the real silt-gateway over HTTP the way OpenFaaS clients do.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/gateway_process.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;

class GatewayApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("silt-gw");
    ASSERT_FALSE(dir_.empty());
    auto gw = GatewayProcess::Start(dir_);
    ASSERT_TRUE(gw.ok()) << gw.status();
    gw_ = std::make_unique<GatewayProcess>(*std::move(gw));
  }
  void TearDown() override {
    gw_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Restart() {
    ASSERT_EQ(WEXITSTATUS(gw_->Stop(SIGTERM)), 0);
    auto gw = GatewayProcess::Start(dir_);
    ASSERT_TRUE(gw.ok()) << gw.status();
    gw_ = std::make_unique<GatewayProcess>(*std::move(gw));
  }
  deploy::HttpResult Call(const std::string& m, const std::string& path,
                          const std::string& body = "") {
    return gw_->Call(m, path, body);
  }
  void Deploy(const json& d, int want = 200) {
    auto r = Call("POST", "/system/functions", d.dump());
    ASSERT_EQ(r.status, want) << r.body;
  }
  json Status(const std::string& name, const std::string& ns = "") {
    auto r = Call("GET", "/system/function/" + name +
                             (ns.empty() ? "" : "?namespace=" + ns));
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  }
  // A deployable image: a pushed bundle's digest under the given name.
  std::string Img(const std::string& name) {
    if (digest_.empty()) {
      std::string image = gw_->PushTestBundle("test");
      digest_ = image.substr(image.find('@'));
    }
    return name + digest_;
  }
  std::string dir_;
  std::string digest_;
  std::unique_ptr<GatewayProcess> gw_;
};

TEST_F(GatewayApiTest, HealthzAndRootAreOpen) {
  auto r = gw_->Call("GET", "/healthz", "", false);
  EXPECT_EQ(r.status, 200);
  r = gw_->Call("GET", "/", "", false);
  EXPECT_EQ(r.status, 307);
  EXPECT_EQ(r.Header("Location"), "/ui/");
  r = gw_->Call("GET", "/nope", "", false);
  EXPECT_EQ(r.status, 404);
}

TEST_F(GatewayApiTest, BasicAuthOnSystemRoutes) {
  auto r = gw_->Call("GET", "/system/functions", "", false);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.body, "invalid credentials\n");
  EXPECT_EQ(r.Header("WWW-Authenticate"), "Basic realm=\"Restricted\"");
  r = gw_->Call("GET", "/system/info", "", false,
                {{"Authorization", "Basic YWRtaW46d3Jvbmc="}});  // admin:wrong
  EXPECT_EQ(r.status, 401);
  r = Call("GET", "/system/functions");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "[]");
  EXPECT_EQ(r.Header("Content-Type"), "application/json");
  // Credentials are 0600 files, generated on first start.
  auto perms = std::filesystem::status(dir_ + "/secrets/basic-auth-password")
                   .permissions();
  EXPECT_EQ(
      perms & std::filesystem::perms::all,
      std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_EQ(gw_->password().size(), 32u);
}

TEST_F(GatewayApiTest, NoAuthFlagOpensSystemRoutes) {
  std::string dir = MakeTempDir("silt-gw-noauth");
  auto gw = GatewayProcess::Start(dir, {"--no-auth"});
  ASSERT_TRUE(gw.ok()) << gw.status();
  EXPECT_EQ(gw->Call("GET", "/system/functions", "", false).status, 200);
  EXPECT_FALSE(std::filesystem::exists(dir + "/secrets/basic-auth-password"));
  gw->Stop(SIGTERM);
  std::filesystem::remove_all(dir);
}

TEST_F(GatewayApiTest, InfoReportsSilt) {
  auto r = Call("GET", "/system/info");
  ASSERT_EQ(r.status, 200);
  json j = json::parse(r.body);
  EXPECT_EQ(j["provider"]["provider"], "silt");
  EXPECT_EQ(j["provider"]["orchestration"], "silt");
  EXPECT_FALSE(j["provider"]["version"]["release"].get<std::string>().empty());
  EXPECT_FALSE(j["version"]["sha"].get<std::string>().empty());
  EXPECT_EQ(j["arch"], "x86_64");
  EXPECT_EQ(Call("POST", "/system/info").status, 405);
}

// Behind the OpenFaaS gateway (functions_provider_url): the provider
// listener speaks the faas-provider contract, the gateway listener keeps the
// gateway's shape and Silt's own routes.
TEST(GatewayProviderTest, ProviderListenerSpeaksTheFaasProviderContract) {
  std::string dir = MakeTempDir("silt-gw-provider");
  auto gw = GatewayProcess::Start(dir, {"--provider-listen", "127.0.0.1:0"});
  ASSERT_TRUE(gw.ok()) << gw.status();
  ASSERT_FALSE(gw->provider_url().empty());
  auto provider = [&](const std::string& m, const std::string& path,
                      const std::string& body = "", bool auth = true) {
    deploy::HttpCall c;
    c.method = m;
    c.url = gw->provider_url() + path;
    c.body = body;
    if (auth) c.headers.emplace_back("Authorization", gw->auth_header());
    auto r = deploy::Send(c);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : deploy::HttpResult{};
  };
  // /system/info: flat on the provider, nested on the gateway.
  auto r = provider("GET", "/system/info");
  ASSERT_EQ(r.status, 200) << r.body;
  json info = json::parse(r.body);
  EXPECT_EQ(info["provider"], "silt");
  EXPECT_EQ(info["orchestration"], "silt");
  EXPECT_FALSE(info["version"]["release"].get<std::string>().empty());
  EXPECT_FALSE(info.contains("arch"));
  info = json::parse(gw->Call("GET", "/system/info").body);
  EXPECT_EQ(info["provider"]["provider"], "silt");
  // Auth as on the gateway; /healthz, /metrics and /function/ are open.
  EXPECT_EQ(provider("GET", "/system/functions", "", false).status, 401);
  EXPECT_EQ(provider("GET", "/healthz", "", false).status, 200);
  r = provider("GET", "/metrics", "", false);
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(absl::StrContains(r.body, "gateway_")) << r.body.substr(0, 200);
  // The function routes work through it.
  std::string image = gw->PushTestBundle("test");
  r = provider("POST", "/system/functions",
               json{{"service", "via-provider"}, {"image", image}}.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  r = provider("GET", "/system/functions");
  EXPECT_TRUE(absl::StrContains(r.body, "via-provider")) << r.body;
  r = provider("GET", "/system/function/via-provider");
  EXPECT_EQ(r.status, 200) << r.body;
  // Silt's own routes are not the provider's, and say where they are; the
  // OpenFaaS gateway queues async calls itself.
  r = provider("GET", "/system/nodes");
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(absl::StrContains(r.body, "--listen")) << r.body;
  EXPECT_EQ(provider("POST", "/async-function/via-provider", "x").status, 404);
  EXPECT_EQ(gw->Call("GET", "/system/nodes").status, 200);
  // The CLI says which URL its Silt commands need.
  auto cli = RunCommand(
      {SILT_CLI_BIN, "image", "list", "--gateway", gw->provider_url()});
  EXPECT_NE(cli.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(cli.err, "--listen address")) << cli.err;
  r = provider("DELETE", "/system/functions",
               json{{"functionName", "via-provider"}}.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  std::filesystem::remove_all(dir);
}

TEST_F(GatewayApiTest, DeployEchoesExactlyWhatWasDeployed) {
  json d = {{"service", "hello"},
            {"image", Img("ghcr.io/example/hello:0.1")},
            {"envProcess", "./handler"},
            {"envVars", {{"A", "1"}, {"B", "x=y"}}},
            {"labels", {{"team", "core"}}},
            {"annotations", nullptr},
            {"limits", {{"memory", "128M"}, {"cpu", "500m"}}},
            {"constraints", {"node=a"}},
            {"network", "legacy-field"}};
  Deploy(d);
  json s = Status("hello");
  EXPECT_EQ(s["name"], "hello");
  EXPECT_EQ(s["image"], Img("ghcr.io/example/hello:0.1"));
  EXPECT_EQ(s["namespace"], "openfaas-fn");
  EXPECT_EQ(s["envProcess"], "./handler");
  EXPECT_EQ(s["envVars"], json({{"A", "1"}, {"B", "x=y"}}));
  EXPECT_EQ(s["labels"], json({{"team", "core"}, {"faas_function", "hello"}}));
  EXPECT_EQ(s["annotations"], json::object());  // always an object in status
  EXPECT_EQ(s["limits"], json({{"memory", "128M"}, {"cpu", "500m"}}));
  EXPECT_EQ(s["constraints"], json({"node=a"}));
  EXPECT_EQ(s["replicas"], 1);
  EXPECT_FALSE(s.contains("availableReplicas"));  // omitempty: no instances yet
  EXPECT_FALSE(s.contains("secrets"));
  EXPECT_FALSE(s.contains("requests"));
  EXPECT_TRUE(s["createdAt"].get<std::string>().ends_with("Z"));

  auto list = json::parse(Call("GET", "/system/functions").body);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["name"], "hello");
}

TEST_F(GatewayApiTest, UpdateReplacesSpecAndUnknownUpdateIs404) {
  Deploy(
      {{"service", "fn"}, {"image", Img("img:1")}, {"envVars", {{"A", "1"}}}});
  json created = Status("fn");
  auto r = Call("PUT", "/system/functions",
                json({{"service", "fn"}, {"image", Img("img:2")}}).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json s = Status("fn");
  EXPECT_EQ(s["image"], Img("img:2"));
  EXPECT_FALSE(s.contains("envVars"));
  EXPECT_EQ(s["createdAt"], created["createdAt"]);

  r = Call("PUT", "/system/functions",
           json({{"service", "ghost"}, {"image", Img("x")}}).dump());
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, "function: ghost.openfaas-fn not found\n");
  r = Call("POST", "/system/functions",
           json({{"service", "fn"}, {"image", Img("x")}}).dump());
  EXPECT_EQ(r.status, 409);
  EXPECT_TRUE(absl::StrContains(r.body, "already exists")) << r.body;
}

TEST_F(GatewayApiTest, DeployErrors) {
  struct Case {
    std::string body;
    int status;
    std::string message;
  } cases[] = {
      {"", 400, "expected a body"},
      {"{bad json", 400, "invalid JSON"},
      {R"({"service":"x","image":5})", 400, "image"},
      {R"({"image":"x"})", 400, "service is required"},
      {R"({"service":"fn"})", 400, "image is required"},
      {R"({"service":"../etc","image":"x"})", 400,
       "directory traversal found in name"},
      {R"({"service":"a/b","image":"x"})", 400,
       "directory traversal found in name"},
      {R"({"service":"Bad_Name","image":"x"})", 400, "invalid function name"},
      {R"({"service":"fn","image":"x","namespace":"nope"})", 400,
       "namespace not valid"},
      {R"({"service":"fn","image":"x","secrets":["missing"]})", 400,
       "unable to find secret: missing"},
      {R"({"service":"fn","image":"x","limits":{"memory":"lots"}})", 400,
       "limits.memory"},
      {R"({"service":"fn","image":"x","labels":{"com.openfaas.scale.min":"two"}})",
       400, "com.openfaas.scale.min"},
  };
  std::string unknown = "sha256:" + std::string(64, 'b');
  for (const auto& c :
       {Case{R"({"service":"fn","image":"docker.io/library/nginx:1"})", 400,
             "is neither a Silt bundle nor an imported image"},
        Case{R"({"service":"fn","image":"fn@)" + unknown + R"("})", 400,
             "is not in this gateway's bundle store"}}) {
    auto r = Call("POST", "/system/functions", c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r.body;
    EXPECT_TRUE(absl::StrContains(r.body, c.message))
        << c.body << " -> " << r.body;
  }
  for (const auto& c : cases) {
    auto r = Call("POST", "/system/functions", c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r.body;
    EXPECT_TRUE(absl::StrContains(r.body, c.message))
        << c.body << " -> " << r.body;
    EXPECT_EQ(r.Header("Content-Type"), "text/plain; charset=utf-8");
  }
  // Nothing was stored by any of them.
  EXPECT_EQ(Call("GET", "/system/functions").body, "[]");
  EXPECT_EQ(Call("PATCH", "/system/functions").status, 405);
}

TEST_F(GatewayApiTest, BundlesAreContentAddressedAndVerified) {
  std::string image = gw_->PushTestBundle("b1");
  std::string digest = image.substr(image.find('@') + 1);
  auto list = json::parse(Call("GET", "/system/bundles").body);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["digest"], digest);
  EXPECT_EQ(list[0]["kind"], "exec");
  // Pushing the same bytes again is a no-op (200, not 201).
  gw_->PushTestBundle("b1");
  EXPECT_EQ(json::parse(Call("GET", "/system/bundles").body).size(), 1u);

  auto r = Call("POST", "/system/bundles?digest=sha256:" + std::string(64, 'c'),
                "garbage");
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(absl::StrContains(r.body, "digest mismatch")) << r.body;
  r = Call("POST", "/system/bundles", "garbage");
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(absl::StrContains(r.body, "not a Silt bundle")) << r.body;
  r = Call("POST", "/system/bundles?digest=md5:abc", "garbage");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(gw_->Call("POST", "/system/bundles", "x", false).status, 401);
  EXPECT_EQ(json::parse(Call("GET", "/system/bundles").body).size(), 1u);
}

TEST_F(GatewayApiTest, DeleteFunction) {
  Deploy({{"service", "fn"}, {"image", Img("img")}});
  auto r = Call("DELETE", "/system/functions", R"({"functionName":"fn"})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Call("GET", "/system/function/fn").status, 404);
  EXPECT_EQ(Call("GET", "/system/function/fn").body, "");
  r = Call("DELETE", "/system/functions", R"({"functionName":"fn"})");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, "function fn.openfaas-fn not found\n");
  EXPECT_EQ(Call("DELETE", "/system/functions", "").status, 400);
  EXPECT_EQ(Call("DELETE", "/system/functions", "[").status, 400);
}

TEST_F(GatewayApiTest, NamespacesFromBodyThenQueryThenDefault) {
  auto r = Call(
      "POST", "/system/namespace/",
      R"({"name":"dev","labels":{"openfaas":"1"},"annotations":{"openfaas":"1"}})");
  ASSERT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(json::parse(Call("GET", "/system/namespaces").body),
            json({"openfaas-fn", "dev"}));
  Deploy({{"service", "fn"}, {"image", Img("img-dev")}, {"namespace", "dev"}});
  Deploy({{"service", "fn"}, {"image", Img("img-default")}});
  EXPECT_EQ(Status("fn", "dev")["image"], Img("img-dev"));
  EXPECT_EQ(Status("fn")["image"], Img("img-default"));
  EXPECT_EQ(
      json::parse(Call("GET", "/system/functions?namespace=dev").body).size(),
      1u);
  EXPECT_EQ(Call("GET", "/system/functions?namespace=nope").status, 400);

  // Old clients send the namespace of DELETE and scale only in the query.
  r = Call("DELETE", "/system/functions?namespace=dev",
           R"({"functionName":"fn"})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Call("GET", "/system/function/fn?namespace=dev").status, 404);
  EXPECT_EQ(Status("fn")["image"], Img("img-default"));
}

TEST_F(GatewayApiTest, NamespaceLifecycle) {
  auto r = Call("POST", "/system/namespace/",
                R"({"name":"dev","labels":{"team":"x"}})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, "request does not have openfaas=1 label\n");
  r = Call("POST", "/system/namespace/",
           R"({"name":"Bad!","labels":{"openfaas":"1"}})");
  EXPECT_EQ(r.status, 400);
  ASSERT_EQ(Call("POST", "/system/namespace/",
                 R"({"name":"dev","labels":{"openfaas":"1"}})")
                .status,
            201);
  EXPECT_EQ(Call("POST", "/system/namespace/",
                 R"({"name":"dev","labels":{"openfaas":"1"}})")
                .status,
            409);
  r = Call("GET", "/system/namespace/dev");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["labels"]["openfaas"], "1");
  r = Call("PUT", "/system/namespace/dev",
           R"({"name":"dev","labels":{"openfaas":"1","x":"y"}})");
  EXPECT_EQ(r.status, 202) << r.body;
  EXPECT_EQ(
      json::parse(Call("GET", "/system/namespace/dev").body)["labels"]["x"],
      "y");
  EXPECT_EQ(Call("PUT", "/system/namespace/dev",
                 R"({"name":"other","labels":{"openfaas":"1"}})")
                .status,
            400);
  EXPECT_EQ(Call("GET", "/system/namespace/ghost").status, 404);

  // A namespace with functions is not removed (that would lose them).
  Deploy({{"service", "fn"}, {"image", Img("img")}, {"namespace", "dev"}});
  r = Call("DELETE", "/system/namespace/dev");
  EXPECT_EQ(r.status, 409);
  EXPECT_TRUE(absl::StrContains(r.body, "1 function(s)")) << r.body;
  ASSERT_EQ(Call("DELETE", "/system/functions",
                 R"({"functionName":"fn","namespace":"dev"})")
                .status,
            200);
  EXPECT_EQ(Call("DELETE", "/system/namespace/dev").status, 202);
  EXPECT_EQ(Call("DELETE", "/system/namespace/dev").status, 404);
  EXPECT_EQ(Call("DELETE", "/system/namespace/openfaas-fn").status, 400);
}

TEST_F(GatewayApiTest, SecretsNeverReturnValues) {
  auto r = Call("POST", "/system/secrets",
                R"({"name":"db-pass","value":"hunter2"})");
  ASSERT_EQ(r.status, 201) << r.body;
  r = Call("POST", "/system/secrets", R"({"name":"bin","rawValue":"AAEC"})");
  ASSERT_EQ(r.status, 201) << r.body;
  r = Call("GET", "/system/secrets");
  ASSERT_EQ(r.status, 200);
  EXPECT_FALSE(absl::StrContains(r.body, "hunter2"));
  EXPECT_EQ(json::parse(r.body),
            json::parse(R"([{"name":"bin","namespace":"openfaas-fn"},
                                                   {"name":"db-pass","namespace":"openfaas-fn"}])"));
  EXPECT_EQ(Call("POST", "/system/secrets", R"({"name":"db-pass","value":"x"})")
                .status,
            409);
  EXPECT_EQ(
      Call("PUT", "/system/secrets", R"({"name":"db-pass","value":"new"})")
          .status,
      200);
  EXPECT_EQ(Call("PUT", "/system/secrets", R"({"name":"ghost","value":"new"})")
                .status,
            404);

  // Deploy referencing the secret now works.
  Deploy({{"service", "fn"}, {"image", Img("img")}, {"secrets", {"db-pass"}}});
  EXPECT_EQ(Status("fn")["secrets"], json({"db-pass"}));

  struct Case {
    std::string method, body;
    int status;
    std::string message;
  } cases[] = {
      {"POST", R"({"value":"x"})", 400, "non-empty name is required"},
      {"POST", R"({"name":"../x","value":"x"})", 400,
       "directory traversal found in name"},
      {"POST", R"({"name":"a/b","value":"x"})", 400,
       "directory traversal found in name"},
      {"POST", "{", 400, "invalid JSON"},
      {"POST", R"({"name":"x","namespace":"nope","value":"x"})", 400,
       "namespace not valid"},
      {"DELETE", R"({"name":"ghost"})", 404, "secret ghost not found"},
  };
  for (const auto& c : cases) {
    r = Call(c.method, "/system/secrets", c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r.body;
    EXPECT_TRUE(absl::StrContains(r.body, c.message))
        << c.body << " -> " << r.body;
  }
  EXPECT_EQ(Call("DELETE", "/system/secrets", R"({"name":"bin"})").status, 200);
  EXPECT_EQ(json::parse(Call("GET", "/system/secrets").body).size(), 1u);
}

// Every field of every JSON body, given a value of each wrong type: a clear
// 4xx naming what to fix, never a 5xx or a dead gateway.
TEST_F(GatewayApiTest, WrongTypedFieldsAreClearErrorsNotCrashes) {
  Deploy({{"service", "fn"}, {"image", Img("img")}});
  ASSERT_EQ(
      Call("POST", "/system/secrets", R"({"name":"s","value":"v"})").status,
      201);
  struct Route {
    std::string method, path;
    json base;
    std::vector<std::string> fields;
  } routes[] = {
      {"POST",
       "/system/functions",
       {{"service", "fn2"}, {"image", Img("img")}},
       {"service", "image", "namespace", "envProcess", "envVars", "constraints",
        "secrets", "labels", "annotations", "limits", "requests",
        "readOnlyRootFilesystem"}},
      {"PUT",
       "/system/functions",
       {{"service", "fn"}, {"image", Img("img")}},
       {"service", "image", "namespace", "envVars", "labels", "limits"}},
      {"DELETE",
       "/system/functions",
       {{"functionName", "ghost"}},
       {"functionName", "namespace"}},
      {"POST",
       "/system/scale-function/fn",
       {{"serviceName", "fn"}, {"replicas", 1}},
       {"serviceName", "namespace", "replicas"}},
      {"POST",
       "/system/secrets",
       {{"name", "s2"}, {"value", "v"}},
       {"name", "namespace", "value", "rawValue"}},
      {"PUT",
       "/system/secrets",
       {{"name", "s"}, {"value", "v"}},
       {"name", "namespace", "value", "rawValue"}},
      {"DELETE", "/system/secrets", {{"name", "ghost"}}, {"name", "namespace"}},
      {"POST",
       "/system/namespace/team",
       {{"name", "team"}},
       {"name", "labels", "annotations"}},
      {"POST", "/system/proclets/1/migrate", {{"node", "a"}}, {"node"}},
  };
  const json wrong[] = {1,
                        -1.5,
                        true,
                        json::array(),
                        json::object(),
                        json::array({1, "x"}),
                        json::object({{"k", 1}}),
                        json::object({{"memory", json::array()}}),
                        "not-what-you-meant",
                        ""};
  int sent = 0;
  for (const auto& route : routes) {
    for (const auto& field : route.fields) {
      for (const auto& value : wrong) {
        json body = route.base;
        body[field] = value;
        auto r = Call(route.method, route.path, body.dump());
        ++sent;
        ASSERT_GT(r.status, 0) << route.method << " " << route.path << " "
                               << body.dump() << ": the gateway is gone";
        EXPECT_LT(r.status, 500) << route.method << " " << route.path << " "
                                 << body.dump() << " -> " << r.body;
        if (r.status >= 400) {
          EXPECT_FALSE(r.body.empty())
              << route.method << " " << route.path << " " << body.dump();
        }
      }
    }
  }
  // The body itself of the wrong type.
  for (const auto& route : routes) {
    for (const char* body : {"[]", "1", "\"x\"", "null", "{\"a\":"}) {
      auto r = Call(route.method, route.path, body);
      EXPECT_GE(r.status, 400) << route.method << " " << route.path << " "
                               << body << " -> " << r.body;
      EXPECT_LT(r.status, 500) << route.method << " " << route.path << " "
                               << body << " -> " << r.body;
    }
  }
  EXPECT_GT(sent, 300);
  EXPECT_EQ(gw_->Call("GET", "/healthz", "", false).status, 200);
  EXPECT_EQ(Status("fn")["name"], "fn");
  auto r = Call("DELETE", "/system/functions", R"({"functionName":5})");
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(absl::StrContains(r.body, "functionName")) << r.body;
}

TEST_F(GatewayApiTest, ScaleStoresReplicasIncludingZero) {
  Deploy(
      {{"service", "fn"},
       {"image", Img("img")},
       {"labels",
        {{"com.openfaas.scale.min", "2"}, {"com.openfaas.scale.max", "4"}}}});
  EXPECT_EQ(Status("fn")["replicas"], 2);
  auto r = Call("POST", "/system/scale-function/fn",
                R"({"serviceName":"fn","replicas":3})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Status("fn")["replicas"], 3);
  r = Call("POST", "/system/scale-function/fn",
           R"({"serviceName":"fn","replicas":0})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(Status("fn").contains("replicas"));  // 0, omitted as Go does
  Call("POST", "/system/scale-function/fn",
       R"({"serviceName":"fn","replicas":99})");
  EXPECT_EQ(Status("fn")["replicas"], 4);  // clamped to com.openfaas.scale.max

  EXPECT_EQ(Call("POST", "/system/scale-function/ghost",
                 R"({"serviceName":"ghost","replicas":1})")
                .status,
            404);
  r = Call("POST", "/system/scale-function/fn", "");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, "Error reading request body\n");
  r = Call("POST", "/system/scale-function/fn", "{");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, "Error unmarshalling request body\n");
  EXPECT_EQ(
      Call("POST", "/system/scale-function/fn", R"({"replicas":-1})").status,
      400);
  EXPECT_EQ(Call("GET", "/system/scale-function/fn").status, 405);
}

TEST_F(GatewayApiTest, LogsValidateTheirQuery) {
  Deploy({{"service", "fn"}, {"image", Img("img")}});
  auto r =
      Call("GET", "/system/logs?name=fn&tail=5&since=2024-05-01T10:00:00Z");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("Content-Type"), "application/x-ndjson");
  EXPECT_EQ(Call("GET", "/system/logs?name=fn&tail=abc").status, 422);
  EXPECT_EQ(Call("GET", "/system/logs?name=fn&since=yesterday").status, 422);
  EXPECT_EQ(Call("GET", "/system/logs?name=ghost").status, 404);
  EXPECT_EQ(Call("GET", "/system/logs").status, 400);
}

TEST_F(GatewayApiTest, InvokeRoutesBeforeInvokersExist) {
  auto r = gw_->Call("POST", "/function/ghost", "hi", false);
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body,
            "error finding function ghost.openfaas-fn: server returned non-200 "
            "status code "
            "(404) for function, ghost, body: \n");
  EXPECT_FALSE(r.Header("X-Call-Id").empty());
  uint64_t start = 0;
  EXPECT_TRUE(absl::SimpleAtoi(r.Header("X-Start-Time"), &start));
  EXPECT_GT(start, 1600000000000000000u);  // nanoseconds
  EXPECT_EQ(gw_->Call("GET", "/function/.openfaas-fn", "", false).status, 404);
  EXPECT_EQ(gw_->Call("GET", "/function/ghost.nope/a/b?x=1", "", false).status,
            404);

  Deploy({{"service", "fn"}, {"image", Img("img")}});
  r = gw_->Call("GET", "/function/fn.openfaas-fn/sub/path?q=1", "", false,
                {{"X-Call-Id", "my-call"}});
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "No endpoints available for: fn.\n");
  EXPECT_EQ(r.Header("X-Call-Id"), "");  // client-sent call ids are not echoed
  EXPECT_EQ(gw_->Call("TRACE", "/function/fn", "", false).status, 405);
  EXPECT_EQ(gw_->Call("GET", "/async-function/fn", "", false).status, 405);
  EXPECT_EQ(gw_->Call("POST", "/async-function/ghost", "", false).status, 404);

  // The attempt shows in the invocation metrics and in the function's status.
  r = deploy::Send({.url = gw_->metrics_url() + "/metrics"}).value();
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(absl::StrContains(r.body,
                                "gateway_function_invocation_total{code="
                                "\"503\",function_name=\"fn.openfaas-fn\"} 1"))
      << r.body;
  EXPECT_TRUE(absl::StrContains(
      r.body, "gateway_service_count{function_name=\"fn.openfaas-fn\"} 1"));
  EXPECT_EQ(Status("fn")["invocationCount"], 1);
}

TEST_F(GatewayApiTest, OversizedBodyIs413AndLosesNothing) {
  Deploy({{"service", "fn"}, {"image", Img("img")}});
  std::string big(11 << 20, 'x');
  auto r = Call("PUT", "/system/functions", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_TRUE(absl::StrContains(r.body, "too large")) << r.body;
  EXPECT_EQ(Status("fn")["image"], Img("img"));
  EXPECT_EQ(Call("GET", "/system/functions").status,
            200);  // gateway still serves
}

// Connects a raw socket to the gateway.
int Connect(const std::string& url) {
  std::string hostport = url.substr(7);
  size_t colon = hostport.rfind(':');
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port =
      htons(static_cast<uint16_t>(std::stoi(hostport.substr(colon + 1))));
  inet_pton(AF_INET, hostport.substr(0, colon).c_str(), &a.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

std::string ReadToClose(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0)
    out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST_F(GatewayApiTest, MalformedHttpClosesOnlyThatConnection) {
  int bad = Connect(gw_->url());
  std::string garbage = "THIS IS NOT HTTP\r\n\r\n";
  ASSERT_EQ(write(bad, garbage.data(), garbage.size()),
            static_cast<ssize_t>(garbage.size()));
  std::string answer = ReadToClose(bad);  // returns because the server closes
  close(bad);
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 400")) << answer;
  EXPECT_EQ(Call("GET", "/system/functions").status, 200);
}

bool WriteAll(int fd, const std::string& s) {
  return write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size());
}

// Reads one response whose body is framed by Content-Length (the head's
// headers come back lower-cased in `head`); "" when the connection closed.
std::string ReadResponse(int fd, std::string* head) {
  std::string in;
  char buf[4096];
  size_t end;
  while ((end = in.find("\r\n\r\n")) == std::string::npos) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return "";
    in.append(buf, static_cast<size_t>(n));
  }
  *head = absl::AsciiStrToLower(in.substr(0, end + 2));
  size_t at = head->find("content-length: ");
  size_t len = 0;
  if (at == std::string::npos ||
      !absl::SimpleAtoi(head->substr(at + 16, head->find("\r\n", at) - at - 16),
                        &len))
    return "";
  std::string body = in.substr(end + 4);
  while (body.size() < len) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    body.append(buf, static_cast<size_t>(n));
  }
  return body;
}

// What a response says of its connection and its length, as HTTP/1.0 and
// 1.1 clients expect: kept alive by default on 1.1 and only when asked on
// 1.0, closed when asked, and HEAD with the GET's length and no body.
TEST_F(GatewayApiTest, ResponsesFrameTheirConnectionAsTheClientAsked) {
  const std::string get = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  int fd = Connect(gw_->url());
  std::string head;
  for (int i = 0; i < 2; ++i) {  // two on one connection
    ASSERT_TRUE(WriteAll(fd, get));
    EXPECT_EQ(ReadResponse(fd, &head), "OK\n");
    EXPECT_TRUE(absl::StartsWith(head, "http/1.1 200 ok\r\n")) << head;
    EXPECT_FALSE(absl::StrContains(head, "connection:")) << head;
  }
  const std::string head_req = "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(WriteAll(fd, head_req));
  ASSERT_TRUE(WriteAll(fd, get));  // right behind it
  // HEAD: the GET's length, no body (what follows is the next response).
  std::string in;
  char buf[4096];
  while (!absl::StrContains(in, "\r\n\r\nOK")) {
    ssize_t n = read(fd, buf, sizeof(buf));
    ASSERT_GT(n, 0) << in;
    in.append(buf, static_cast<size_t>(n));
  }
  EXPECT_TRUE(absl::StartsWith(in, "HTTP/1.1 200 OK\r\n")) << in;
  EXPECT_TRUE(absl::StrContains(in, "Content-Length: 3\r\n\r\nHTTP/1.1 200"))
      << in;
  const std::string close_req =
      "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_TRUE(WriteAll(fd, close_req));
  EXPECT_EQ(ReadResponse(fd, &head), "OK\n");
  EXPECT_TRUE(absl::StrContains(head, "connection: close\r\n")) << head;
  EXPECT_EQ(ReadToClose(fd), "");
  close(fd);

  fd = Connect(gw_->url());  // HTTP/1.0: kept only when asked
  const std::string keep =
      "GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
  ASSERT_TRUE(WriteAll(fd, keep));
  EXPECT_EQ(ReadResponse(fd, &head), "OK\n");
  EXPECT_TRUE(absl::StartsWith(head, "http/1.0 200 ok\r\n")) << head;
  EXPECT_TRUE(absl::StrContains(head, "connection: keep-alive\r\n")) << head;
  const std::string once = "GET /nope HTTP/1.0\r\n\r\n";
  ASSERT_TRUE(WriteAll(fd, once));
  EXPECT_FALSE(ReadResponse(fd, &head).empty());
  EXPECT_TRUE(absl::StartsWith(head, "http/1.0 404 not found\r\n")) << head;
  EXPECT_FALSE(absl::StrContains(head, "connection:")) << head;
  EXPECT_EQ(ReadToClose(fd), "");
  close(fd);
}

TEST_F(GatewayApiTest, SlowClientIsCutOffByReadTimeout) {
  std::string dir = MakeTempDir("silt-gw-slow");
  auto gw = GatewayProcess::Start(dir, {"--no-auth", "--read-timeout", "1"});
  ASSERT_TRUE(gw.ok()) << gw.status();
  int fd = Connect(gw->url());
  std::string partial =
      "GET /system/functions HTTP/1.1\r\nHost: x\r\n";  // never finished
  ASSERT_EQ(write(fd, partial.data(), partial.size()),
            static_cast<ssize_t>(partial.size()));
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ReadToClose(fd), "");  // the server closes the connection
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  close(fd);
  EXPECT_EQ(gw->Call("GET", "/system/functions", "", false).status, 200);
  gw->Stop(SIGTERM);
  std::filesystem::remove_all(dir);
}

TEST_F(GatewayApiTest, EverythingSurvivesRestart) {
  ASSERT_EQ(Call("POST", "/system/namespace/",
                 R"({"name":"dev","labels":{"openfaas":"1"}})")
                .status,
            201);
  ASSERT_EQ(Call("POST", "/system/secrets",
                 R"({"name":"s","value":"v","namespace":"dev"})")
                .status,
            201);
  Deploy({{"service", "fn"},
          {"image", Img("img")},
          {"namespace", "dev"},
          {"secrets", {"s"}}});
  Call("POST", "/system/scale-function/fn",
       R"({"serviceName":"fn","replicas":3,"namespace":"dev"})");
  std::string password = gw_->password();
  json before = Status("fn", "dev");

  Restart();
  EXPECT_EQ(gw_->password(), password);  // credentials are kept
  EXPECT_EQ(Status("fn", "dev"), before);
  EXPECT_EQ(json::parse(Call("GET", "/system/namespaces").body),
            json({"openfaas-fn", "dev"}));
  EXPECT_EQ(
      json::parse(Call("GET", "/system/secrets?namespace=dev").body).size(),
      1u);
}

TEST_F(GatewayApiTest, CrashLosesNoAcknowledgedWrite) {
  for (int i = 0; i < 20; ++i) {
    Deploy({{"service", "fn" + std::to_string(i)}, {"image", Img("img")}});
  }
  gw_->Stop(SIGKILL);
  auto gw = GatewayProcess::Start(dir_);
  ASSERT_TRUE(gw.ok()) << gw.status();
  gw_ = std::make_unique<GatewayProcess>(*std::move(gw));
  EXPECT_EQ(json::parse(Call("GET", "/system/functions").body).size(), 20u);
}

TEST_F(GatewayApiTest, SecondGatewayOnSameDataDirFailsClearly) {
  auto other = RunCommand({SILT_GATEWAY_BIN, "--listen", "127.0.0.1:0",
                           "--metrics-listen", "127.0.0.1:0", "--grpc-listen",
                           "127.0.0.1:0", "--data-dir", dir_});
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(other.err, "another process")) << other.err;
}

TEST_F(GatewayApiTest, SecondGatewayOnSameInvokerPortFailsClearly) {
  // gRPC would share the port (SO_REUSEPORT) and split the invokers between
  // the two gateways; the gateway turns that off.
  std::string other_dir = MakeTempDir("silt-gw-other");
  auto other = RunCommand({SILT_GATEWAY_BIN, "--listen", "127.0.0.1:0",
                           "--metrics-listen", "127.0.0.1:0", "--grpc-listen",
                           gw_->grpc_address(), "--data-dir", other_dir});
  std::filesystem::remove_all(other_dir);
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(other.err, "cannot listen for invokers"))
      << other.err;
}

}  // namespace
}  // namespace silt::testing
