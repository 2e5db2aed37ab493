#include "sandbox.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sanitizer/asan_interface.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "mount_flags.h"
#include "seccomp_policy.h"

namespace silt::invoker {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- the child ----

constexpr int kMaxMounts = 16;
constexpr int kMaxArgs = 256;

// The character devices (major 1) every sandbox's /dev holds.
constexpr std::pair<const char*, unsigned> kDevices[] = {
    {"null", 3}, {"zero", 5}, {"full", 7}, {"random", 8}, {"urandom", 9}};

// The sandbox root's mount points and links (the same for a spawn and a CRIU
// restore skeleton).
struct Layout {
  std::vector<std::string> dirs;
  std::vector<std::pair<std::string, std::string>> links;  // target, path
  std::vector<std::string> bound_tops;  // /bin etc. when not links to /usr
};

const Layout& RootLayout() {
  static const Layout* layout = [] {
    auto* l = new Layout;
    // /.oldroot: where pivot_root puts the host's root (then unmounted).
    l->dirs = {"/.oldroot",
               "/proc",
               "/tmp",
               "/dev",
               "/usr",
               "/etc",
               "/var",
               "/var/silt",
               "/var/silt/bin",
               "/var/silt/bundle",
               "/var/silt/run",
               "/var/openfaas",
               "/var/openfaas/secrets"};
    // Debian 12 merges /bin, /sbin, /lib* into /usr: keep them as links, else
    // bind them.
    for (const char* top :
         {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
      std::error_code ec;
      auto st = std::filesystem::symlink_status(top, ec);
      if (ec || !std::filesystem::exists(st)) continue;
      if (std::filesystem::is_symlink(st)) {
        l->links.emplace_back(std::filesystem::read_symlink(top).string(), top);
      } else {
        l->dirs.push_back(top);
        l->bound_tops.push_back(top);
      }
    }
    return l;
  }();
  return *layout;
}

constexpr uint32_t kFirstHostId = 1u << 30;

// The flags of the mount holding `path` that a bind of it inside a user
// namespace must keep when remounted.
unsigned long LockedFlags(const std::string& path) {
  struct statvfs st;
  if (statvfs(path.c_str(), &st) != 0) return 0;
  return KeptMountFlags(st);
}

int HoldNamespace(void*) {
  for (;;) pause();
}

absl::Status WriteMap(pid_t pid, const char* which, uint32_t host_id) {
  std::string path = absl::StrCat("/proc/", pid, "/", which);
  std::string line = absl::StrCat(kInstanceId, " ", host_id, " 1\n");
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  bool ok = fd >= 0 && write(fd, line.data(), line.size()) ==
                           static_cast<ssize_t>(line.size());
  int err = errno;
  if (fd >= 0) close(fd);
  if (!ok)
    return absl::InternalError(
        absl::StrCat("writing ", path, ": ", strerror(err)));
  return absl::OkStatus();
}

// Unmaps a stack that CLONE_VM children ran on. Under ASan it first clears
// what their frames left poisoned in the shared shadow (they end in exec or
// _exit, which ASan never sees return): the addresses come back as other
// mappings, such as shard arenas, where stale stack redzones would be reported
// as stack-buffer-underflow. A no-op in other builds.
void UnmapCloneStack(void* stack, size_t size) {
  ASAN_UNPOISON_MEMORY_REGION(stack, size);
  munmap(stack, size);
}

// A user namespace owned by root in which kInstanceId (uid and gid) is
// `host_id`: a short-lived child creates it, we map it and keep its fd.
absl::StatusOr<int> MakeUserns(uint32_t host_id) {
  constexpr size_t kStack = 64 << 10;
  void* stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED)
    return absl::ResourceExhaustedError("mmap of a clone stack failed");
  pid_t pid = clone(HoldNamespace, static_cast<char*>(stack) + kStack,
                    CLONE_NEWUSER | CLONE_VM | SIGCHLD, nullptr);
  if (pid < 0) {
    int err = errno;
    munmap(stack, kStack);
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create a user namespace for instances (", strerror(err),
        "): are user namespaces enabled (sysctl user.max_user_namespaces)?"));
  }
  absl::Status s = WriteMap(pid, "uid_map", host_id);
  if (s.ok()) s = WriteMap(pid, "gid_map", host_id);
  int fd = -1;
  if (s.ok()) {
    std::string ns = absl::StrCat("/proc/", pid, "/ns/user");
    fd = open(ns.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      s = absl::InternalError(
          absl::StrCat("opening ", ns, ": ", strerror(errno)));
  }
  kill(pid, SIGKILL);
  while (waitpid(pid, nullptr, __WALL) < 0 && errno == EINTR) {
  }
  UnmapCloneStack(stack, kStack);
  if (!s.ok()) return s;
  return fd;
}

// One user namespace per host id, made at its first instance and kept for the
// life of the process.
absl::StatusOr<int> UsernsFor(uint32_t host_id) {
  static std::mutex mu;
  static auto* fds = new std::map<uint32_t, int>();
  std::lock_guard<std::mutex> l(mu);
  if (auto it = fds->find(host_id); it != fds->end()) return it->second;
  auto fd = MakeUserns(host_id);
  if (fd.ok()) (*fds)[host_id] = *fd;
  return fd;
}

struct ChildArgs {
  // Everything is prepared by the parent: the children only make syscalls
  // (they share the parent's memory until the sandbox execs).
  int channel_fd, stdout_fd, stderr_fd, err_fd, devnull_fd, userns_fd;
  int netns_fd;                 // -1: a new network namespace
  const char* cgroup_procs[4];  // joined first, by writing "0"
  int cgroup_count;
  const char* root;      // the skeleton (PrepareRootSkeleton), bound on itself
  const char* old_root;  // root + "/.oldroot"
  const char* hostname;
  struct Bind {
    const char* src;
    const char* dst;
    bool rw;
    // The source mount's flags that a mount in a user namespace may not
    // drop (nodev, noexec, nosuid, atime): kept by the read-only remount.
    unsigned long locked;
  } binds[kMaxMounts];
  int bind_count;
  unsigned long root_locked;
  const char* proc_dir;
  const char* proc_opts;
  int last_cap;
  char* const* argv;
  char* const* envp;
  char* sandbox_stack;  // top of the sandbox's clone stack
  pid_t sandbox_pid;    // written by EnterUserns
  int sandbox_errno;
};

[[noreturn]] void ChildFail(const ChildArgs* a, int step) {
  int err[2] = {step, errno};
  (void)!write(a->err_fd, err, sizeof(err));
  _exit(127);
}

// The sandbox: pid 1 of namespaces that belong to the function's user
// namespace. Sets up its view of the system, drops everything, execs.
int SandboxMain(void* arg) {
  const ChildArgs* a = static_cast<const ChildArgs*>(arg);
  // fds: 0 /dev/null, 1 stdout, 2 stderr, 3 channel, 4 err; nothing else
  // survives. Copy each above 64 first (F_DUPFD never clobbers an open fd),
  // then into place.
  const int sources[5] = {a->devnull_fd, a->stdout_fd, a->stderr_fd,
                          a->channel_fd, a->err_fd};
  int copies[5];
  for (int i = 0; i < 5; ++i) {
    copies[i] = fcntl(sources[i], F_DUPFD, 64);
    if (copies[i] < 0) _exit(126);
  }
  for (int i = 0; i < 5; ++i) {
    if (dup2(copies[i], i) < 0) _exit(126);
  }
  ChildArgs local = *a;
  local.err_fd = 4;
  a = &local;
  syscall(SYS_close_range, 5, ~0U, 0);
  fcntl(4, F_SETFD, FD_CLOEXEC);

  // Our own session: a checkpoint must not depend on a session leader outside
  // the sandbox.
  if (setsid() < 0) ChildFail(a, 28);

  // Until the ids change below this is host uid 0 (unmapped here): host
  // directories are reached through their owner's bits, and nothing is
  // created on a filesystem mounted in here (the parent made every mount
  // point).
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    ChildFail(a, 2);
  if (mount(a->root, a->root, nullptr, MS_BIND, nullptr) != 0) ChildFail(a, 3);
  for (int i = 0; i < a->bind_count; ++i) {
    const auto& b = a->binds[i];
    if (mount(b.src, b.dst, nullptr, MS_BIND | MS_REC, nullptr) != 0)
      ChildFail(a, 7);
    if (mount(nullptr, b.dst, nullptr,
              MS_REMOUNT | MS_BIND | MS_NOSUID | b.locked |
                  (b.rw ? 0 : MS_RDONLY),
              nullptr) != 0)
      ChildFail(a, 8);
  }
  if (mount("proc", a->proc_dir, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
            a->proc_opts) != 0)
    ChildFail(a, 9);
  if (chdir(a->root) != 0) ChildFail(a, 11);
  if (syscall(SYS_pivot_root, ".", ".oldroot") != 0) ChildFail(a, 12);
  if (chdir("/") != 0) ChildFail(a, 13);
  if (umount2("/.oldroot", MNT_DETACH) != 0) ChildFail(a, 14);
  // stdin: the sandbox's own /dev/null, so that no fd refers to a host mount.
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0 || dup2(devnull, 0) < 0) ChildFail(a, 29);
  close(devnull);
  if (mount(nullptr, "/", nullptr,
            MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV |
                a->root_locked,
            nullptr) != 0)
    ChildFail(a, 16);
  if (sethostname(a->hostname, strlen(a->hostname)) != 0) ChildFail(a, 17);

