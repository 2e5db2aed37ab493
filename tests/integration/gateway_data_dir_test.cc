// The real silt-gateway's data dir: owner-only, secrets sealed, its key file
// checked.
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/gateway_process.h"
#include "common/process.h"
#include "gtest/gtest.h"

namespace silt::testing {
namespace {

constexpr char kValue[] = "s3cret-Pw9qL2-the-launch-codes";
constexpr uid_t kNobody = 65534;

class GatewayDataDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("silt-datadir");
    ASSERT_FALSE(root_.empty());
    // Others may reach the data dir's parent: only the data dir's own modes
    // keep them out.
    ASSERT_EQ(chmod(root_.c_str(), 0755), 0);
    data_ = root_ + "/gateway";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Runs the gateway expecting it to refuse to start; its stderr.
  std::string StartRefused(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {"/usr/bin/timeout",
                                     "20",
                                     SILT_GATEWAY_BIN,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--metrics-listen",
                                     "127.0.0.1:0",
                                     "--grpc-listen",
                                     "127.0.0.1:0",
                                     "--data-dir",
                                     data_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    RunResult r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    return r.err;
  }

  static void WriteFile(const std::string& path, const std::string& bytes,
                        mode_t mode) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
  }

  std::string root_;
  std::string data_;
};

// Every path under `dir`, `dir` included.
std::vector<std::string> Tree(const std::string& dir) {
  std::vector<std::string> out = {dir};
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    out.push_back(e.path().string());
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Opens each path as user and group nobody (no supplementary groups) in a
// child; the paths it could open, or why it could not check.
std::string OpenableByNobody(const std::vector<std::string>& paths) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string report;
    if (setgroups(0, nullptr) != 0 ||
        setresgid(kNobody, kNobody, kNobody) != 0 ||
        setresuid(kNobody, kNobody, kNobody) != 0) {
      report = "could not become nobody";
    }
    for (size_t i = 0; report.empty() && i < paths.size(); ++i) {
      int fd = open(paths[i].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        report += paths[i] + " opened\n";
        close(fd);
      } else if (errno != EACCES) {
        report += paths[i] + ": " + strerror(errno) + " (not EACCES)\n";
      }
    }
    if (!report.empty() && write(fds[1], report.data(), report.size()) < 0)
      _exit(2);
    _exit(0);
  }
  close(fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;)
    report.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return report;
}

TEST_F(GatewayDataDirTest, NothingUnderTheDataDirIsOpenToOthers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch to nobody";
  auto gw = GatewayProcess::Start(data_);
  ASSERT_TRUE(gw.ok()) << gw.status();
  ASSERT_EQ(
      gw->Call("POST", "/system/secrets",
               std::string(R"({"name":"api-key","value":")") + kValue + R"("})")
          .status,
      201);
  gw->PushTestBundle();
  gw->Stop(SIGTERM);

  std::vector<std::string> paths = Tree(data_);
  ASSERT_GT(paths.size(), 10u);
  for (const auto& p : paths) {
    struct stat st;
    ASSERT_EQ(lstat(p.c_str(), &st), 0) << p;
    EXPECT_EQ(st.st_mode & 077, 0u)
        << p << " is mode " << std::oct << (st.st_mode & 07777);
    if (S_ISREG(st.st_mode)) {
      EXPECT_FALSE(absl::StrContains(ReadAll(p), kValue))
          << p << " holds the secret in the clear";
    }
  }
  EXPECT_EQ(OpenableByNobody(paths), "");
  // The check does see a file that others may read.
  EXPECT_EQ(OpenableByNobody({"/etc/passwd"}), "/etc/passwd opened\n");
  // Even knowing the names, nobody gets in while the gateway runs.
  auto again = GatewayProcess::Start(data_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(OpenableByNobody(Tree(data_)), "");
}

TEST_F(GatewayDataDirTest, LooseDataDirIsTightenedAtStart) {
  ASSERT_EQ(mkdir(data_.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((data_ + "/store").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((data_ + "/bundles").c_str(), 0777), 0);
  ASSERT_EQ(chmod((data_ + "/bundles").c_str(), 0755), 0);
  WriteFile(data_ + "/bundles/old.tar", "tar", 0644);
  auto gw = GatewayProcess::Start(data_);
  ASSERT_TRUE(gw.ok()) << gw.status();
  for (std::string p : {data_, data_ + "/store", data_ + "/bundles"}) {
    struct stat st;
    ASSERT_EQ(stat(p.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u) << p;
  }
  struct stat st;
  ASSERT_EQ(stat((data_ + "/bundles/old.tar").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(GatewayDataDirTest, SharedDataDirIsRefused) {
  ASSERT_EQ(mkdir(data_.c_str(), 0700), 0);
  ASSERT_EQ(chmod(data_.c_str(), 01777), 0);
  EXPECT_TRUE(absl::StrContains(StartRefused(), "is shared"));
}

TEST_F(GatewayDataDirTest, BadKeyFilesStopTheStart) {
  ASSERT_EQ(mkdir(data_.c_str(), 0700), 0);
  WriteFile(data_ + "/secrets.key", std::string(32, 'k'), 0644);
  std::string err = StartRefused();
  EXPECT_TRUE(absl::StrContains(err, "chmod 600")) << err;

  WriteFile(data_ + "/secrets.key", "short", 0600);
  err = StartRefused();
  EXPECT_TRUE(absl::StrContains(err, "holds 5 bytes")) << err;

  err = StartRefused({"--secrets-key-file", root_ + "/missing.key"});
  EXPECT_TRUE(absl::StrContains(err, "missing.key")) << err;
}

TEST_F(GatewayDataDirTest, OperatorKeyFileIsUsedAndAnotherKeyRefused) {
  std::string key = root_ + "/operator.key";
  WriteFile(key, std::string(32, 'o'), 0600);
  {
    auto gw = GatewayProcess::Start(data_, {"--secrets-key-file", key});
    ASSERT_TRUE(gw.ok()) << gw.status();
    EXPECT_EQ(
        gw->Call("POST", "/system/secrets", R"({"name":"token","value":"v"})")
            .status,
        201);
    auto list = gw->Call("GET", "/system/secrets");
    EXPECT_EQ(list.status, 200);
    EXPECT_FALSE(absl::StrContains(list.body, "\"v\"")) << list.body;
    EXPECT_FALSE(absl::StrContains(list.body, "value")) << list.body;
  }
  EXPECT_FALSE(std::filesystem::exists(data_ + "/secrets.key"));

  // Without the flag the gateway makes DATA_DIR/secrets.key, a new key, which
  // does not open the secrets sealed under the operator's.
  std::string err = StartRefused();
  EXPECT_TRUE(absl::StrContains(err, "another key")) << err;

  auto gw = GatewayProcess::Start(data_, {"--secrets-key-file", key});
  ASSERT_TRUE(gw.ok()) << gw.status();
}

}  // namespace
}  // namespace silt::testing
