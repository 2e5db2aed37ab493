// Function instances as containers (invoker/src/container_runtime.h) against
// a real containerd of the test's own, runc and the CNI plugins: an image
// with a classic watchdog (tests/images/watchdog.cc) starts, answers its
// health check, and serves a call over its bridge address with the
// deployment's environment over the image's, its secret, and a read-only
// root; a container that exits or never answers fails its start with why;
// nothing is left (containers, snapshots, addresses, masquerading rules,
// namespaces).
#include "container_runtime.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "deploy/http_client.h"
#include "gtest/gtest.h"

namespace silt::invoker {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class ContainerRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (containerd, runc, CNI)";
    for (const char* bin : {"/usr/bin/containerd", "/usr/sbin/runc",
                            "/usr/lib/cni/bridge", "/bin/busybox"})
      if (access(bin, X_OK) != 0)
        GTEST_SKIP() << bin << " is not installed: run deploy/setup.sh";
    // A network of this test process's own (its threads and children,
    // containerd among them, inherit it): ctest runs tests at once, and two
    // bridges on one subnet of the host hand out the same addresses.
    ASSERT_EQ(unshare(CLONE_NEWNET), 0) << strerror(errno);
    dir_ = silt::testing::MakeTempDir("crt");
    auto d = containerd::Daemon::Start(dir_ + "/d");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    auto c = containerd::Client::Connect(daemon_->socket(), "silt-test");
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    bridge_ = absl::StrCat("silt-r", getpid() % 100000);
    containerd::CniOptions o;
    o.bridge = bridge_;
    o.subnet = "10.199.8.0/24";
    o.state_dir = dir_ + "/cni";
    auto cni = containerd::Cni::Create(o);
    ASSERT_TRUE(cni.ok()) << cni.status();
    cni_ = *std::move(cni);
    runtime_ = std::make_unique<ContainerRuntime>(client_, cni_);

    // The image: busybox, the watchdog, and a handler that shows what it
    // got. Another one whose command fails at once.
    std::string root = dir_ + "/root";
    std::filesystem::create_directories(root + "/bin");
    std::filesystem::create_directories(root + "/usr/bin");
    std::filesystem::copy_file("/bin/busybox", root + "/bin/busybox");
    for (const char* a : {"sh", "cat", "echo", "touch"})
      std::filesystem::create_symlink("busybox", root + "/bin/" + a);
    std::filesystem::copy_file(SILT_TEST_WATCHDOG, root + "/usr/bin/fwatchdog");
    for (const char* d : {"/proc", "/dev", "/sys", "/tmp", "/var/openfaas"})
      std::filesystem::create_directories(root + d);
    std::ofstream(root + "/handler.sh")
        << "echo \"$Http_Method $Http_Path $Http_Query $GREETING $FROM\"\n"
           "cat\necho\ncat /var/openfaas/secrets/api-key\necho\n"
           "touch /x 2>/dev/null && echo root rw || echo root ro\n";
    ASSERT_EQ(Make("silt/fn:1", root, R"(["/usr/bin/fwatchdog"])"), 0);
    ASSERT_EQ(Make("silt/broken:1", root,
                   R"(["/bin/sh","-c","echo broken >&2; exit 3"])"),
              0);
  }

  int Make(const std::string& name, const std::string& root,
           const std::string& entrypoint) {
    std::string out = dir_ + "/" + name.substr(5, 2) + ".tar";
    auto r = silt::testing::RunCommand(
        {SILT_SOURCE_DIR "/tests/images/make-oci-image.sh", "--name", name,
         "--layer", root, "-o", out, "--entrypoint", entrypoint, "--env",
         "PATH=/bin:/usr/bin", "--env", "fprocess=/bin/sh /handler.sh", "--env",
         "FROM=image", "--env", "GREETING=image-greeting", "--port",
         "8080/tcp"});
    if (r.exit_code != 0) return r.exit_code;
    auto images = client_->Import(out);
    EXPECT_TRUE(images.ok()) << images.status();
    return images.ok() ? 0 : 1;
  }

  void TearDown() override {
    runtime_.reset();
    if (cni_) {
      EXPECT_TRUE(cni_->Unmasquerade().ok());
    }
    cni_.reset();
    client_.reset();
    daemon_.reset();
    if (!bridge_.empty())
      silt::testing::RunCommand({"/usr/sbin/ip", "link", "del", bridge_});
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  // Nothing of any instance left on the node.
  void ExpectNothingLeft() {
    auto u = client_->CountUsage();
    ASSERT_TRUE(u.ok()) << u.status();
    EXPECT_EQ(u->containers, 0u);
    EXPECT_EQ(u->snapshots, 1u);  // the images' one layer
    auto rules =
        silt::testing::RunCommand({"/usr/sbin/iptables", "-t", "nat", "-S"});
    EXPECT_FALSE(absl::StrContains(rules.out, "CNI-")) << rules.out;
  }

  std::string dir_, bridge_;
  std::unique_ptr<containerd::Daemon> daemon_;
  std::shared_ptr<containerd::Client> client_;
  std::shared_ptr<containerd::Cni> cni_;
  std::unique_ptr<ContainerRuntime> runtime_;
};

