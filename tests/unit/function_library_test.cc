#include "proclets/function_library.h"

#include <filesystem>
#include <fstream>
#include <vector>

#include "gtest/gtest.h"

namespace silt::proclets {
namespace {

TEST(FunctionLibrary, LoadsInitsAndHandles) {
  auto lib = FunctionLibrary::Load(TEST_FN_OK);
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_TRUE((*lib)->has_init());
  EXPECT_TRUE((*lib)->has_after_restore());
  CallContext ctx{.function_name = "fn", .function_namespace = "openfaas-fn"};
  std::string secrets =
      std::filesystem::temp_directory_path() / "silt-fl-secrets";
  std::filesystem::create_directories(secrets);
  std::ofstream(secrets + "/token") << "t0k";
  ctx.secrets_dir = secrets;
  ASSERT_TRUE((*lib)->Init(ctx).ok());

  ctx.call_id = "call-1";
  FunctionCall call{.method = "POST",
                    .path = "/a/b",
                    .query = "x=1",
                    .headers = {{"X-Input", "in"}},
                    .body = "world"};
  auto res = (*lib)->Handle(ctx, call);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->status, 201);
  EXPECT_EQ(res->body, "hello from fn: world");
  auto header = [&](const std::string& k) {
    for (const auto& [n, v] : res->headers)
      if (n == k) return v;
    return std::string("<missing>");
  };
  EXPECT_EQ(header("Content-Type"), "text/plain; charset=utf-8");
  EXPECT_EQ(header("X-Path"), "/a/b");
  EXPECT_EQ(header("X-Query"), "x=1");
  EXPECT_EQ(header("X-Echo"), "in");
  EXPECT_EQ(header("X-Call"), "call-1");
  EXPECT_EQ(header("X-Restores"), "0");
  EXPECT_EQ(header("X-Secret"), "t0k");

  (*lib)->AfterRestore(ctx);
  res = (*lib)->Handle(ctx, call);
  ASSERT_TRUE(res.ok());
  std::filesystem::remove_all(secrets);
}

TEST(FunctionLibrary, AHandlerStreamsItsResponseInParts) {
  auto lib = FunctionLibrary::Load(TEST_FN_OK);
  ASSERT_TRUE(lib.ok());
  std::vector<FunctionResult> parts;
  auto res = (*lib)->Handle({.function_name = "fn"}, {.path = "/stream"},
                            [&](const FunctionResult& so_far) {
                              parts.push_back(so_far);
                              return true;
                            });
  ASSERT_TRUE(res.ok()) << res.status();
  // The head (status and headers, no body), then each write as it came; the
  // returned Response's body is what is left, its status and headers unused.
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_FALSE(parts[0].streamed);
  EXPECT_EQ(parts[0].status, 202);
  ASSERT_EQ(parts[0].headers.size(), 1u);
  EXPECT_EQ(parts[0].headers[0].second, "text/event-stream");
  EXPECT_EQ(parts[0].body, "");
  EXPECT_TRUE(parts[1].streamed);
  EXPECT_EQ(parts[1].body, "one;");
  EXPECT_EQ(parts[2].body, "two;");
  EXPECT_TRUE(res->streamed);
  EXPECT_EQ(res->status, 202);
  EXPECT_EQ(res->body, "three");
  // Without a sink, a handler cannot stream: BeginResponse says so.
  res = (*lib)->Handle({.function_name = "fn"}, {.path = "/stream"});
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->status, 500);
  EXPECT_EQ(res->body, "no streaming here");
}

TEST(FunctionLibrary, HandlerExceptionIsAnError) {
  auto lib = FunctionLibrary::Load(TEST_FN_OK);
  ASSERT_TRUE(lib.ok());
  auto res = (*lib)->Handle({.function_name = "fn"}, {.path = "/throw"});
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(res.status().message().find("asked to throw"), std::string::npos)
      << res.status();
}

TEST(FunctionLibrary, RefusesOtherAbiVersion) {
  auto lib = FunctionLibrary::Load(TEST_FN_WRONG_ABI);
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(lib.status().message().find("ABI version 99"), std::string::npos)
      << lib.status();
  EXPECT_NE(lib.status().message().find("rebuild"), std::string::npos)
      << lib.status();
}

TEST(FunctionLibrary, FailingInitReportsWhy) {
  auto lib = FunctionLibrary::Load(TEST_FN_FAILING_INIT);
  ASSERT_TRUE(lib.ok()) << lib.status();
  auto s = (*lib)->Init({.function_name = "fn"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model file missing"), std::string::npos) << s;
}

TEST(FunctionLibrary, NotASharedObject) {
  auto lib = FunctionLibrary::Load("/etc/hostname");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace silt::proclets
