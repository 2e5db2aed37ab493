// The invoker's containerd client against a real containerd of its own
// (Daemon), running containers from a busybox root through runc: create,
// start, wait, output, a read-only root, delete (also of a running one),
// and a restarted owner adopting the running daemon. Images: OCI layouts
// and `docker save` archives made at test time (tests/images), imported,
// unpacked by the overlayfs snapshotter, run, removed without a trace;
// broken archives refused with nothing left behind.
#include "containerd/containerd.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/process.h"
#include "containerd/cni.h"
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
    for (const char* applet :
         {"sh", "echo", "sleep", "touch", "cat", "ip", "ping"})
      std::filesystem::create_symlink("busybox", rootfs_ + "/bin/" + applet);
    auto usage = client_->CountUsage();
    ASSERT_TRUE(usage.ok()) << usage.status();
    EXPECT_EQ(usage->containers + usage->images + usage->content_blobs +
                  usage->snapshots + usage->leases,
              0u);
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

  // An image archive of the busybox root and a layer on top of it (a file
  // and a script), made by tests/images/make-oci-image.sh.
  std::string MakeImage(const std::string& name, const std::string& format,
                        bool gzip = false) {
    std::string top = dir_ + "/top-" + format;
    std::filesystem::create_directories(top + "/etc");
    std::ofstream(top + "/etc/greeting") << "hello from the top layer\n";
    std::ofstream(top + "/run.sh") << "cat /etc/greeting; echo \"$@\" $WHO\n";
    std::string out = dir_ + "/" + format + ".tar";
    auto r = silt::testing::RunCommand({SILT_SOURCE_DIR
                                        "/tests/images/make-oci-image.sh",
                                        "--name",
                                        name,
                                        "--layer",
                                        rootfs_,
                                        "--layer",
                                        top,
                                        "-o",
                                        out,
                                        "--format",
                                        format,
                                        "--entrypoint",
                                        R"(["/bin/sh","/run.sh"])",
                                        "--cmd",
                                        R"(["args"])",
                                        "--env",
                                        "PATH=/bin",
                                        "--env",
                                        "WHO=image",
                                        "--port",
                                        "8080/tcp"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (gzip) {
      EXPECT_EQ(silt::testing::RunCommand({"/bin/gzip", "-n", out}).exit_code,
                0);
      out += ".gz";
    }
    return out;
  }

  Client::Usage Usage() {
    auto u = client_->CountUsage();
    EXPECT_TRUE(u.ok()) << u.status();
    return u.ok() ? *u : Client::Usage{};
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
  // The log has both streams (each in its order); the root is read-only,
  // /tmp is not. (The shim copies each stream to the file on its own and may
  // finish the copy after the task is deleted: the log is polled.)
  std::string log;
  auto whole = [&] {
    log = ReadFile(spec.log_path);
    for (const char* line : {"hello from silt\n", "Read-only file system\n",
                             "root is ro\n", "tmp is rw\n"})
      if (!absl::StrContains(log, line)) return false;
    return true;
  };
  EXPECT_TRUE(silt::testing::Eventually(whole)) << log;
  EXPECT_EQ(client_->Delete("hello").code(), absl::StatusCode::kNotFound);
}

TEST_F(ContainerdTest, DeletingARunningContainerKillsIt) {
  ASSERT_TRUE(client_->Create(Spec("sleeper", "sleep 600")).ok());
  ASSERT_TRUE(client_->Start("sleeper").ok());
  auto waited = client_->Wait("sleeper", std::chrono::milliseconds(200));
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kDeadlineExceeded)
      << waited.status();
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

TEST_F(ContainerdTest, ImportsAnOciLayoutAndRunsItsImage) {
  auto images = client_->Import(MakeImage("silt/hello:1", "oci"));
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_EQ(images->size(), 1u);
  const Image& image = (*images)[0];
  EXPECT_EQ(image.name, "docker.io/silt/hello:1");
  EXPECT_EQ(image.entrypoint, (std::vector<std::string>{"/bin/sh", "/run.sh"}));
  EXPECT_EQ(image.cmd, std::vector<std::string>{"args"});
  EXPECT_EQ(image.env, (std::vector<std::string>{"PATH=/bin", "WHO=image"}));
  EXPECT_EQ(image.exposed_ports, std::vector<std::string>{"8080/tcp"});
  EXPECT_GT(image.size, 100'000u);  // busybox, gzipped
  auto got = client_->GetImage("silt/hello:1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->digest, image.digest);
  EXPECT_EQ(got->chain_id, image.chain_id);
  EXPECT_EQ(got->size, image.size);
  EXPECT_EQ(client_->GetImage("silt/hello:2").status().code(),
            absl::StatusCode::kNotFound);
  Client::Usage with_image = Usage();
  EXPECT_EQ(with_image.images, 1u);
  EXPECT_EQ(with_image.content_blobs, 4u);  // manifest, config, 2 layers
  EXPECT_EQ(with_image.snapshots, 2u);      // one per layer
  EXPECT_EQ(with_image.leases, 0u);

  // Containers on the image, one with a read-only root, one writable.
  ContainerSpec spec;
  spec.image = "silt/hello:1";
  spec.args = {"/bin/sh", "-c",
               "/bin/sh /run.sh from-image; touch /new && echo root is rw"};
  spec.env = image.env;
  for (bool ro : {true, false}) {
    spec.id = ro ? "ro" : "rw";
    spec.read_only_root = ro;
    spec.log_path = dir_ + "/" + spec.id + ".log";
    ASSERT_TRUE(client_->Create(spec).ok());
    ASSERT_TRUE(client_->Start(spec.id).ok());
    auto exit = client_->Wait(spec.id, seconds(30));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_EQ(*exit, ro ? 1u : 0u);
    ASSERT_TRUE(client_->Delete(spec.id).ok());
    std::string log = ReadFile(spec.log_path);
    EXPECT_TRUE(absl::StrContains(log, "hello from the top layer\n")) << log;
    EXPECT_TRUE(absl::StrContains(log, "from-image image\n")) << log;
    EXPECT_EQ(absl::StrContains(log, "root is rw"), !ro) << log;
  }
  // A container's root goes with it; the image stays until removed.
  EXPECT_EQ(Usage().snapshots, 2u);
  ASSERT_TRUE(client_->RemoveImage("docker.io/silt/hello:1").ok());
  Client::Usage after = Usage();
  EXPECT_EQ(after.images + after.content_blobs + after.snapshots +
                after.leases + after.containers,
            0u);
  EXPECT_EQ(client_->RemoveImage("silt/hello:1").code(),
            absl::StatusCode::kNotFound);
  spec.id = "gone";
  EXPECT_EQ(client_->Create(spec).code(), absl::StatusCode::kNotFound);
}

TEST_F(ContainerdTest, ImportsAGzippedDockerSaveArchive) {
  auto images = client_->Import(MakeImage("hello", "docker", /*gzip=*/true));
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_EQ(images->size(), 1u);
  EXPECT_EQ((*images)[0].name, "docker.io/library/hello:latest");
  ContainerSpec spec;
  spec.id = "docker";
  spec.image = "hello";
  spec.args = {"/bin/sh", "/run.sh", "saved"};
  spec.env = {"PATH=/bin", "WHO=docker"};
  spec.log_path = dir_ + "/docker.log";
  ASSERT_TRUE(client_->Create(spec).ok());
  ASSERT_TRUE(client_->Start(spec.id).ok());
  auto exit = client_->Wait(spec.id, seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0u);
  ASSERT_TRUE(client_->Delete(spec.id).ok());
  EXPECT_EQ(ReadFile(spec.log_path),
            "hello from the top layer\nsaved docker\n");
  // Imported again: the same image, nothing stored twice.
  Client::Usage once = Usage();
  auto again = client_->Import(dir_ + "/docker.tar.gz");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0].digest, (*images)[0].digest);
  Client::Usage twice = Usage();
  EXPECT_EQ(twice.content_blobs, once.content_blobs);
  EXPECT_EQ(twice.snapshots, once.snapshots);
  auto list = client_->ListImages();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "docker.io/library/hello:latest");
  ASSERT_TRUE(client_->RemoveImage("hello").ok());
  EXPECT_EQ(Usage().content_blobs, 0u);
}

TEST_F(ContainerdTest, RefusesBrokenArchivesLeavingNothing) {
  std::string good = MakeImage("silt/broken:1", "oci");
  auto refused = [&](const std::string& path, const std::string& why) {
    auto r = client_->Import(path);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << path << ": " << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), why))
        << r.status().message();
    Client::Usage u = Usage();
    EXPECT_EQ(u.images + u.content_blobs + u.snapshots + u.leases, 0u) << path;
  };
  // Cut short.
  std::string cut = dir_ + "/cut.tar";
  std::filesystem::copy_file(good, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(good) / 2);
  refused(cut, "ends");
  // Not a tar.
  std::ofstream(dir_ + "/text.tar") << std::string(2048, 'x');
  refused(dir_ + "/text.tar", "not a tar archive");
  // A tar of something else.
  std::string other = dir_ + "/other.tar";
  ASSERT_EQ(silt::testing::RunCommand(
                {"/bin/tar", "-C", rootfs_, "-cf", other, "bin/busybox"})
                .exit_code,
            0);
  refused(other, "neither an OCI image layout");
  // A blob that is not what its name says.
  std::string x = dir_ + "/x";
  std::filesystem::create_directories(x);
  ASSERT_EQ(
      silt::testing::RunCommand({"/bin/tar", "-C", x, "-xf", good}).exit_code,
      0);
  std::string blob;
  for (const auto& e : std::filesystem::directory_iterator(x + "/blobs/sha256"))
    if (std::filesystem::file_size(e.path()) > 100'000) blob = e.path();
  ASSERT_FALSE(blob.empty());
  std::ofstream(blob, std::ios::app) << "tampered";
  std::string tampered = dir_ + "/tampered.tar";
  ASSERT_EQ(
      silt::testing::RunCommand({"/bin/tar", "-C", x, "-cf", tampered, "."})
          .exit_code,
      0);
  refused(tampered, "does not match its digest");
  // The good one still imports.
  EXPECT_TRUE(client_->Import(good).ok());
}

