#include "store/store.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace silt::store {
namespace {

const std::string kKey(32, 'k');

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/silt-store-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<Store> Open() {
    auto s = Store::Open({.path = dir_ + "/db", .secrets_key = kKey});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  std::string dir_;
};

FunctionRecord Fn(std::string ns, std::string name, uint64_t gen = 1) {
  FunctionRecord f;
  f.ns = std::move(ns);
  f.name = std::move(name);
  f.spec = R"({"service":")" + f.name + R"(","image":"img"})";
  f.created_at_unix_nanos = 1700000000123456789;
  f.replicas = 2;
  f.generation = gen;
  return f;
}

TEST_F(StoreTest, FunctionsRoundTripAndListByNamespace) {
  auto store = Open();
  WriteBatch b;
  b.PutFunction(Fn("openfaas-fn", "a"));
  b.PutFunction(Fn("openfaas-fn", "b"));
  b.PutFunction(Fn("dev", "a"));
  ASSERT_TRUE(store->Write(b).ok());

  auto f = store->GetFunction("openfaas-fn", "a");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->spec, Fn("openfaas-fn", "a").spec);
  EXPECT_EQ(f->created_at_unix_nanos, 1700000000123456789);
  EXPECT_EQ(f->replicas, 2u);

  auto fn = store->ListFunctions("openfaas-fn");
  ASSERT_TRUE(fn.ok());
  ASSERT_EQ(fn->size(), 2u);
  EXPECT_EQ((*fn)[0].name, "a");
  EXPECT_EQ((*fn)[1].name, "b");
  auto all = store->ListFunctions("");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);

  // A namespace that is a prefix of another must not see the other's functions.
  WriteBatch b2;
  b2.PutFunction(Fn("de", "x"));
  ASSERT_TRUE(store->Write(b2).ok());
  auto dev = store->ListFunctions("dev");
  ASSERT_TRUE(dev.ok());
  ASSERT_EQ(dev->size(), 1u);
  EXPECT_EQ((*dev)[0].name, "a");
}

TEST_F(StoreTest, MissingKeysAreNotFound) {
  auto store = Open();
  EXPECT_TRUE(
      absl::IsNotFound(store->GetFunction("openfaas-fn", "nope").status()));
  EXPECT_TRUE(
      absl::IsNotFound(store->GetSecret("openfaas-fn", "nope").status()));
  EXPECT_TRUE(absl::IsNotFound(store->GetNamespace("nope").status()));
  EXPECT_TRUE(
      absl::IsNotFound(store->Get(Table::kBundles, "sha256:00").status()));
}

TEST_F(StoreTest, SecretsKeepArbitraryBytes) {
  auto store = Open();
  std::string value("a\0b\xff\n", 5);
  WriteBatch b;
  b.PutSecret({"openfaas-fn", "s1", value});
  ASSERT_TRUE(store->Write(b).ok());
  auto s = store->GetSecret("openfaas-fn", "s1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->value, value);
  WriteBatch d;
  d.DeleteSecret("openfaas-fn", "s1");
  ASSERT_TRUE(store->Write(d).ok());
  EXPECT_TRUE(absl::IsNotFound(store->GetSecret("openfaas-fn", "s1").status()));
}

TEST_F(StoreTest, NamespacesKeepLabels) {
  auto store = Open();
  WriteBatch b;
  b.PutNamespace({"dev", {{"openfaas", "1"}}, {{"owner", "me"}}});
  ASSERT_TRUE(store->Write(b).ok());
  auto n = store->GetNamespace("dev");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->labels.at("openfaas"), "1");
  EXPECT_EQ(n->annotations.at("owner"), "me");
  auto all = store->ListNamespaces();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 1u);
}

TEST_F(StoreTest, ReopenAfterCloseKeepsEverything) {
  {
    auto store = Open();
    WriteBatch b;
    b.PutFunction(Fn("openfaas-fn", "keep"));
    b.PutSecret({"openfaas-fn", "s", "v"});
    b.Put(Table::kBundles, "sha256:abc", "manifest");
    ASSERT_TRUE(store->Write(b).ok());
  }
  auto store = Open();
  EXPECT_TRUE(store->GetFunction("openfaas-fn", "keep").ok());
  EXPECT_EQ(store->GetSecret("openfaas-fn", "s")->value, "v");
  EXPECT_EQ(*store->Get(Table::kBundles, "sha256:abc"), "manifest");
}

TEST_F(StoreTest, SecondOpenOfSameDirFailsClearly) {
  auto first = Open();
  auto second = Store::Open({.path = dir_ + "/db", .secrets_key = kKey});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("another process"),
            std::string::npos)
      << second.status();
}

TEST_F(StoreTest, CorruptRecordIsDataLoss) {
  auto store = Open();
  WriteBatch b;
  b.Put(Table::kFunctions, NamespacedKey("openfaas-fn", "bad"),
        "\xff\xfe not cbor");
  ASSERT_TRUE(store->Write(b).ok());
  auto f = store->GetFunction("openfaas-fn", "bad");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << f.status();
}

// A child commits batches of ten functions that all carry one generation
// number, and reports each acknowledged generation on a pipe; it is SIGKILLed
// mid-stream. After reopening, every function carries the same generation
// (all-or-nothing), and that generation is at least the last one acknowledged
// (durability).
TEST_F(StoreTest, WriteInterruptedByCrashIsAllOrNothing) {
  constexpr int kKeys = 10;
  for (int round = 0; round < 3; ++round) {
    std::string path = dir_ + "/crash" + std::to_string(round);
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      auto s = Store::Open({.path = path, .secrets_key = kKey});
      if (!s.ok()) _exit(2);
      for (uint64_t gen = 1;; ++gen) {
        WriteBatch b;
        for (int k = 0; k < kKeys; ++k) {
          FunctionRecord f = Fn("openfaas-fn", "f" + std::to_string(k), gen);
          f.spec.append(4096,
                        'x');  // big enough that a batch spans several writes
          b.PutFunction(f);
        }
        if (!(*s)->Write(b).ok()) _exit(3);
        if (write(fds[1], &gen, sizeof(gen)) != sizeof(gen)) _exit(4);
      }
    }
    close(fds[1]);
    uint64_t acked = 0, gen = 0;
    // Let the child get 20 + round*15 commits in, then kill it without warning.
    for (int i = 0; i < 20 + round * 15; ++i) {
      ASSERT_EQ(read(fds[0], &gen, sizeof(gen)),
                static_cast<ssize_t>(sizeof(gen)));
      acked = gen;
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    close(fds[0]);
    ASSERT_TRUE(WIFSIGNALED(status));

    auto store = Store::Open({.path = path, .secrets_key = kKey});
    ASSERT_TRUE(store.ok()) << store.status();
    auto fns = (*store)->ListFunctions("openfaas-fn");
    ASSERT_TRUE(fns.ok()) << fns.status();
    ASSERT_EQ(fns->size(), static_cast<size_t>(kKeys));
    uint64_t first = (*fns)[0].generation;
    for (const auto& f : *fns) EXPECT_EQ(f.generation, first) << f.name;
    EXPECT_GE(first, acked);
  }
}

}  // namespace
}  // namespace silt::store
