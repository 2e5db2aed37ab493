// Secret values at rest: sealed in the store's files, opened only by
// GetSecret, and refused cleanly under a wrong key or when altered.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "store/secrets_key.h"
#include "store/store.h"

namespace silt::store {
namespace {

// Distinct strings that compress badly, so a table file keeps them verbatim
// when they are stored in the clear.
constexpr char kValue[] = "hunter2-Vq8xZ3-correct-horse-battery-staple";
constexpr char kControl[] = "plain-Jk4wR7-not-a-secret-bundle-manifest";

std::string Key(char c) { return std::string(kSecretsKeyBytes, c); }

// Every byte of every file under `dir`, concatenated.
std::string ReadTree(const std::string& dir) {
  std::string all;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    all += ss.str();
  }
  return all;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class SecretsAtRestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/silt-secrets-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& key,
                                              const std::string& db = "db") {
    return Store::Open({.path = dir_ + "/" + db, .secrets_key = key});
  }
  static void Put(Store& store, const SecretRecord& r) {
    WriteBatch b;
    b.PutSecret(r);
    ASSERT_TRUE(store.Write(b).ok());
  }
  static void PutRaw(Store& store, Table t, absl::string_view key,
                     absl::string_view value) {
    WriteBatch b;
    b.Put(t, key, value);
    ASSERT_TRUE(store.Write(b).ok());
  }
  void WriteFile(const std::string& path, const std::string& bytes,
                 mode_t mode) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
  }

  std::string dir_;
};

TEST_F(SecretsAtRestTest, ValueIsNeverOnDiskInTheClear) {
  {
    auto store = Open(Key('a'));
    ASSERT_TRUE(store.ok()) << store.status();
    Put(**store, {"openfaas-fn", "api-key", kValue});
    PutRaw(**store, Table::kBundles, "sha256:00", kControl);
    // Only the write-ahead log holds them so far.
    std::string raw = ReadTree(dir_ + "/db");
    EXPECT_TRUE(Contains(raw, kControl)) << "the test reads the wrong files";
    EXPECT_FALSE(Contains(raw, kValue));
    auto s = (*store)->GetSecret("openfaas-fn", "api-key");
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->value, kValue);
  }
  // Reopening flushes the log into table files.
  auto store = Open(Key('a'));
  ASSERT_TRUE(store.ok()) << store.status();
  std::string raw = ReadTree(dir_ + "/db");
  EXPECT_TRUE(Contains(raw, kControl));
  EXPECT_FALSE(Contains(raw, kValue));
  auto s = (*store)->GetSecret("openfaas-fn", "api-key");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->value, kValue);
  EXPECT_EQ(s->ns, "openfaas-fn");
  EXPECT_EQ(s->name, "api-key");
}

TEST_F(SecretsAtRestTest, RecordIsVersionNonceCiphertextTag) {
  auto store = Open(Key('a'));
  ASSERT_TRUE(store.ok()) << store.status();
  Put(**store, {"openfaas-fn", "a", kValue});
  Put(**store, {"openfaas-fn", "b", kValue});
  auto a = (*store)->Get(Table::kSecrets, NamespacedKey("openfaas-fn", "a"));
  auto b = (*store)->Get(Table::kSecrets, NamespacedKey("openfaas-fn", "b"));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 1 + 12 + sizeof(kValue) - 1 + 16);
  EXPECT_EQ((*a)[0], '\x01');
  // A fresh nonce per value: the same value seals differently.
  EXPECT_NE(a->substr(1, 12), b->substr(1, 12));
  EXPECT_NE(*a, *b);
}

TEST_F(SecretsAtRestTest, EmptyAndBinaryValuesRoundTrip) {
  auto store = Open(Key('a'));
  ASSERT_TRUE(store.ok()) << store.status();
  std::string binary("\0\x01\xff\n", 4);
  Put(**store, {"dev", "empty", ""});
  Put(**store, {"dev", "binary", binary});
  EXPECT_EQ((*store)->GetSecret("dev", "empty")->value, "");
  EXPECT_EQ((*store)->GetSecret("dev", "binary")->value, binary);
}