  // Loopback up in the private network namespace (a joined one has it).
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) ChildFail(a, 18);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  memcpy(ifr.ifr_name, "lo", 3);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) ChildFail(a, 19);
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  if (a->netns_fd < 0 && ioctl(s, SIOCSIFFLAGS, &ifr) != 0) ChildFail(a, 20);
  close(s);

  // No capabilities, unprivileged ids, no new privileges, seccomp.
  for (int cap = 0; cap <= a->last_cap; ++cap) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
      ChildFail(a, 21);
  }
  // Raw syscalls: glibc's wrappers broadcast id changes to every thread they
  // believe exists, and the threads of the (multithreaded) parent do not exist
  // here: they would wait for them forever.
  if (syscall(SYS_setgroups, 0, nullptr) != 0) ChildFail(a, 22);
  if (syscall(SYS_setresgid, kInstanceId, kInstanceId, kInstanceId) != 0)
    ChildFail(a, 23);
  if (syscall(SYS_setresuid, kInstanceId, kInstanceId, kInstanceId) != 0)
    ChildFail(a, 24);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ChildFail(a, 25);
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &SeccompFilter()) != 0)
    ChildFail(a, 26);
  execve(a->argv[0], a->argv, a->envp);
  ChildFail(a, 27);
}

// First child, in the invoker's namespaces: joins the instance's cgroups and
// the function's user namespace, then clones the sandbox as the invoker's
// own child (CLONE_PARENT) with new namespaces, which therefore belong to
// that user namespace: CRIU checkpoints only trees whose namespaces all
// belong to their user namespace, and root, which owns it, may checkpoint
// them. It waits (CLONE_VFORK) until the sandbox has exec'd or failed.
int EnterUserns(void* arg) {
  ChildArgs* a = static_cast<ChildArgs*>(arg);
  // Into the cgroup before anything is allocated ("0": the writer).
  for (int i = 0; i < a->cgroup_count; ++i) {
    int fd = open(a->cgroup_procs[i], O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1) ChildFail(a, 1);
    close(fd);
  }
  // A given network namespace is joined while still root out here: it
  // belongs to the host's user namespace.
  if (a->netns_fd >= 0 && setns(a->netns_fd, CLONE_NEWNET) != 0)
    ChildFail(a, 31);
  if (setns(a->userns_fd, CLONE_NEWUSER) != 0) ChildFail(a, 30);
  pid_t pid = clone(SandboxMain, a->sandbox_stack,
                    CLONE_VM | CLONE_VFORK | CLONE_PARENT | CLONE_NEWPID |
                        CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS |
                        (a->netns_fd >= 0 ? 0 : CLONE_NEWNET),
                    a);
  a->sandbox_errno = errno;
  a->sandbox_pid = pid;
  _exit(0);
}

