#include "gpu/devices.h"
#include "gtest/gtest.h"

namespace silt::gpu {
namespace {

TEST(GpuTest, ListsDevicesAndRunsKernelOnEach) {
  auto devices = ListDevices();
  if (DiscoveryBackend() == "host") {
    ASSERT_TRUE(devices.ok());
    EXPECT_TRUE(devices->empty());
    EXPECT_EQ(SelfTest(0).code(), absl::StatusCode::kUnimplemented);
    GTEST_SKIP() << "built without CUDA (nvcc not found at build time)";
  }
  if (absl::IsFailedPrecondition(devices.status())) {
    GTEST_SKIP() << "no usable GPU on this machine: "
                 << devices.status().message();
  }
  ASSERT_TRUE(devices.ok()) << devices.status();
  if (devices->empty()) GTEST_SKIP() << "CUDA driver present but no GPU";
  for (const auto& d : *devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory_bytes, 0u);
    EXPECT_GE(d.compute_major, 3);
    EXPECT_TRUE(SelfTest(d.index).ok()) << d.name;
  }
}

TEST(GpuTest, SelfTestOnMissingDeviceFails) {
  if (DiscoveryBackend() == "host") GTEST_SKIP() << "built without CUDA";
  EXPECT_FALSE(SelfTest(1 << 20).ok());
}

}  // namespace
}  // namespace silt::gpu