TEST_F(SecretsAtRestTest, ListingReturnsNamesButNoValues) {
  auto store = Open(Key('a'));
  ASSERT_TRUE(store.ok()) << store.status();
  Put(**store, {"dev", "one", kValue});
  Put(**store, {"dev", "two", kValue});
  Put(**store, {"devx", "three", kValue});
  auto list = (*store)->ListSecrets("dev");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].name, "one");
  EXPECT_EQ((*list)[1].name, "two");
  for (const auto& r : *list) {
    EXPECT_EQ(r.ns, "dev");
    EXPECT_TRUE(r.value.empty()) << r.name;
  }
  EXPECT_EQ((*store)->ListSecrets("")->size(), 3u);
}

TEST_F(SecretsAtRestTest, WrongKeyIsRefusedAtOpen) {
  {
    auto store = Open(Key('a'));
    ASSERT_TRUE(store.ok()) << store.status();
    Put(**store, {"openfaas-fn", "api-key", kValue});
  }
  auto wrong = Open(Key('b'));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(wrong.status().message()), "another key"))
      << wrong.status();
  auto right = Open(Key('a'));
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ((*right)->GetSecret("openfaas-fn", "api-key")->value, kValue);
}

TEST_F(SecretsAtRestTest, KeyOfTheWrongSizeIsInvalid) {
  EXPECT_EQ(Open("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Open(std::string(31, 'a')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A sealed record carried into a store with another key does not open there.
TEST_F(SecretsAtRestTest, RecordSealedUnderAnotherKeyIsDataLoss) {
  auto a = Open(Key('a'), "a");
  auto b = Open(Key('b'), "b");
  ASSERT_TRUE(a.ok() && b.ok());
  Put(**a, {"openfaas-fn", "api-key", kValue});
  std::string key = NamespacedKey("openfaas-fn", "api-key");
  auto row = (*a)->Get(Table::kSecrets, key);
  ASSERT_TRUE(row.ok());
  PutRaw(**b, Table::kSecrets, key, *row);
  auto s = (*b)->GetSecret("openfaas-fn", "api-key");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status();
  EXPECT_TRUE(Contains(std::string(s.status().message()), "api-key"));
}

TEST_F(SecretsAtRestTest, TamperedRecordIsDataLoss) {
  auto store = Open(Key('a'));
  ASSERT_TRUE(store.ok()) << store.status();
  Put(**store, {"openfaas-fn", "api-key", kValue});
  std::string key = NamespacedKey("openfaas-fn", "api-key");
  const std::string sealed = *(*store)->Get(Table::kSecrets, key);
  auto flip = [&](size_t i) {
    std::string t = sealed;
    t[i] ^= 0x01;
    return t;
  };
  struct Case {
    const char* what;
    std::string row;
  };
  for (const Case& c :
       {Case{"version byte", flip(0)}, Case{"nonce", flip(5)},
        Case{"ciphertext", flip(20)}, Case{"tag", flip(sealed.size() - 1)},
        Case{"truncated", sealed.substr(0, 20)}, Case{"empty", ""},
        Case{"appended", sealed + "x"}}) {
    PutRaw(**store, Table::kSecrets, key, c.row);
    auto s = (*store)->GetSecret("openfaas-fn", "api-key");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss)
        << c.what << ": " << s.status();
  }
  // Still found, so that it can be replaced or deleted.
  EXPECT_TRUE((*store)->FindSecret("openfaas-fn", "api-key").ok());
  EXPECT_TRUE(absl::IsNotFound((*store)->FindSecret("openfaas-fn", "nope")));
  // The namespace and name are associated data: a record moved to another
  // name does not open.
  PutRaw(**store, Table::kSecrets, NamespacedKey("openfaas-fn", "other"),
         sealed);
  EXPECT_EQ((*store)->GetSecret("openfaas-fn", "other").status().code(),
            absl::StatusCode::kDataLoss);
  PutRaw(**store, Table::kSecrets, NamespacedKey("dev", "api-key"), sealed);
  EXPECT_EQ((*store)->GetSecret("dev", "api-key").status().code(),
            absl::StatusCode::kDataLoss);
}

// Stores written before sealing hold plain CBOR records: they still read, and
// the next open seals them and compacts the plain bytes away.
TEST_F(SecretsAtRestTest, PlainRecordFromBeforeIsReadThenSealed) {
  std::string key = NamespacedKey("openfaas-fn", "old");
  {
    auto store = Open(Key('a'));
    ASSERT_TRUE(store.ok()) << store.status();
    PutRaw(**store, Table::kSecrets, key,
           Encode(SecretRecord{"openfaas-fn", "old", kValue}));
    EXPECT_TRUE(Contains(ReadTree(dir_ + "/db"), kValue));
    auto s = (*store)->GetSecret("openfaas-fn", "old");
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->value, kValue);
  }
  auto store = Open(Key('a'));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*(*store)->Get(Table::kSecrets, key))[0], '\x01');
  EXPECT_EQ((*store)->GetSecret("openfaas-fn", "old")->value, kValue);
  EXPECT_FALSE(Contains(ReadTree(dir_ + "/db"), kValue));
}

