// The sandbox on its own: real namespaces, cgroups and seccomp (needs root).
#include "sandbox.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "gtest/gtest.h"

namespace silt::invoker {
namespace {

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "the sandbox needs root (namespaces, cgroups)";
    dir_ = testing::MakeTempDir("silt-sandbox");
    std::filesystem::create_directories(dir_ + "/root");
    std::filesystem::create_directories(dir_ + "/bundle");
    std::filesystem::create_directories(dir_ + "/secrets");
    std::ofstream(dir_ + "/bundle/data.txt") << "bundle-data";
    std::ofstream(dir_ + "/secrets/token") << "s3cret";
    std::filesystem::permissions(dir_, std::filesystem::perms(0755));
    ASSERT_TRUE(PrepareRootSkeleton(dir_ + "/root").ok());
    ASSERT_TRUE(PrepareDevDir(dir_ + "/dev").ok());
    ASSERT_TRUE(MountTmp(dir_ + "/tmp", 16 << 20).ok());
    // As the invoker does: the secrets are the function's host id's alone.
    for (const char* p : {"/secrets/token", "/secrets"}) {
      ASSERT_EQ(chown((dir_ + p).c_str(), host_id_, host_id_), 0);
      ASSERT_EQ(chmod((dir_ + p).c_str(), 0500), 0);
    }
  }
  void TearDown() override {
    if (dir_.empty()) return;
    umount2((dir_ + "/tmp").c_str(), MNT_DETACH);
    std::filesystem::remove_all(dir_);
  }

  struct Result {
    int status;
    std::string out;
  };
  // Runs a shell script in a fresh sandbox and returns its wait status and
  // stdout.
  Result RunSh(const std::string& script, uint64_t memory = 0,
               const std::string& dev_dir = "") {
    int out[2];
    EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
    int chan[2];
    EXPECT_EQ(pipe2(chan, O_CLOEXEC), 0);
    SandboxSpec spec;
    spec.root_dir = dir_ + "/root";
    spec.bundle_dir = dir_ + "/bundle";
    spec.secrets_dir = dir_ + "/secrets";
    spec.worker_dir = dir_ + "/bundle";
    spec.argv = {"/bin/sh", "-c", script};
    spec.env = {"PATH=/usr/bin:/bin"};
    spec.hostname = "fn-test";
    spec.host_id = host_id_;
    spec.dev_dir = dev_dir.empty() ? dir_ + "/dev" : dev_dir;
    spec.tmp_dir = dir_ + "/tmp";
    spec.cgroup =
        "silt/test/" + std::to_string(getpid()) + "-" + std::to_string(++n_);
    spec.memory_limit_bytes = memory;
    spec.channel_fd = chan[0];
    spec.stdout_fd = out[1];
    spec.stderr_fd = 2;
    auto p = Spawn(spec);
    close(out[1]);
    close(chan[0]);
    close(chan[1]);
    EXPECT_TRUE(p.ok()) << p.status();
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = read(out[0], buf, sizeof(buf))) > 0)
      text.append(buf, static_cast<size_t>(n));
    close(out[0]);
    int st = p.ok() ? (*p)->Kill() : -1;
    return {st, text};
  }
  std::string dir_;
  int n_ = 0;
  const uint32_t host_id_ = HostIdOf("test", "fn");
};