TEST_F(ContainerdTest, ContainersGetAnAddressOnTheBridgeThroughCni) {
  if (access("/usr/lib/cni/bridge", X_OK) != 0)
    GTEST_SKIP() << "containernetworking-plugins is not installed: run "
                    "deploy/setup.sh";
  // A network of this test process's own (ctest runs tests at once), with
  // a bridge and subnet of its own, removed at its end.
  ASSERT_EQ(unshare(CLONE_NEWNET), 0) << strerror(errno);
  std::string bridge = absl::StrCat("silt-t", getpid() % 100000);
  CniOptions o;
  o.bridge = bridge;
  o.subnet = "10.199.7.0/24";
  o.state_dir = dir_ + "/cni";
  auto cni = Cni::Create(o);
  ASSERT_TRUE(cni.ok()) << cni.status();
  struct DropBridge {
    std::string name;
    ~DropBridge() {
      silt::testing::RunCommand({"/usr/sbin/ip", "link", "del", name});
    }
  } drop{bridge};
  std::vector<std::string> addresses;
  for (const char* id : {"net-a", "net-b"}) {
    // The namespace first, held (its descriptor) until the plugins undid
    // their work; the container joins it.
    auto netns = NetworkNamespace::Create();
    ASSERT_TRUE(netns.ok()) << netns.status();
    auto ip = (*cni)->Add(id, netns->path());
    ASSERT_TRUE(ip.ok()) << ip.status();
    addresses.push_back(*ip);
    auto spec = Spec(id, "ip -4 addr show eth0; ping -c 1 -W 5 10.199.7.1");
    spec.netns = netns->path();
    ASSERT_TRUE(client_->Create(spec).ok());
    auto pid = client_->Pid(id);
    ASSERT_TRUE(pid.ok()) << pid.status();
    EXPECT_GT(*pid, 0);
    ASSERT_TRUE(client_->Start(id).ok());
    auto exit = client_->Wait(id, seconds(30));
    ASSERT_TRUE(exit.ok()) << exit.status();
    ASSERT_TRUE(client_->Delete(id).ok());
    // After the container: the held namespace still has the interface.
    EXPECT_TRUE((*cni)->Del(id, netns->path()).ok());
    std::string log = ReadFile(dir_ + "/" + id + ".log");
    EXPECT_EQ(*exit, 0u) << log;  // reached the bridge (its gateway)
    EXPECT_TRUE(absl::StrContains(log, "inet " + *ip + "/24")) << log;
  }
  EXPECT_TRUE(absl::StartsWith(addresses[0], "10.199.7."));
  EXPECT_NE(addresses[0], addresses[1]);
  // The node's one masquerading rule is all there is for the subnet, and
  // goes with Unmasquerade; a second Del, without the namespace, is no
  // error.
  auto rules =
      silt::testing::RunCommand({"/usr/sbin/iptables", "-t", "nat", "-S"});
  size_t n = 0;
  for (absl::string_view line : absl::StrSplit(rules.out, '\n'))
    n += absl::StrContains(line, "10.199.7.");
  EXPECT_EQ(n, 1u) << rules.out;
  EXPECT_TRUE((*cni)->Del("net-a", "").ok());
  EXPECT_TRUE((*cni)->Unmasquerade().ok());
  rules = silt::testing::RunCommand({"/usr/sbin/iptables", "-t", "nat", "-S"});
  EXPECT_FALSE(absl::StrContains(rules.out, "10.199.7.")) << rules.out;
}