TEST_F(SecretsAtRestTest, StoreFilesAreOwnerOnlyUnderUmask077) {
  mode_t old = umask(077);
  {
    auto store = Open(Key('a'));
    ASSERT_TRUE(store.ok()) << store.status();
    Put(**store, {"openfaas-fn", "api-key", kValue});
  }
  ASSERT_TRUE(Open(Key('a')).ok());
  umask(old);
  size_t files = 0;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(dir_ + "/db")) {
    struct stat st;
    ASSERT_EQ(lstat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 077, 0u) << e.path();
    files += S_ISREG(st.st_mode);
  }
  EXPECT_GT(files, 3u);
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(SecretsAtRestTest, KeyFileIsCreatedOnceOwnerOnly) {
  std::string path = dir_ + "/secrets.key";
  bool created = false;
  auto key = LoadOrCreateSecretsKeyFile(path, &created);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_TRUE(created);
  EXPECT_EQ(key->size(), kSecretsKeyBytes);
  EXPECT_NE(*key, std::string(kSecretsKeyBytes, '\0'));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kSecretsKeyBytes));
  auto again = LoadOrCreateSecretsKeyFile(path, &created);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(*again, *key);
  EXPECT_EQ(*ReadSecretsKeyFile(path), *key);
  EXPECT_FALSE(
      std::filesystem::exists(path + ".tmp." + std::to_string(getpid())));
}

TEST_F(SecretsAtRestTest, BadKeyFilesAreRefusedWithTheFix) {
  std::string path = dir_ + "/k";
  EXPECT_TRUE(absl::IsNotFound(ReadSecretsKeyFile(path).status()));

  WriteFile(path, Key('a'), 0644);
  auto loose = ReadSecretsKeyFile(path);
  EXPECT_EQ(loose.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(loose.status().message()), "chmod 600"))
      << loose.status();
  bool created = true;
  EXPECT_FALSE(LoadOrCreateSecretsKeyFile(path, &created).ok());
  EXPECT_FALSE(created);

  WriteFile(path, Key('a') + "\n", 0600);
  auto size = ReadSecretsKeyFile(path);
  EXPECT_EQ(size.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(size.status().message()), "33 bytes"))
      << size.status();

  std::filesystem::create_directory(dir_ + "/d");
  chmod((dir_ + "/d").c_str(), 0700);
  EXPECT_EQ(ReadSecretsKeyFile(dir_ + "/d").status().code(),
            absl::StatusCode::kFailedPrecondition);

  WriteFile(path, Key('z'), 0400);
  EXPECT_EQ(*ReadSecretsKeyFile(path), Key('z'));
}

}  // namespace
}  // namespace silt::store