TEST_F(SandboxTest, IsolatedReadOnlyUnprivileged) {
  auto r = RunSh(
      "echo pid=$$; echo sid=$(cut -d' ' -f6 /proc/1/stat); echo "
      "host=$(hostname); echo uid=$(id -u) gid=$(id -g); set -- $(cat "
      "/proc/self/uid_map); echo map=$1 $2 $3; "
      "cat /etc/shadow >/dev/null 2>&1 && echo shadow-read || echo "
      "shadow-denied; cat "
      "/var/silt/bundle/data.txt; "
      "echo; cat /var/openfaas/secrets/token; echo; "
      "touch /usr/x 2>/dev/null && echo usr-writable || echo usr-ro; "
      "touch /var/silt/bundle/x 2>/dev/null && echo bundle-writable || echo "
      "bundle-ro; "
      "echo hi > /tmp/x && cat /tmp/x; "
      "ls /sys/class/net 2>/dev/null | tr '\\n' ' '; cat /proc/net/dev | tail "
      "-n +3 | "
      "cut -d: -f1 | tr -d ' ' | tr '\\n' ','; echo; "
      "echo x > /dev/null && echo devnull-ok; echo $(head -c 4 /dev/urandom | "
      "wc -c) "
      "random-bytes; "
      "grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status; "
      "grep Seccomp: /proc/self/status");
  ASSERT_TRUE(WIFEXITED(r.status)) << r.status;
  EXPECT_TRUE(absl::StrContains(r.out, "pid=1\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "sid=1\n"))
      << r.out;  // its own session (CRIU needs it)
  EXPECT_TRUE(absl::StrContains(r.out, "host=fn-test\n")) << r.out;
  // Root of a user namespace mapping only it, to the function's own host
  // id, with no capabilities: root-only host files stay closed.
  EXPECT_TRUE(absl::StrContains(r.out, "uid=0 gid=0\n")) << r.out;
  EXPECT_TRUE(
      absl::StrContains(r.out, absl::StrCat("map=0 ", host_id_, " 1\n")))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "shadow-denied\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "bundle-data\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "s3cret\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "usr-ro\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "bundle-ro\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "hi\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "devnull-ok\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "4 random-bytes\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "lo,\n")) << r.out;  // loopback only
  EXPECT_TRUE(absl::StrContains(r.out, "CapEff:\t0000000000000000")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "NoNewPrivs:\t1")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "Seccomp:\t2")) << r.out;
}

// A GPU proclet's process gets the node's NVIDIA device nodes besides the
// usual ones (here stand-ins: a "nvidiactl" that is /dev/null's device and a
// "nvidia0" that is /dev/zero's), and nothing else of the host's /dev.
TEST_F(SandboxTest, GpuDevDirCarriesTheNvidiaNodes) {
  const std::string host_dev = dir_ + "/host-dev";
  std::filesystem::create_directories(host_dev);
  ASSERT_EQ(
      mknod((host_dev + "/nvidiactl").c_str(), S_IFCHR | 0666, makedev(1, 3)),
      0);
  ASSERT_EQ(
      mknod((host_dev + "/nvidia0").c_str(), S_IFCHR | 0666, makedev(1, 5)), 0);
  ASSERT_EQ(mknod((host_dev + "/sda").c_str(), S_IFCHR | 0666, makedev(1, 3)),
            0);
  std::ofstream(host_dev + "/nvidia-not-a-device") << "x";
  const std::string gpu_dev = dir_ + "/gpu-dev";
  auto copied = PrepareGpuDevDir(gpu_dev, host_dev);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(*copied, 2);
  copied = PrepareGpuDevDir(gpu_dev, host_dev);  // again: nothing changes
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(*copied, 2);
  auto r = RunSh(
      "echo x > /dev/nvidiactl && echo ctl-ok; "
      "echo $(head -c 3 /dev/nvidia0 | od -An -tx1); "
      "ls /dev | tr '\\n' ' '",
      0, gpu_dev);
  ASSERT_TRUE(WIFEXITED(r.status)) << r.status << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ctl-ok\n")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "00 00 00\n")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "sda")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "nvidia-not")) << r.out;
  umount2(gpu_dev.c_str(), MNT_DETACH);  // where it mounted a tmpfs
}

TEST_F(SandboxTest, ForbiddenSyscallKillsOnlyTheSandbox) {
  // unshare(2) is not on the allow list.
  auto r = RunSh("echo before; exec unshare --user true");
  ASSERT_TRUE(WIFSIGNALED(r.status)) << r.status << " " << r.out;
  EXPECT_EQ(WTERMSIG(r.status), SIGSYS);
  EXPECT_EQ(r.out, "before\n");
}

TEST_F(SandboxTest, MemoryLimitKills) {
  // A shell string doubling past the limit.
  auto r = RunSh("x=0123456789; while true; do x=$x$x; done", 32 << 20);
  ASSERT_TRUE(WIFSIGNALED(r.status)) << r.status;
  EXPECT_EQ(WTERMSIG(r.status), SIGKILL);
}

}  // namespace
}  // namespace silt::invoker
