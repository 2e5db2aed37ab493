#include "proclets/bundle.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace silt::proclets {
namespace {

BundleManifest Native() {
  BundleManifest m;
  m.kind = "native";
  m.abi = 1;
  m.entry = "handler.so";
  m.name = "hello";
  return m;
}

TEST(Bundle, PackIsReproducibleAndReadsBack) {
  std::vector<BundleFile> files = {{"handler.so", std::string(3000, 'x'), 0755},
                                   {"data/table.txt", "1 2 3\n", 0644}};
  auto a = PackBundle(Native(), files);
  auto b = PackBundle(Native(), {files[1], files[0]});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(Sha256Digest(*a), Sha256Digest(*b));
  EXPECT_TRUE(IsDigest(Sha256Digest(*a)));
  EXPECT_EQ(a->size() % 512, 0u);

  auto m = ReadBundleManifest(*a);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kind, "native");
  EXPECT_EQ(m->entry, "handler.so");
  EXPECT_EQ(m->abi, 1u);

  std::string dir = std::filesystem::temp_directory_path() / "silt-bundle-test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(UnpackBundle(*a, dir).ok());
  std::ifstream in(dir + "/data/table.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "1 2 3\n");
  struct stat st;
  ASSERT_EQ(stat((dir + "/handler.so").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  std::filesystem::remove_all(dir);
}

TEST(Bundle, CorruptionAndTruncationAreDetected) {
  auto a = PackBundle(Native(), {{"handler.so", "abc", 0755}});
  ASSERT_TRUE(a.ok());
  std::string flipped = *a;
  flipped[10] ^= 0x1;  // inside the first header's name
  EXPECT_FALSE(ReadBundle(flipped).ok());
  EXPECT_FALSE(ReadBundle(a->substr(0, 700)).ok());
  EXPECT_FALSE(ReadBundle("").ok());
}

TEST(Bundle, UnsafePathsAreRefused) {
  for (const char* p : {"../evil", "/etc/passwd", "a/../../b", ""}) {
    EXPECT_FALSE(PackBundle(Native(), {{p, "x", 0644}}).ok()) << p;
  }
}

TEST(Bundle, ManifestValidation) {
  EXPECT_FALSE(ParseManifest("{").ok());
  EXPECT_FALSE(ParseManifest(R"({"kind":"docker","entry":"x"})").ok());
  EXPECT_FALSE(
      ParseManifest(R"({"kind":"exec","entry":"x","mode":"weird"})").ok());
  EXPECT_TRUE(ParseManifest(
                  R"({"kind":"exec","entry":"python3 h.py","mode":"classic"})")
                  .ok());
  EXPECT_FALSE(ReadBundleManifest(*PackBundle(Native(), {})).ok() == false);
}

TEST(Bundle, DigestOfImageReferences) {
  std::string d = "sha256:" + std::string(64, 'a');
  EXPECT_EQ(*BundleDigestOf(d), d);
  EXPECT_EQ(*BundleDigestOf("hello:latest@" + d), d);
  EXPECT_TRUE(absl::IsNotFound(BundleDigestOf("hello:latest").status()));
  EXPECT_TRUE(absl::IsNotFound(BundleDigestOf("sha256:abc").status()));
}

}  // namespace
}  // namespace silt::proclets
