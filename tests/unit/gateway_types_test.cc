#include "api.h"
#include "auth.h"
#include "gtest/gtest.h"
#include "openfaas_types.h"

namespace silt::gateway {
namespace {

TEST(OpenFaasTypes, ParsesDeploymentWithGoSemantics) {
  auto d = ParseFunctionDeployment(R"({
    "service":"fn","image":"img:1","namespace":"dev","envProcess":"cat",
    "envVars":{"A":"1"},"secrets":["s"],"labels":null,"annotations":{"x":"y"},
    "limits":{"memory":"128Mi"},"unknownField":42,"network":"func_functions"})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->service, "fn");
  EXPECT_EQ(d->ns, "dev");
  EXPECT_FALSE(d->labels.has_value());
  ASSERT_TRUE(d->annotations.has_value());
  EXPECT_EQ(d->limits->memory, "128Mi");
}

TEST(OpenFaasTypes, WrongTypeNamesTheField) {
  auto d = ParseFunctionDeployment(R"({"service":"fn","image":7})");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("image"), std::string::npos);
  EXPECT_FALSE(ParseFunctionDeployment("{not json").ok());
  EXPECT_FALSE(ParseFunctionDeployment("[1,2]").ok());
}

TEST(OpenFaasTypes, StatusJsonFollowsOmitempty) {
  FunctionDeployment d;
  d.service = "fn";
  d.image = "img";
  d.ns = "openfaas-fn";
  auto j = ToStatusJson(d, {.created_at_unix_nanos = 1700000000500000000});
  EXPECT_EQ(j.dump(),
            R"({"name":"fn","image":"img","namespace":"openfaas-fn",)"
            R"("labels":{"faas_function":"fn"},)"
            R"("annotations":{},"createdAt":"2023-11-14T22:13:20.5Z"})");
  // The stored form keeps "not given" distinct from "empty".
  EXPECT_EQ(ToJson(d).dump(),
            R"({"service":"fn","image":"img","namespace":"openfaas-fn"})");
}

TEST(OpenFaasTypes, Rfc3339) {
  EXPECT_EQ(FormatRfc3339Nano(0), "0001-01-01T00:00:00Z");
  EXPECT_EQ(FormatRfc3339Nano(1000000000), "1970-01-01T00:00:01Z");
  EXPECT_EQ(FormatRfc3339Nano(1000000123), "1970-01-01T00:00:01.000000123Z");
  auto t = ParseRfc3339("2024-05-01T10:00:00.123Z");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t % 1000000000, 123000000);
  EXPECT_FALSE(ParseRfc3339("yesterday").ok());
}

TEST(OpenFaasTypes, SecretRawValueIsBase64) {
  auto s = ParseSecret(R"({"name":"s","rawValue":"AAEC"})");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->value, std::string("\x00\x01\x02", 3));
  EXPECT_FALSE(ParseSecret(R"({"name":"s","rawValue":"!!!"})").ok());
}

TEST(Names, FunctionNamesAreDnsLabels) {
  EXPECT_TRUE(ValidateName("function", "hello-world2").ok());
  for (const char* bad : {"", "Hello", "-a", "a-", "a_b", "a.b", "a/b"}) {
    EXPECT_FALSE(ValidateName("function", bad).ok()) << bad;
  }
  EXPECT_FALSE(ValidateName("function", std::string(64, 'a')).ok());
}

TEST(Auth, BasicAuthComparesUserAndPassword) {
  Credentials c{.user = "admin", .password = "s3cret"};
  EXPECT_TRUE(CheckBasicAuth(c, "Basic YWRtaW46czNjcmV0"));   // admin:s3cret
  EXPECT_FALSE(CheckBasicAuth(c, "Basic YWRtaW46czNjcmV1"));  // admin:s3creu
  EXPECT_FALSE(CheckBasicAuth(c, "Basic YWRtaW46"));          // admin:
  EXPECT_FALSE(CheckBasicAuth(c, "Bearer abc"));
  EXPECT_FALSE(CheckBasicAuth(c, ""));
}

TEST(StatusMapping, CodesBecomeHttpStatuses) {
  EXPECT_EQ(HttpStatusFor(absl::InvalidArgumentError("x")), 400);
  EXPECT_EQ(HttpStatusFor(absl::NotFoundError("x")), 404);
  EXPECT_EQ(HttpStatusFor(absl::AlreadyExistsError("x")), 409);
  EXPECT_EQ(HttpStatusFor(absl::UnavailableError("x")), 503);
  EXPECT_EQ(HttpStatusFor(absl::DataLossError("x")), 500);
}

}  // namespace
}  // namespace silt::gateway
