#include "seccomp_policy.h"

#include <seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace silt::invoker {
namespace {

// What the worker, glibc, libstdc++, Python and ordinary shell tools need.
// Everything else (mount, ptrace, unshare, setns, bpf, perf_event_open, keyctl,
// kexec, reboot, module loading, clock setting, swap, chroot, ...) kills the
// instance.
constexpr const char* kAllowedSyscalls[] = {
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "open",
    "openat",
    "openat2",
    "close",
    "close_range",
    "creat",
    "stat",
    "fstat",
    "lstat",
    "newfstatat",
    "statx",
    "statfs",
    "fstatfs",
    "lseek",
    "access",
    "faccessat",
    "faccessat2",
    "readlink",
    "readlinkat",
    "getdents",
    "getdents64",
    "getcwd",
    "chdir",
    "fchdir",
    "rename",
    "renameat",
    "renameat2",
    "mkdir",
    "mkdirat",
    "rmdir",
    "link",
    "linkat",
    "unlink",
    "unlinkat",
    "symlink",
    "symlinkat",
    "chmod",
    "fchmod",
    "fchmodat",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "umask",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "truncate",
    "ftruncate",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "fallocate",
    "flock",
    "fcntl",
    "dup",
    "dup2",
    "dup3",
    "pipe",
    "pipe2",
    "ioctl",
    "sendfile",
    "copy_file_range",
    "splice",
    "tee",
    "fadvise64",
    "readahead",
    "mknod",
    "mknodat",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "inotify_rm_watch",
    // memory
    "brk",
    "mmap",
    "munmap",
    "mremap",
    "mprotect",
    "madvise",
    "mincore",
    "msync",
    "mlock",
    "munlock",
    "mlock2",
    "memfd_create",
    "membarrier",
    "get_mempolicy",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    // processes and threads
    "clone",
    "clone3",
    "fork",
    "vfork",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "wait4",
    "waitid",
    "kill",
    "tkill",
    "tgkill",
    "getpid",
    "getppid",
    "gettid",
    "getpgrp",
    "getpgid",
    "setpgid",
    "getsid",
    "setsid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getresuid",
    "getresgid",
    "getgroups",
    "capget",
    "set_tid_address",
    "set_robust_list",
    "get_robust_list",
    "futex",
    "futex_waitv",
    "rseq",
    "arch_prctl",
    "prctl",
    "sched_yield",
    "sched_getaffinity",
    "sched_setaffinity",
    "sched_getparam",
    "sched_getscheduler",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "getpriority",
    "setpriority",
    "getrlimit",
    "setrlimit",
    "prlimit64",
    "getrusage",
    "times",
    "sysinfo",
    "uname",
    "personality",
    "restart_syscall",
    "pidfd_open",
    "pidfd_send_signal",
    // signals
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "rt_sigpending",
    "rt_sigtimedwait",
    "rt_sigsuspend",
    "rt_sigqueueinfo",
    "sigaltstack",
    "pause",
    "alarm",
    "signalfd",
    "signalfd4",
    // time
    "nanosleep",
    "clock_nanosleep",
    "clock_gettime",
    "clock_getres",
    "gettimeofday",
    "time",
    "getitimer",
    "setitimer",
    "timer_create",
    "timer_settime",
    "timer_gettime",
    "timer_getoverrun",
    "timer_delete",
    "timerfd_create",
    "timerfd_settime",
    "timerfd_gettime",
    // polling and events
    "select",
    "pselect6",
    "poll",
    "ppoll",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "eventfd",
    "eventfd2",
    // sockets (loopback only: the sandbox has its own network namespace)
    "socket",
    "socketpair",
    "bind",
    "listen",
    "accept",
    "accept4",
    "connect",
    "getsockname",
    "getpeername",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "shutdown",
    "setsockopt",
    "getsockopt",
    // misc
    "getrandom",
    "getcpu",
    // SysV/POSIX IPC inside the private IPC namespace
    "shmget",
    "shmat",
    "shmdt",
    "shmctl",
    "semget",
    "semop",
    "semctl",
    "semtimedop",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
};

struct SeccompProgram {
  std::vector<sock_filter> filter;
  sock_fprog prog{};
  absl::Status status;
};

const SeccompProgram& Seccomp() {
  static SeccompProgram* p = [] {
    auto* out = new SeccompProgram;
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
    if (ctx == nullptr) {
      out->status = absl::InternalError("seccomp_init failed");
      return out;
    }
    for (const char* name : kAllowedSyscalls) {
      int nr = seccomp_syscall_resolve_name(name);
      if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
      int rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
      if (rc < 0 && rc != -EEXIST) {
        out->status = absl::InternalError(
            absl::StrCat("seccomp_rule_add(", name, "): ", strerror(-rc)));
        seccomp_release(ctx);
        return out;
      }
    }
    int fd = memfd_create("silt-seccomp", MFD_CLOEXEC);
    int rc = fd < 0 ? -errno : seccomp_export_bpf(ctx, fd);
    seccomp_release(ctx);
    if (rc < 0) {
      out->status = absl::InternalError(
          absl::StrCat("seccomp_export_bpf: ", strerror(-rc)));
      if (fd >= 0) close(fd);
      return out;
    }
    off_t size = lseek(fd, 0, SEEK_END);
    out->filter.resize(static_cast<size_t>(size) / sizeof(sock_filter));
    if (pread(fd, out->filter.data(), static_cast<size_t>(size), 0) != size) {
      out->status =
          absl::InternalError("reading the seccomp program back failed");
    }
    close(fd);
    out->prog.len = static_cast<unsigned short>(out->filter.size());
    out->prog.filter = out->filter.data();
    return out;
  }();
  return *p;
}

}  // namespace

absl::Status PrepareSeccomp() { return Seccomp().status; }

const sock_fprog& SeccompFilter() { return Seccomp().prog; }

}  // namespace silt::invoker