const char* StepName(int step) {
  static const char* names[] = {"",
                                "joining the cgroup",
                                "making mounts private",
                                "binding the root",
                                "creating mount points",
                                "creating symlinks",
                                "creating /dev",
                                "bind mount",
                                "read-only remount",
                                "mounting /proc",
                                "mounting /tmp",
                                "chdir to the new root",
                                "pivot_root",
                                "chdir /",
                                "unmounting the old root",
                                "removing the old root",
                                "read-only root",
                                "sethostname",
                                "socket for loopback",
                                "reading loopback flags",
                                "bringing loopback up",
                                "dropping capabilities",
                                "setgroups",
                                "setresgid",
                                "setresuid",
                                "no_new_privs",
                                "installing seccomp",
                                "execve",
                                "setsid",
                                "opening /dev/null",
                                "joining the user namespace",
                                "joining the network namespace"};
  return step > 0 && step < static_cast<int>(std::size(names)) ? names[step]
                                                               : "unknown step";
}

}  // namespace

uint32_t HostIdOf(std::string_view ns, std::string_view name) {
  // FNV-1a over "ns/name": stable across builds and machines.
  uint32_t h = 2166136261u;
  auto mix = [&](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 16777619u;
  };
  mix(ns);
  mix("/");
  mix(name);
  return kFirstHostId + (h & ((1u << 28) - 1));
}

