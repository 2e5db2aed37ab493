#include "deploy/stack.h"

#include "deploy/http_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::deploy {
namespace {

TEST(Stack, ParsesFaasCliSchema) {
  auto s = ParseStack(R"(
version: 1.0
provider:
  name: openfaas
  gateway: http://127.0.0.1:8080
functions:
  hello:
    lang: cpp
    handler: ./hello
    image: hello:latest
    fprocess: ./handler
    environment:
      A: "1"
    secrets: [s1]
    labels:
      com.openfaas.scale.min: "2"
    limits:
      memory: 64Mi
  other:
    image: other:1
    namespace: dev
)",
                      ".");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->functions.size(), 2u);
  const auto& f = s->functions[0];
  EXPECT_EQ(f.name, "hello");
  EXPECT_EQ(f.environment.at("A"), "1");
  EXPECT_EQ(f.limits.memory, "64Mi");
  auto j = nlohmann::json::parse(DeploymentJson(f));
  EXPECT_EQ(j["service"], "hello");
  EXPECT_EQ(j["envProcess"], "./handler");
  EXPECT_EQ(j["labels"]["com.openfaas.scale.min"], "2");
  EXPECT_EQ(j["limits"]["memory"], "64Mi");
  EXPECT_FALSE(j.contains("requests"));
  EXPECT_TRUE(
      j["annotations"].is_null());  // faas-cli sends null for absent maps
  EXPECT_EQ(s->functions[1].ns, "dev");
}

TEST(Stack, RejectsWrongProviderAndVersion) {
  auto s =
      ParseStack("provider: {name: faas}\nfunctions: {a: {image: x}}\n", ".");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("openfaas"), std::string::npos);
  EXPECT_FALSE(ParseStack("version: 2.0\nprovider: {name: "
                          "openfaas}\nfunctions: {a: {image: x}}",
                          ".")
                   .ok());
  EXPECT_FALSE(ParseStack("provider: {name: openfaas}\n", ".").ok());
  EXPECT_FALSE(
      ParseStack("provider: {name: openfaas}\nfunctions: [", ".").ok());
}

// Found by stack_yml_fuzz: non-UTF-8 bytes made `silt deploy` abort.
TEST(Stack, NonUtf8IsAClearErrorAndDevicesAreNotEnvFiles) {
  std::string latin1 =
      "provider: {name: openfaas}\nfunctions: {a: {image: x, fprocess: "
      "\"caf\xe9\"}}\n";
  auto s = ParseStack(latin1, ".");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not UTF-8 text (byte 67)"),
            std::string::npos)
      << s.status();
  EXPECT_TRUE(ParseStack("provider: {name: openfaas}\nfunctions: {a: {image: "
                         "x, fprocess: \"caf\xc3\xa9\"}}\n",
                         ".")
                  .ok());
  s = ParseStack(
      "provider: {name: openfaas}\nfunctions: {a: {image: x, "
      "environment_file: [/dev/zero]}}\n",
      ".");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not a regular file"), std::string::npos)
      << s.status();
}

TEST(Stack, EnvSubst) {
  auto lookup = [](const std::string& k) -> std::optional<std::string> {
    if (k == "TAG") return "v2";
    return std::nullopt;
  };
  EXPECT_EQ(EnvSubst("img:${TAG}", lookup), "img:v2");
  EXPECT_EQ(EnvSubst("img:${MISSING:-latest}", lookup), "img:latest");
  EXPECT_EQ(EnvSubst("img:${MISSING}", lookup), "img:");
  EXPECT_EQ(EnvSubst("$HOME stays", lookup), "$HOME stays");
}

TEST(GatewayUrl, NormalisedLikeFaasCli) {
  EXPECT_EQ(NormalizeGatewayUrl("127.0.0.1:8080/"), "http://127.0.0.1:8080");
  EXPECT_EQ(NormalizeGatewayUrl("HTTP://Example:8080"), "http://example:8080");
}

}  // namespace
}  // namespace silt::deploy
