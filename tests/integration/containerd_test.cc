// The invoker's containerd client against a real containerd of its own
// (Daemon), running containers from a busybox root through runc: create,
// start, wait, output, a read-only root, delete (also of a running one),
// and a restarted owner adopting the running daemon.
#include "containerd/containerd.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "common/process.h"
#include "gtest/gtest.h"

namespace silt::containerd {
namespace {

using std::chrono::seconds;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ContainerdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (containerd and runc)";
    if (access("/usr/bin/containerd", X_OK) != 0 ||
        access("/usr/sbin/runc", X_OK) != 0)
      GTEST_SKIP()
          << "containerd or runc is not installed: run deploy/setup.sh";
    if (access("/bin/busybox", X_OK) != 0)
      GTEST_SKIP() << "busybox-static is not installed: run deploy/setup.sh";
    // Short: containerd's socket path must fit a sockaddr_un.
    dir_ = silt::testing::MakeTempDir("ctrd");
    auto d = Daemon::Start(dir_ + "/d");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    auto c = Client::Connect(daemon_->socket(), "silt-test");
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    // A root of one static busybox and its applets.
    rootfs_ = dir_ + "/rootfs";
    std::filesystem::create_directories(rootfs_ + "/bin");
    for (const char* d : {"/proc", "/dev", "/sys", "/tmp"})
      std::filesystem::create_directories(rootfs_ + d);
    std::filesystem::copy_file("/bin/busybox", rootfs_ + "/bin/busybox");
    for (const char* applet : {"sh", "echo", "sleep", "touch", "cat"})
      std::filesystem::create_symlink("busybox", rootfs_ + "/bin/" + applet);
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
    if (!dir_.empty()) {
      // runc's rootfs mounts are gone with the tasks; what is left is files.
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  ContainerSpec Spec(const std::string& id, const std::string& script) {
    ContainerSpec s;
    s.id = id;
    s.rootfs = rootfs_;
    s.args = {"/bin/sh", "-c", script};
    s.env = {"PATH=/bin", "NAME=silt"};
    s.log_path = dir_ + "/" + id + ".log";
    return s;
  }

  std::string dir_, rootfs_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(ContainerdTest, RunsAContainerToItsExitStatus) {
  auto v = client_->Version();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->empty());
  auto spec = Spec("hello",
                   "echo hello from $NAME; touch /x || echo root is ro >&2; "
                   "touch /tmp/x && echo tmp is rw; exit 3");
  ASSERT_TRUE(client_->Create(spec).ok());
  EXPECT_EQ(client_->Create(spec).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(client_->Start("hello").ok());
  auto exit = client_->Wait("hello", seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 3u);
  auto ids = client_->List();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, std::vector<std::string>{"hello"});
  ASSERT_TRUE(client_->Delete("hello").ok());
  EXPECT_TRUE(client_->List()->empty());
  // The log is whole once the task is deleted: both streams (each in its
  // order); the root is read-only, /tmp is not.
  std::string log = ReadFile(spec.log_path);
  for (const char* line : {"hello from silt\n", "Read-only file system\n",
                           "root is ro\n", "tmp is rw\n"})
    EXPECT_TRUE(absl::StrContains(log, line)) << line << " in " << log;
  EXPECT_EQ(client_->Delete("hello").code(), absl::StatusCode::kNotFound);
}

TEST_F(ContainerdTest, DeletingARunningContainerKillsIt) {
  ASSERT_TRUE(client_->Create(Spec("sleeper", "sleep 600")).ok());
  ASSERT_TRUE(client_->Start("sleeper").ok());
  EXPECT_EQ(
      client_->Wait("sleeper", std::chrono::milliseconds(200)).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  auto deleted = client_->Delete("sleeper");
  ASSERT_TRUE(deleted.ok()) << deleted;
  EXPECT_TRUE(client_->List()->empty());
}

TEST_F(ContainerdTest, ARestartedOwnerAdoptsTheRunningDaemon) {
  auto again = Daemon::Start(dir_ + "/d");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->pid(), daemon_->pid());
  EXPECT_TRUE((*again)->Alive());
  again->reset();  // stops it
  EXPECT_FALSE(daemon_->Alive());
}

}  // namespace
}  // namespace silt::containerd