// ---- SandboxedProcess ----

namespace {

// <linux/pidfd.h> as of Linux 6.15 (PIDFD_INFO_SIZE_VER0), which Debian 12's
// headers predate.
struct PidfdInfo {
  uint64_t mask = 0;
  uint64_t cgroupid = 0;
  uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  int32_t exit_code = 0;
};
static_assert(sizeof(PidfdInfo) == 64);
constexpr uint64_t kPidfdInfoExit = 1u << 3;
constexpr unsigned long kPidfdGetInfo = _IOWR(0xFF, 11, PidfdInfo);

// The wait status an exited clone ended with. Only its parent, inside its
// sandbox, can wait for it: once the parent has reaped it the kernel keeps
// the status for holders of its pidfd (PIDFD_INFO_EXIT, Linux 6.15+); until
// then, a zombie's /proc/PID/stat has it (read between two asks of the
// pidfd, so that the PID cannot have been reaped and reused meanwhile).
std::optional<int> CloneExitStatus(int pidfd, pid_t pid) {
  auto reaped = [pidfd]() -> std::optional<int> {
    PidfdInfo info;
    info.mask = kPidfdInfoExit;
    if (ioctl(pidfd, kPidfdGetInfo, &info) == 0 && (info.mask & kPidfdInfoExit))
      return info.exit_code;
    return std::nullopt;
  };
  if (auto st = reaped()) return st;
  std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  if (auto st = reaped()) return st;
  // "pid (comm) state ...": exit_code is the 52nd field, the 50th after comm.
  size_t close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return std::nullopt;
  std::vector<absl::string_view> f = absl::StrSplit(
      absl::string_view(stat).substr(close_paren + 1), ' ', absl::SkipEmpty());
  int code = 0;
  if (f.size() < 50 || f[0] != "Z" ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(f[49]), &code))
    return std::nullopt;
  return code;
}

}  // namespace

SandboxedProcess::~SandboxedProcess() { Kill(); }

int SandboxedProcess::Kill() {
  if (pidfd_ >= 0) {
    if (!reaped_) {
      syscall(SYS_pidfd_send_signal, pidfd_, SIGKILL, nullptr, 0);
      pollfd p{pidfd_, POLLIN, 0};
      while (poll(&p, 1, 5000) < 0 && errno == EINTR) {
      }
      reaped_ = true;
      status_ = CloneExitStatus(pidfd_, pid_).value_or(SIGKILL);
    }
    close(pidfd_);
    pidfd_ = -1;
    return status_;
  }
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    while (waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
  }
  return status_;
}

std::optional<int> SandboxedProcess::Poll() {
  if (reaped_) return status_;
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    if (poll(&p, 1, 0) == 1) {
      reaped_ = true;
      status_ = CloneExitStatus(pidfd_, pid_).value_or(SIGKILL);
      return status_;
    }
    return std::nullopt;
  }
  int st = 0;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    status_ = st;
    return st;
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<SandboxedProcess>> SandboxedProcess::Adopt(
    pid_t pid, std::unique_ptr<Cgroup> cgroup) {
  auto proc = std::unique_ptr<SandboxedProcess>(new SandboxedProcess());
  proc->pid_ = pid;
  proc->cgroup_ = std::move(cgroup);
  for (pid_t p : ProcessTree(pid)) {
    if (auto s = proc->cgroup_->AddProcess(p); !s.ok()) return s;
  }
  return proc;
}

