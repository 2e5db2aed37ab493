// Snapshot image directories: sealing, verification, damage detection.
#include <filesystem>
#include <fstream>

#include "common/process.h"
#include "gtest/gtest.h"
#include "snapshot/image.h"

namespace silt::snapshot {
namespace {

class ImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = silt::testing::MakeTempDir("silt-image");
    std::filesystem::create_directories(root_ + "/tmp");
    std::ofstream(root_ + "/tmp/pages-1.img") << std::string(10000, 'p');
    std::ofstream(root_ + "/tmp/core-1.img") << "core";
    Manifest m;
    m.id = "fn-abc";
    m.function = "fn";
    m.ns = "openfaas-fn";
    m.generation = 3;
    m.bundle_digest = "sha256:00";
    m.kernel = KernelRelease();
    ASSERT_TRUE(Seal(root_ + "/tmp", root_ + "/fn-abc", &m).ok());
    dir_ = root_ + "/fn-abc";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string root_, dir_;
};

TEST_F(ImageTest, SealedImageVerifies) {
  EXPECT_FALSE(std::filesystem::exists(root_ + "/tmp"));
  auto m = Verify(dir_, /*full=*/true);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->files.size(), 2u);
  EXPECT_EQ(m->bytes, 10004u);
  EXPECT_EQ(m->generation, 3u);
  EXPECT_TRUE(Verify(dir_).ok());
}

TEST_F(ImageTest, FlippedByteIsCaught) {
  {
    std::fstream f(dir_ + "/pages-1.img",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    f.put('q');
  }
  auto m = Verify(dir_);  // the fast check notices the new mtime
  EXPECT_TRUE(absl::IsDataLoss(m.status())) << m.status();
}

TEST_F(ImageTest, TruncatedOrMissingFileIsCaught) {
  std::filesystem::resize_file(dir_ + "/pages-1.img", 4096);
  EXPECT_TRUE(absl::IsDataLoss(Verify(dir_).status()));
  std::filesystem::remove(dir_ + "/core-1.img");
  EXPECT_TRUE(absl::IsDataLoss(Verify(dir_).status()));
}

TEST_F(ImageTest, BadManifestIsRejected) {
  EXPECT_FALSE(ParseManifest("{").ok());
  EXPECT_FALSE(ParseManifest(R"({"id":"x"})").ok());
  EXPECT_FALSE(
      ParseManifest(
          R"({"id":"x","function":"f","namespace":"n","generation":1,)"
          R"("bundleDigest":"d","files":[{"name":"../etc","size":1,"sha256":"0"}]})")
          .ok());
  std::ofstream(dir_ + "/manifest.json") << "garbage";
  EXPECT_FALSE(Verify(dir_).ok());
}

}  // namespace
}  // namespace silt::snapshot
