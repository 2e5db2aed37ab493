// GPU proclets end to end: examples/gpu built with `silt up` (its kernels to
// PTX and a host library), called over HTTP; the proclet's device state
// outlives calls, each function gets its own, and its memory limit holds.
// On a node without a GPU the proclets run on the host backend.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "common/cluster.h"
#include "gtest/gtest.h"

namespace silt::testing {
namespace {

class GpuProcletsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "instances and GPU proclets run in namespaces and "
                      "cgroups: run as root";
    dir_ = MakeTempDir("silt-gpu");
    auto c = Cluster::Start(dir_);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    ASSERT_TRUE(cluster_->AddNode({.name = "node-a"}).ok());
    ASSERT_TRUE(cluster_->WaitNodes(1).ok());
    work_ = dir_ + "/example";
    std::filesystem::copy(std::string(SILT_SOURCE_DIR) + "/examples/gpu", work_,
                          std::filesystem::copy_options::recursive);
  }
  void TearDown() override {
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  deploy::HttpResult Invoke(const std::string& path) {
    return cluster_->gateway().Call("POST", path, "", /*with_auth=*/false);
  }

  std::string dir_, work_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(GpuProcletsTest, TheExampleRunsItsKernelsAndKeepsDeviceState) {
  auto r = cluster_->Silt({"up", "-f", work_ + "/stack.yml"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto first = Invoke("/function/saxpy?n=100000&a=3");
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_TRUE(absl::StartsWith(first.body, "ok n=100000 wrong=0 calls=1 "))
      << first.body;
  EXPECT_TRUE(absl::StrContains(first.body, " backend=host ") ||
              absl::StrContains(first.body, " backend=cuda "))
      << first.body;
  // The counter lives in the proclet's device memory, not in an instance.
  auto second = Invoke("/function/saxpy?n=4097&a=5");
  ASSERT_EQ(second.status, 200) << second.body;
  EXPECT_TRUE(absl::StartsWith(second.body, "ok n=4097 wrong=0 calls=2 "))
      << second.body;

  // Another function of the same code has a proclet (and a process, uid,
  // cgroup) of its own: its counter starts at 1.
  {
    std::ofstream(work_ + "/stack.yml", std::ios::app)
        << "  saxpy-small:\n    lang: cpp\n    handler: ./saxpy\n"
        << "    image: saxpy-small:latest\n    labels:\n"
        << "      com.silt.gpu.max-memory: 1Mi\n";
  }
  r = cluster_->Silt({"up", "-f", work_ + "/stack.yml"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto other = Invoke("/function/saxpy-small?n=1000&a=2");
  ASSERT_EQ(other.status, 200) << other.body;
  EXPECT_TRUE(absl::StartsWith(other.body, "ok n=1000 wrong=0 calls=1 "))
      << other.body;
  // Its 1 MiB of device memory does not hold two 800 kB buffers.
  auto over = Invoke("/function/saxpy-small?n=200000&a=2");
  EXPECT_EQ(over.status, 500) << over.body;
  EXPECT_TRUE(absl::StrContains(over.body, "limit")) << over.body;
  auto third = Invoke("/function/saxpy?n=10&a=1");
  EXPECT_TRUE(absl::StartsWith(third.body, "ok n=10 wrong=0 calls=3 "))
      << third.body;
}

TEST_F(GpuProcletsTest, ABadGpuLabelIsRefusedAtDeploy) {
  std::ofstream(work_ + "/stack.yml", std::ios::trunc)
      << "version: 1.0\nprovider:\n  name: openfaas\nfunctions:\n"
      << "  saxpy:\n    lang: cpp\n    handler: ./saxpy\n"
      << "    image: saxpy:latest\n    labels:\n"
      << "      com.silt.gpu.max-memory: lots\n";
  auto r = cluster_->Silt({"up", "-f", work_ + "/stack.yml"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.out + r.err, "com.silt.gpu.max-memory"))
      << r.out << r.err;
}

}  // namespace
}  // namespace silt::testing