absl::StatusOr<std::unique_ptr<SandboxedProcess>> SandboxedProcess::AdoptClone(
    pid_t pid, std::unique_ptr<Cgroup> cgroup) {
  auto proc = std::unique_ptr<SandboxedProcess>(new SandboxedProcess());
  proc->pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (proc->pidfd_ < 0)
    return absl::UnavailableError(
        absl::StrCat("pidfd_open(", pid, "): ", strerror(errno)));
  proc->pid_ = pid;
  proc->cgroup_ = std::move(cgroup);
  if (auto s = proc->cgroup_->AddProcess(pid); !s.ok()) return s;
  return proc;
}

std::vector<pid_t> ProcessTree(pid_t pid) {
  std::vector<pid_t> out{pid};
  for (size_t i = 0; i < out.size(); ++i) {
    std::string dir = absl::StrCat("/proc/", out[i], "/task");
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator(dir, ec)) {
      std::string kids = ReadFile(t.path().string() + "/children");
      for (absl::string_view k : absl::StrSplit(kids, ' ', absl::SkipEmpty())) {
        int c = 0;
        if (absl::SimpleAtoi(k, &c) && c > 0) out.push_back(c);
      }
    }
  }
  return out;
}

absl::StatusOr<int> PrepareGpuDevDir(const std::string& dir,
                                     const std::string& host_dev) {
  if (auto s = PrepareDevDir(dir); !s.ok()) return s;
  int copied = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(host_dev, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("nvidia", 0) != 0) continue;
    struct stat st;
    if (stat(e.path().c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) continue;
    const std::string path = dir + "/" + name;
    struct stat have;
    if (stat(path.c_str(), &have) == 0 && S_ISCHR(have.st_mode) &&
        have.st_rdev == st.st_rdev) {
      ++copied;
      continue;
    }
    unlink(path.c_str());
    if (mknod(path.c_str(), S_IFCHR | 0666, st.st_rdev) != 0 ||
        chmod(path.c_str(), 0666) != 0)
      return absl::InternalError(
          absl::StrCat("mknod ", path, ": ", strerror(errno)));
    ++copied;
  }
  return copied;
}

absl::Status PrepareDevDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  struct statvfs vfs;
  if (statvfs(dir.c_str(), &vfs) == 0 && (vfs.f_flag & ST_NODEV)) {
    // Devices do not open on this filesystem: hold them in a small tmpfs of
    // our own instead.
    if (mount("silt-dev", dir.c_str(), "tmpfs", MS_NOSUID | MS_NOEXEC,
              "mode=0755,size=64k") != 0)
      return absl::FailedPreconditionError(
          absl::StrCat(dir,
                       " is on a nodev filesystem and a tmpfs for "
                       "device nodes cannot be mounted there: ",
                       strerror(errno)));
  }
  chmod(dir.c_str(), 0755);
  for (const auto& [name, minor] : kDevices) {
    std::string path = dir + "/" + name;
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode) &&
        st.st_rdev == makedev(1, minor))
      continue;
    unlink(path.c_str());
    if (mknod(path.c_str(), S_IFCHR | 0666, makedev(1, minor)) != 0 ||
        chmod(path.c_str(), 0666) != 0)
      return absl::InternalError(
          absl::StrCat("mknod ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TraversableBinds>> TraversableBinds::Make(
    const std::string& name,
    const std::vector<std::pair<std::string, std::string>>& dirs) {
  std::unique_ptr<TraversableBinds> b(new TraversableBinds());
  constexpr char kTop[] = "/run/silt-criu";
  b->root_ = absl::StrCat(kTop, "/", name);
  std::error_code ec;
  std::filesystem::create_directories(b->root_, ec);
  for (const std::string& d : {std::string(kTop), b->root_}) {
    if (chmod(d.c_str(), 0711) != 0)
      return absl::InternalError(
          absl::StrCat("cannot make ", d, ": ", strerror(errno)));
  }
  for (const auto& [key, dir] : dirs) {
    std::string at = b->PathOf(key);
    if (mkdir(at.c_str(), 0700) != 0 && errno != EEXIST)
      return absl::InternalError(
          absl::StrCat("mkdir ", at, ": ", strerror(errno)));
    if (mount(dir.c_str(), at.c_str(), nullptr, MS_BIND, nullptr) != 0)
      return absl::InternalError(
          absl::StrCat("binding ", dir, " at ", at, ": ", strerror(errno)));
    b->bound_.push_back(at);
  }
  return b;
}

TraversableBinds::~TraversableBinds() {
  // rmdir only: never a recursive removal, which would reach into a source
  // whose unbinding failed.
  for (const auto& at : bound_) {
    umount2(at.c_str(), MNT_DETACH);
    rmdir(at.c_str());
  }
  rmdir(root_.c_str());
}

absl::Status MountTmp(const std::string& dir, uint64_t bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string opts = absl::StrCat("mode=1777,size=", bytes);
  if (mount("silt-tmp", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
            opts.c_str()) != 0)
    return absl::InternalError(
        absl::StrCat("mounting /tmp for an instance: ", strerror(errno)));
  return absl::OkStatus();
}

absl::Status LoopbackUp(pid_t pid) {
  absl::Status result = absl::OkStatus();
  // setns moves only the calling thread: use a short-lived one.
  std::thread t([&] {
    std::string path = absl::StrCat("/proc/", pid, "/ns/net");
    int ns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
      result = absl::InternalError(
          absl::StrCat("entering ", path, ": ", strerror(errno)));
      if (ns >= 0) close(ns);
      return;
    }
    close(ns);
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, "lo", 3);
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0) {
      result = absl::InternalError("reading loopback flags failed");
    } else {
      ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
      if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0)
        result = absl::InternalError("bringing loopback up failed");
    }
    if (s >= 0) close(s);
  });
  t.join();
  return result;
}

