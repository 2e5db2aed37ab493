// OCI images without a registry, as a user runs them: `silt image import` of
// archives made at test time (tests/images/make-oci-image.sh) through the
// real gateway into every node's containerd (each invoker's own), `silt
// image list` with the nodes that hold them, bad archives refused with 400
// and nothing kept, a node that joins later importing what the cluster
// holds, the catalog surviving a gateway restart, and `silt image remove`
// leaving no image, blob, snapshot or lease in any node's containerd.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/cluster.h"
#include "containerd/containerd.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace silt::testing {
namespace {

using nlohmann::json;

class ImagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (containerd, namespaces)";
    if (access("/usr/bin/containerd", X_OK) != 0 ||
        access("/usr/sbin/runc", X_OK) != 0)
      GTEST_SKIP()
          << "containerd or runc is not installed: run deploy/setup.sh";
    if (access("/bin/busybox", X_OK) != 0)
      GTEST_SKIP() << "busybox-static is not installed: run deploy/setup.sh";
    dir_ = MakeTempDir("img");
    auto c = Cluster::Start(dir_);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    for (const char* n : {"node-a", "node-b"})
      ASSERT_TRUE(cluster_->AddNode({.name = n}).ok());
    ASSERT_TRUE(cluster_->WaitNodes(2).ok());
    // The image: a busybox root and a layer with a script.
    std::string root = dir_ + "/rootfs", top = dir_ + "/top";
    std::filesystem::create_directories(root + "/bin");
    std::filesystem::copy_file("/bin/busybox", root + "/bin/busybox");
    std::filesystem::create_symlink("busybox", root + "/bin/sh");
    std::filesystem::create_directories(top);
    std::ofstream(top + "/run.sh") << "echo hello\n";
    archive_ = dir_ + "/hello.tar";
    auto r =
        RunCommand({SILT_SOURCE_DIR "/tests/images/make-oci-image.sh", "--name",
                    "silt/hello:1", "--layer", root, "--layer", top, "-o",
                    archive_, "--cmd", R"(["/bin/sh","/run.sh"])"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  void TearDown() override {
    cluster_.reset();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  json List() {
    auto r = cluster_->Silt({"image", "list", "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out, nullptr, false);
  }

  // The nodes `silt image list` says hold `name`.
  std::set<std::string> Holders(const std::string& name) {
    std::set<std::string> nodes;
    for (const auto& i : List())
      if (i.value("name", "") == name)
        for (const auto& n : i["nodes"]) nodes.insert(n.get<std::string>());
    return nodes;
  }

  // The containers in the node's containerd (the invoker's namespace).
  std::vector<std::string> NodeContainers(const std::string& node) {
    auto c = containerd::Client::Connect(
        dir_ + "/" + node + "/containerd/containerd.sock", "silt");
    if (!c.ok()) return {};
    auto ids = (*c)->List();
    return ids.ok() ? *ids : std::vector<std::string>{};
  }

  // What the node's own containerd holds in the invoker's namespace.
  containerd::Client::Usage NodeUsage(const std::string& node) {
    auto c = containerd::Client::Connect(
        dir_ + "/" + node + "/containerd/containerd.sock", "silt");
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    auto u = (*c)->CountUsage();
    EXPECT_TRUE(u.ok()) << u.status();
    return u.ok() ? *u : containerd::Client::Usage{};
  }

  std::string dir_, archive_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(ImagesTest, ImportListJoinRestartRemove) {
  auto r = cluster_->Silt({"image", "import", archive_});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(
      absl::StrContains(r.out, "Imported docker.io/silt/hello:1 on 2 nodes"))
      << r.out;
  json list = List();
  ASSERT_EQ(list.size(), 1u) << list.dump();
  EXPECT_EQ(list[0]["name"], "docker.io/silt/hello:1");
  EXPECT_TRUE(
      absl::StartsWith(list[0]["digest"].get<std::string>(), "sha256:"));
  EXPECT_EQ(Holders("docker.io/silt/hello:1"),
            (std::set<std::string>{"node-a", "node-b"}));
  for (const char* n : {"node-a", "node-b"}) {
    auto u = NodeUsage(n);
    EXPECT_EQ(u.images, 1u) << n;
    EXPECT_EQ(u.snapshots, 2u) << n;
    EXPECT_EQ(u.leases, 0u) << n;
  }

  // A node that joins later imports what the cluster holds.
  ASSERT_TRUE(cluster_->AddNode({.name = "node-c"}).ok());
  ASSERT_TRUE(cluster_->WaitNodes(3).ok());
  EXPECT_TRUE(Eventually(
      [&] { return Holders("docker.io/silt/hello:1").contains("node-c"); }));

  // The catalog outlives the gateway.
  ASSERT_TRUE(cluster_->RestartGateway(SIGKILL).ok());
  ASSERT_TRUE(cluster_->WaitNodes(3).ok());
  EXPECT_TRUE(Eventually(
      [&] { return Holders("docker.io/silt/hello:1").size() == 3; }));

  r = cluster_->Silt({"image", "remove", "silt/hello:1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(List().empty());
  for (const char* n : {"node-a", "node-b", "node-c"})
    EXPECT_TRUE(Eventually([&] {
      auto u = NodeUsage(n);
      return u.images + u.content_blobs + u.snapshots + u.leases == 0;
    })) << n;
  r = cluster_->Silt({"image", "remove", "silt/hello:1"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.err, "404")) << r.err;
}

// The pid of the node's own containerd (its pid file).
pid_t ContainerdPid(const std::string& dir, const std::string& node) {
  std::ifstream in(dir + "/" + node + "/containerd/containerd.pid");
  pid_t pid = 0;
  in >> pid;
  return pid;
}

TEST_F(ImagesTest, SurvivesItsContainerdAndInvokerDying) {
  auto r = cluster_->Silt({"image", "import", archive_});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // containerd killed: the invoker starts it again for the next image, and
  // what it held (on disk) is still there.
  pid_t before = ContainerdPid(dir_, "node-a");
  ASSERT_GT(before, 0);
  ASSERT_EQ(kill(before, SIGKILL), 0);
  std::string second = dir_ + "/second.tar";
  r = RunCommand({SILT_SOURCE_DIR "/tests/images/make-oci-image.sh", "--name",
                  "silt/second:1", "--layer", dir_ + "/top", "-o", second});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = cluster_->Silt({"image", "import", second});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "on 2 nodes")) << r.out;
  EXPECT_NE(ContainerdPid(dir_, "node-a"), before);
  EXPECT_EQ(NodeUsage("node-a").images, 2u);
  // The invoker killed: containerd runs on, and the restarted invoker adopts
  // it and still reports both images.
  pid_t ctrd = ContainerdPid(dir_, "node-b");
  cluster_->StopNode("node-b", SIGKILL);
  ASSERT_EQ(kill(ctrd, 0), 0) << "containerd died with its invoker";
  ASSERT_TRUE(cluster_->WaitNodes(1).ok());
  ASSERT_TRUE(cluster_->AddNode({.name = "node-b"}).ok());
  ASSERT_TRUE(cluster_->WaitNodes(2).ok());
  EXPECT_TRUE(Eventually([&] {
    return Holders("docker.io/silt/hello:1").contains("node-b") &&
           Holders("docker.io/silt/second:1").contains("node-b");
  }));
  EXPECT_EQ(ContainerdPid(dir_, "node-b"), ctrd);
}

TEST_F(ImagesTest, AnImportedImageRunsAsAFunction) {
  // A function image as faas-cli builds them: a watchdog on :8080 that runs
  // fprocess per call (tests/images/watchdog.cc stands in for OpenFaaS's).
  std::string fn = dir_ + "/fn";
  std::filesystem::create_directories(fn + "/usr/bin");
  std::filesystem::copy_file(SILT_TEST_WATCHDOG, fn + "/usr/bin/fwatchdog");
  for (const char* a : {"cat", "echo"})
    std::filesystem::create_symlink("busybox", dir_ + "/rootfs/bin/" + a);
  std::ofstream(fn + "/handler.sh")
      << "echo \"$Http_Method $Http_Path $Http_Query $GREETING\"\ncat\n"
         "echo handled >&2\n";
  std::string archive = dir_ + "/echo.tar";
  auto r = RunCommand(
      {SILT_SOURCE_DIR "/tests/images/make-oci-image.sh", "--name",
       "silt/echo:1", "--layer", dir_ + "/rootfs", "--layer", fn, "-o", archive,
       "--entrypoint", R"(["/usr/bin/fwatchdog"])", "--env", "PATH=/bin",
       "--env", "fprocess=/bin/sh /handler.sh", "--port", "8080/tcp"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = cluster_->Silt({"image", "import", archive});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  r = cluster_->Silt({"deploy", "--name", "echo", "--image", "silt/echo:1",
                      "-e", "GREETING=hi"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = cluster_->Silt({"invoke", "echo"}, "ping");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "POST /  hi\nping") << r.err;
  auto call = cluster_->gateway().Call("PUT", "/function/echo/a/b?x=1", "body");
  EXPECT_EQ(call.status, 200) << call.body;
  EXPECT_EQ(call.body, "PUT /a/b x=1 hi\nbody");
  // Its stderr is the function's log.
  EXPECT_TRUE(Eventually([&] {
    return absl::StrContains(cluster_->Silt({"logs", "echo"}).out, "handled");
  }));

  // The invoker of the node running it dies: its containers outlive it (their
  // shims), and the restarted invoker removes them. The invoker may be staging
  // a spare instance while we look, so what must survive is what ran before
  // the kill, and what must go is everything there once it is dead.
  std::string host;
  std::vector<std::string> before;
  for (const char* n : {"node-a", "node-b"})
    if (auto ids = NodeContainers(n); !ids.empty()) {
      host = n;
      before = ids;
    }
  ASSERT_FALSE(host.empty());
  cluster_->StopNode(host, SIGKILL);
  ASSERT_TRUE(cluster_->WaitNodes(1).ok());
  std::vector<std::string> left = NodeContainers(host);
  for (const std::string& id : before)
    EXPECT_NE(std::find(left.begin(), left.end(), id), left.end())
        << id << " died with its invoker";
  ASSERT_TRUE(cluster_->AddNode({.name = host}).ok());
  ASSERT_TRUE(cluster_->WaitNodes(2).ok());
  EXPECT_TRUE(Eventually([&] {
    for (const std::string& id : NodeContainers(host))
      if (std::find(left.begin(), left.end(), id) != left.end()) return false;
    return true;
  }));
  call = cluster_->gateway().Call("POST", "/function/echo", "again");
  EXPECT_EQ(call.status, 200) << call.body;
  EXPECT_EQ(call.body, "POST /  hi\nagain");

  // An image that was never imported is refused at deploy.
  r = cluster_->Silt({"deploy", "--name", "other", "--image", "silt/none:1"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.err, "silt image import")) << r.err;

  // Removed: its containers go with its instances.
  r = cluster_->Silt({"remove", "echo"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* n : {"node-a", "node-b"})
    EXPECT_TRUE(Eventually([&] { return NodeUsage(n).containers == 0; })) << n;
}

TEST_F(ImagesTest, BadArchivesAreRefusedAndNothingKept) {
  // Not an archive at all: the gateway says so itself.
  std::ofstream(dir_ + "/junk.tar") << std::string(4096, 'x');
  auto r = cluster_->Silt({"image", "import", dir_ + "/junk.tar"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.err, "400")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "not a tar archive")) << r.err;
  // A layer that is not what its digest says: the nodes find it out.
  std::string x = dir_ + "/x";
  std::filesystem::create_directories(x);
  ASSERT_EQ(RunCommand({"/bin/tar", "-C", x, "-xf", archive_}).exit_code, 0);
  for (const auto& e : std::filesystem::directory_iterator(x + "/blobs/sha256"))
    if (std::filesystem::file_size(e.path()) > 100'000)
      std::ofstream(e.path(), std::ios::app) << "tampered";
  std::string tampered = dir_ + "/tampered.tar";
  ASSERT_EQ(RunCommand({"/bin/tar", "-C", x, "-cf", tampered, "."}).exit_code,
            0);
  r = cluster_->Silt({"image", "import", tampered});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.err, "400")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "does not match its digest")) << r.err;
  EXPECT_TRUE(List().empty());
  for (const char* n : {"node-a", "node-b"})
    EXPECT_TRUE(Eventually([&] {
      auto u = NodeUsage(n);
      return u.images + u.content_blobs + u.snapshots + u.leases == 0;
    })) << n;
  // The gateway kept no archive either.
  size_t kept = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(dir_ + "/gateway/images"))
    kept += e.is_regular_file();
  EXPECT_EQ(kept, 0u);
}

}  // namespace
}  // namespace silt::testing
