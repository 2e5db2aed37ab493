#include "snapshot/criu.h"

#include <unistd.h>

#include <cstdlib>

#include "gtest/gtest.h"

namespace silt::snapshot {
namespace {

TEST(CriuTest, BinaryIsCriu41OrNewer) {
  if (geteuid() != 0) GTEST_SKIP() << "CRIU needs root; run the tests as root";
  auto v = CriuVersion();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_GE(*v, 40100);
}

TEST(CriuTest, MissingBinaryIsAClearError) {
  setenv("SILT_CRIU", "/nonexistent/criu", 1);
  auto v = CriuVersion();
  unsetenv("SILT_CRIU");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("/nonexistent/criu"), std::string::npos)
      << v.status();
}

}  // namespace
}  // namespace silt::snapshot