absl::Status PrepareRootSkeleton(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const auto& d : RootLayout().dirs)
    std::filesystem::create_directories(dir + d, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("sandbox root ", dir, ": ", ec.message()));
  for (const auto& [target, path] : RootLayout().links) {
    if (symlink(target.c_str(), (dir + path).c_str()) != 0 && errno != EEXIST)
      return absl::InternalError(
          absl::StrCat("sandbox root link ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SandboxedProcess>> Spawn(
    const SandboxSpec& spec) {
  if (geteuid() != 0)
    return absl::PermissionDeniedError(
        "sandboxed instances need root (namespaces, cgroups)");
  if (auto s = PrepareSeccomp(); !s.ok()) return s;
  if (spec.argv.empty() || spec.argv.size() >= kMaxArgs)
    return absl::InvalidArgumentError("sandbox argv is empty or too long");
  if (spec.host_id < kFirstHostId)
    return absl::InvalidArgumentError(
        "a sandbox needs the function's host id (HostIdOf)");
  auto userns = UsernsFor(spec.host_id);
  if (!userns.ok()) return userns.status();

  if (spec.dev_dir.empty() || spec.tmp_dir.empty())
    return absl::InvalidArgumentError(
        "a sandbox needs dev_dir (PrepareDevDir) and tmp_dir (MountTmp)");

  // Everything the children need, as stable strings.
  std::vector<std::string> strings;
  strings.reserve(128);
  auto keep = [&](std::string s) -> const char* {
    strings.push_back(std::move(s));
    return strings.back().c_str();
  };
  ChildArgs a{};
  a.root = keep(spec.root_dir);
  a.old_root = keep(spec.root_dir + "/.oldroot");
  a.root_locked = LockedFlags(spec.root_dir);
  a.hostname =
      keep(spec.hostname.empty() ? "silt" : spec.hostname.substr(0, 63));
  a.proc_dir = keep(spec.root_dir + "/proc");
  auto bind = [&](const std::string& src, const std::string& dst,
                  bool rw = false) {
    a.binds[a.bind_count++] = {keep(src), keep(spec.root_dir + dst), rw,
                               LockedFlags(src)};
  };
  bind("/usr", "/usr");
  bind("/etc", "/etc");
  for (const auto& top : RootLayout().bound_tops) bind(top, top);
  bind(spec.bundle_dir, kSandboxBundleDir);
  bind(spec.secrets_dir, kSandboxSecretsDir);
  bind(spec.worker_dir, kSandboxWorkerDir);
  // /dev (device nodes only) and /tmp (a tmpfs the invoker mounted) are bound
  // from the host: nothing can be created in here before the ids change, and
  // CRIU would archive a sandbox's own tmpfs with tar at every dump and
  // restore.
  bind(spec.dev_dir, "/dev");
  bind(spec.tmp_dir, "/tmp", /*rw=*/true);
  if (spec.snapshot_ready) {
    if (spec.run_dir.empty())
      return absl::InvalidArgumentError(
          "a snapshot-ready sandbox needs run_dir");
    // Read-only: the invoker makes the socket the worker connects to
    // (connecting needs no write access to the mount), and a writable host
    // directory would let a function fill the node's disk.
    bind(spec.run_dir, kSandboxRunDir);
  }
  // Snapshot-ready instances see processes only in /proc.
  a.proc_opts = spec.snapshot_ready ? "subset=pid" : nullptr;

  std::vector<char*> argv, envp;
  for (const auto& s : spec.argv) argv.push_back(const_cast<char*>(keep(s)));
  argv.push_back(nullptr);
  for (const auto& s : spec.env) envp.push_back(const_cast<char*>(keep(s)));
  envp.push_back(nullptr);
  a.argv = argv.data();
  a.envp = envp.data();
  a.last_cap = 40;
  {
    std::string text = ReadFile("/proc/sys/kernel/cap_last_cap");
    (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &a.last_cap);
  }

  struct Fd {
    int fd = -1;
    ~Fd() {
      if (fd >= 0) close(fd);
    }
  } netns;
  if (!spec.netns.empty()) {
    netns.fd = open(spec.netns.c_str(), O_RDONLY | O_CLOEXEC);
    if (netns.fd < 0)
      return absl::NotFoundError(absl::StrCat("network namespace ", spec.netns,
                                              ": ", strerror(errno)));
  }
  a.netns_fd = netns.fd;
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  a.channel_fd = spec.channel_fd;
  a.stdout_fd = spec.stdout_fd;
  a.stderr_fd = spec.stderr_fd;
  a.err_fd = err[1];
  a.devnull_fd = devnull;
  a.userns_fd = *userns;

  auto proc = std::unique_ptr<SandboxedProcess>(new SandboxedProcess());
  auto cg = Cgroup::Create(spec.cgroup, spec.memory_limit_bytes,
                           spec.cpu_millis, spec.max_pids);
  auto close_all = [&] {
    close(err[0]);
    close(err[1]);
    close(devnull);
  };
  if (!cg.ok()) {
    close_all();
    return cg.status();
  }
  proc->cgroup_ = *std::move(cg);
  std::vector<std::string> procs = proc->cgroup_->ProcsFiles();
  if (procs.size() > std::size(a.cgroup_procs)) {
    close_all();
    return absl::InternalError("too many cgroup hierarchies");
  }
  a.cgroup_count = 0;
  for (const auto& f : procs) a.cgroup_procs[a.cgroup_count++] = f.c_str();

  // Two stacks: EnterUserns's, then the sandbox's.
  constexpr size_t kStack = 256 << 10;
  char* stacks =
      static_cast<char*>(mmap(nullptr, 2 * kStack, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0));
  if (stacks == MAP_FAILED) {
    close_all();
    return absl::ResourceExhaustedError("mmap of the clone stacks failed");
  }
  a.sandbox_stack = stacks + 2 * kStack;
  a.sandbox_pid = -1;
  // CLONE_VM | CLONE_VFORK (as posix_spawn does): the children borrow our
  // memory until the sandbox execs, so no page tables of this large process
  // are copied (and torn down again at exec); we resume once EnterUserns has
  // exited, after the sandbox exec'd or failed.
  pid_t enter =
      clone(EnterUserns, stacks + kStack, CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
  int clone_errno = errno;
  if (enter > 0) {
    while (waitpid(enter, nullptr, __WALL) < 0 && errno == EINTR) {
    }
  }
  UnmapCloneStack(stacks, 2 * kStack);
  close(err[1]);
  close(devnull);
  if (enter < 0 || a.sandbox_pid < 0) {
    int report[2] = {0, 0};
    ssize_t n = read(err[0], report, sizeof(report));
    close(err[0]);
    if (n > 0)
      return absl::InternalError(absl::StrCat("sandbox set-up failed at ",
                                              StepName(report[0]), ": ",
                                              strerror(report[1])));
    return absl::InternalError(absl::StrCat(
        "clone: ", strerror(enter < 0 ? clone_errno : a.sandbox_errno)));
  }
  proc->pid_ = a.sandbox_pid;
  int report[2] = {0, 0};
  ssize_t n;
  while ((n = read(err[0], report, sizeof(report))) < 0 && errno == EINTR) {
  }
  close(err[0]);
  if (n > 0) {
    proc->Kill();
    return absl::InternalError(absl::StrCat("sandbox set-up failed at ",
                                            StepName(report[0]), ": ",
                                            strerror(report[1])));
  }
  return proc;
}

}  // namespace silt::invoker