TEST_F(ContainerRuntimeTest, ServesACallThroughItsWatchdog) {
  std::string secrets = dir_ + "/secrets";
  std::filesystem::create_directories(secrets);
  std::ofstream(secrets + "/api-key") << "s3cret";
  ContainerLaunch l;
  l.id = "fn-1";
  l.image = "silt/fn:1";
  l.env = {"GREETING=deployed"};  // over the image's
  l.secrets_dir = secrets;
  l.memory_limit_bytes = 64 << 20;
  l.cpu_millis = 500;
  l.log_path = dir_ + "/fn-1.log";
  auto t0 = std::chrono::steady_clock::now();
  auto running = runtime_->Start(l, seconds(30));
  ASSERT_TRUE(running.ok()) << running.status();
  // Context, not a check: network, container and watchdog up to healthy.
  std::cout << "container_start_to_healthy_ms="
            << std::chrono::duration<double, std::milli>(
                   std::chrono::steady_clock::now() - t0)
                   .count()
            << std::endl;
  EXPECT_TRUE(absl::StartsWith(running->ip, "10.199.8.")) << running->ip;
  EXPECT_TRUE(WatchdogHealthy(running->ip, kWatchdogPort, seconds(5)));

  deploy::HttpCall call;
  call.method = "POST";
  call.url = absl::StrCat("http://", running->ip, ":8080/some/path?x=1");
  call.body = "ping";
  auto r = deploy::Send(call);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->body,
            "POST /some/path x=1 deployed image\nping\ns3cret\nroot ro\n");

  // A second instance of the same image gets an address of its own.
  l.id = "fn-2";
  l.read_only_root = false;
  auto second = runtime_->Start(l, seconds(30));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->ip, running->ip);
  call.url = absl::StrCat("http://", second->ip, ":8080/");
  r = deploy::Send(call);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::EndsWith(r->body, "root rw\n")) << r->body;

  EXPECT_TRUE(runtime_->Stop("fn-1").ok());
  EXPECT_TRUE(runtime_->Stop("fn-2").ok());
  EXPECT_TRUE(runtime_->Stop("fn-2").ok());  // nothing left: no error
  ExpectNothingLeft();
}

TEST_F(ContainerRuntimeTest, AStartThatFailsSaysWhyAndLeavesNothing) {
  ContainerLaunch l;
  l.id = "broken-1";
  l.image = "silt/broken:1";
  l.log_path = dir_ + "/broken.log";
  auto r = runtime_->Start(l, seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "status 3"))
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "broken")) << r.status();
  ExpectNothingLeft();

  // A watchdog that listens elsewhere never answers.
  l.id = "elsewhere-1";
  l.image = "silt/fn:1";
  l.env = {"port=9090"};
  r = runtime_->Start(l, milliseconds(700));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded)
      << r.status();
  ExpectNothingLeft();

  l.image = "silt/none:1";
  EXPECT_EQ(runtime_->Start(l, seconds(5)).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace silt::invoker
