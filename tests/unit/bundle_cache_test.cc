// The invoker's bundle cache over a real directory: fetched once however many
// ask at once, checked against its digest, kept across a restart.
#include "bundle_cache.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proclets/bundle.h"

namespace silt::invoker {
namespace {

proclets::BundleManifest Exec() {
  proclets::BundleManifest m;
  m.kind = "exec";
  m.entry = "cat";
  m.mode = "classic";
  m.name = "cat";
  return m;
}

class BundleCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/bundle-cache-", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto tar = proclets::PackBundle(Exec(), {{"run.sh", "echo hi\n", 0755}});
    ASSERT_TRUE(tar.ok()) << tar.status();
    tar_ = *tar;
    digest_ = proclets::Sha256Digest(tar_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A cache whose fetches answer `tar` and are counted in fetches_.
  BundleCache Cache(std::string tar) {
    return BundleCache(dir_, [this, tar](const std::string&) {
      ++fetches_;
      return absl::StatusOr<std::string>(tar);
    });
  }

  std::string dir_, tar_, digest_;
  std::atomic<int> fetches_{0};
};

TEST_F(BundleCacheTest, ManyAskingAtOnceFetchOnce) {
  BundleCache cache = Cache(tar_);
  std::vector<std::thread> askers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    askers.emplace_back([&] {
      auto b = cache.Ensure(digest_);
      if (b.ok() && (*b)->manifest.entry == "cat") ++ok;
    });
  for (auto& t : askers) t.join();
  EXPECT_EQ(ok, 8);
  EXPECT_EQ(fetches_, 1);
  auto b = cache.Ensure(digest_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(std::filesystem::exists((*b)->dir + "/run.sh"));
  // A restarted invoker finds it unpacked: no fetch.
  BundleCache again = Cache(tar_);
  ASSERT_TRUE(again.Ensure(digest_).ok());
  EXPECT_EQ(fetches_, 1);
}

TEST_F(BundleCacheTest, WhatDoesNotMatchItsDigestIsRefusedAndNotKept) {
  BundleCache cache = Cache(tar_ + "tampered");
  auto b = cache.Ensure(digest_);
  EXPECT_TRUE(absl::IsDataLoss(b.status())) << b.status();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/" + digest_.substr(7)));
  // Nothing was kept: the next ask fetches again.
  EXPECT_FALSE(cache.Ensure(digest_).ok());
  EXPECT_EQ(fetches_, 2);
}

TEST_F(BundleCacheTest, AFetchThatFailsSaysWhy) {
  BundleCache cache(dir_,
                    [](const std::string&) -> absl::StatusOr<std::string> {
                      return absl::UnavailableError("the gateway is away");
                    });
  auto b = cache.Ensure(digest_);
  EXPECT_TRUE(absl::IsUnavailable(b.status())) << b.status();
}

TEST_F(BundleCacheTest, ADigestThatIsNoDigestIsRefusedWithoutAFetch) {
  BundleCache cache = Cache(tar_);
  for (const char* bad :
       {"sha256:../../etc", "md5:abc", "",
        "sha256:../"
        "00000000000000000000000000000000000000000000000000000000000"}) {
    auto b = cache.Ensure(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(b.status()))
        << bad << ": " << b.status();
  }
  EXPECT_EQ(fetches_, 0);
}

}  // namespace
}  // namespace silt::invoker