// GET / of an HTTP server on 127.0.0.1:8080 in network namespace `ns`: its
// answer, "" when there is none.
std::string GetIn(const NetworkNamespace& ns) {
  std::string answer;
  std::thread([&] {
    int nsfd = open(ns.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) return;
    close(nsfd);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(8080);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      std::string req = "GET / HTTP/1.0\r\n\r\n";
      if (write(fd, req.data(), req.size()) == ssize_t(req.size())) {
        char buf[4096];
        for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;)
          answer.append(buf, size_t(n));
      }
    }
    close(fd);
  }).join();
  return answer;
}

TEST_F(ContainerdTest, ACheckpointedServerIsRestoredIntoANewNetwork) {
  std::filesystem::create_directories(rootfs_ + "/www");
  std::ofstream(rootfs_ + "/www/index.html") << "served\n";
  std::filesystem::create_symlink("busybox", rootfs_ + "/bin/httpd");
  auto a = NetworkNamespace::Create();
  ASSERT_TRUE(a.ok()) << a.status();
  auto spec = Spec("srv-1", "exec httpd -f -p 8080 -h /www");
  spec.netns = a->path();
  ASSERT_TRUE(client_->Create(spec).ok());
  ASSERT_TRUE(client_->Start("srv-1").ok());
  ASSERT_TRUE(silt::testing::Eventually(
      [&] { return absl::StrContains(GetIn(*a), "served"); }));
  std::string images = dir_ + "/ckpt";
  auto s = client_->Checkpoint("srv-1", images);
  ASSERT_TRUE(s.ok()) << s;
  // Still serving; a second container restored from it, in a network of
  // its own, serves too.
  EXPECT_TRUE(absl::StrContains(GetIn(*a), "served"));
  auto b = NetworkNamespace::Create();
  ASSERT_TRUE(b.ok()) << b.status();
  auto restored = Spec("srv-2", "exit 1");  // not run: restored
  restored.netns = b->path();
  restored.restore_from = images;
  s = client_->Create(restored);
  ASSERT_TRUE(s.ok()) << s;
  s = client_->Start("srv-2");
  EXPECT_TRUE(s.ok()) << s
                      << ReadFile(images + ".work/restore.log").substr(0, 3000);
  EXPECT_TRUE(silt::testing::Eventually(
      [&] { return absl::StrContains(GetIn(*b), "served"); }));
  EXPECT_TRUE(client_->Delete("srv-1").ok());
  EXPECT_TRUE(client_->Delete("srv-2").ok());
}

TEST(ImageNameTest, NormalizesAsDockerAndContainerdDo) {
  EXPECT_EQ(*NormalizeImageName("hello"), "docker.io/library/hello:latest");
  EXPECT_EQ(*NormalizeImageName("me/x:1"), "docker.io/me/x:1");
  EXPECT_EQ(*NormalizeImageName("ghcr.io/a/b"), "ghcr.io/a/b:latest");
  EXPECT_EQ(*NormalizeImageName("localhost:5000/f:2"), "localhost:5000/f:2");
  EXPECT_EQ(*NormalizeImageName("docker.io/library/hello:latest"),
            "docker.io/library/hello:latest");
  std::string d = "sha256:" + std::string(64, 'a');
  EXPECT_EQ(*NormalizeImageName("x@" + d), "docker.io/library/x@" + d);
  for (const char* bad : {"", "Hello", "a b", "x:", "/x", "x//y", "x@md5:1"})
    EXPECT_EQ(NormalizeImageName(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
}

}  // namespace
}  // namespace silt::containerd
