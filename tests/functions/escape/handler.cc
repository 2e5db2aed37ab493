// The sandbox-escape suite's function: each route tries one way out of the
// sandbox and answers what happened as JSON ({"ok":..,"errno":"EPERM",...}).
// Routes that make a forbidden system call never answer: seccomp kills the
// instance.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <silt/function.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

std::string Param(std::string_view query, std::string_view key) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    std::string_view kv = query.substr(
        pos, amp == std::string_view::npos ? query.npos : amp - pos);
    size_t eq = kv.find('=');
    if (kv.substr(0, eq) == key)
      return std::string(eq == kv.npos ? "" : kv.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    pos = amp + 1;
  }
  return "";
}

long Num(const silt::Request& req, std::string_view key) {
  return std::strtol(Param(req.query, key).c_str(), nullptr, 10);
}

const char* ErrnoName(int e) {
  switch (e) {
    case 0:
      return "0";
    case EPERM:
      return "EPERM";
    case EACCES:
      return "EACCES";
    case ENOENT:
      return "ENOENT";
    case EROFS:
      return "EROFS";
    case ENOSPC:
      return "ENOSPC";
    case EAGAIN:
      return "EAGAIN";
    case ESRCH:
      return "ESRCH";
    case ENETUNREACH:
      return "ENETUNREACH";
    case EHOSTUNREACH:
      return "EHOSTUNREACH";
    case ECONNREFUSED:
      return "ECONNREFUSED";
    case ETIMEDOUT:
      return "ETIMEDOUT";
    case EAFNOSUPPORT:
      return "EAFNOSUPPORT";
    case EINVAL:
      return "EINVAL";
    case ENOMEM:
      return "ENOMEM";
    case EDQUOT:
      return "EDQUOT";
    case ENOTDIR:
      return "ENOTDIR";
    default:
      return strerrorname_np(e) ? strerrorname_np(e) : "E?";
  }
}

// {"ok":true|false,"errno":"E...",<extra>}
silt::Response Json(bool ok, int err, const std::string& extra = "") {
  std::string body = std::string("{\"ok\":") + (ok ? "true" : "false") +
                     ",\"errno\":\"" + ErrnoName(ok ? 0 : err) + "\"";
  if (!extra.empty()) body += "," + extra;
  body += "}";
  silt::Response r = silt::Response::Text(200, body);
  r.headers.emplace_back("Content-Type", "application/json");
  return r;
}

silt::Response Result(long rc) { return Json(rc >= 0, errno); }

// Tries to reach host:port over TCP (or UDP: a datagram sent) for at most
// 2 s.
silt::Response Connect(const silt::Request& req) {
  std::string host = Param(req.query, "host");
  int port = static_cast<int>(Num(req, "port"));
  bool udp = Param(req.query, "proto") == "udp";
  sockaddr_storage ss{};
  socklen_t len;
  int family;
  if (host.find(':') != std::string::npos) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.c_str(), &a->sin6_addr) != 1)
      return silt::Response::Text(400, "bad host");
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, host.c_str(), &a->sin_addr) != 1)
      return silt::Response::Text(400, "bad host");
    len = sizeof(*a);
  }
  int s = socket(family, (udp ? SOCK_DGRAM : SOCK_STREAM) | SOCK_NONBLOCK, 0);
  if (s < 0) return Json(false, errno);
  int err = 0;
  if (udp) {
    if (sendto(s, "x", 1, 0, reinterpret_cast<sockaddr*>(&ss), len) < 0)
      err = errno;
  } else if (connect(s, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{s, POLLOUT, 0};
      if (poll(&p, 1, 2000) == 0) {
        err = ETIMEDOUT;
      } else {
        socklen_t l = sizeof(err);
        getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l);
      }
    }
  }
  close(s);
  return Json(err == 0, err);
}

// Opens and reads a byte of `path`.
silt::Response Read(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Json(false, errno);
  char c;
  ssize_t n = read(fd, &c, 1);
  int err = errno;
  close(fd);
  return Json(n >= 0, err);
}

// Writes `mb` MiB (at least a byte) to `path` until it fails; answers how
// much got written and removes it again.
silt::Response Write(const std::string& path, long mb) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Json(false, errno, "\"bytes\":0");
  std::vector<char> block(1 << 20, 'x');
  uint64_t total = 0, want = mb > 0 ? uint64_t(mb) << 20 : 1;
  int err = 0;
  while (total < want) {
    ssize_t n =
        write(fd, block.data(), std::min<uint64_t>(block.size(), want - total));
    if (n <= 0) {
      err = errno;
      break;
    }
    total += static_cast<uint64_t>(n);
  }
  close(fd);
  unlink(path.c_str());
  return Json(err == 0, err, "\"bytes\":" + std::to_string(total));
}

// The names in a directory, as a JSON array.
silt::Response List(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return Json(false, errno);
  std::string names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    names += (names.empty() ? "\"" : ",\"") + n + "\"";
  }
  closedir(d);
  return Json(true, 0, "\"names\":[" + names + "]");
}

// Children that wait forever until fork fails (or `max` run); answers how
// many ran and why fork failed, then ends them.
silt::Response ForkBomb(long max) {
  std::vector<pid_t> kids;
  int err = 0;
  while (static_cast<long>(kids.size()) < max) {
    pid_t p = fork();
    if (p == 0) {
      for (;;) pause();
    }
    if (p < 0) {
      err = errno;
      break;
    }
    kids.push_back(p);
  }
  for (pid_t p : kids) kill(p, SIGKILL);
  for (pid_t p : kids) waitpid(p, nullptr, 0);
  return Json(err == 0, err, "\"forks\":" + std::to_string(kids.size()));
}

// Touches `mb` MiB, a MiB at a time, and keeps it.
silt::Response MemoryBomb(long mb) {
  static std::vector<char*> kept;
  for (long i = 0; i < mb; ++i) {
    char* b = static_cast<char*>(malloc(1 << 20));
    if (b == nullptr) return Json(false, ENOMEM);
    memset(b, 1, 1 << 20);
    kept.push_back(b);
  }
  return Json(true, 0, "\"mb\":" + std::to_string(mb));
}

// A child in a session of its own (out of the caller's process group) that
// outlives the call unless the platform ends it.
silt::Response Child() {
  pid_t p = fork();
  if (p == 0) {
    setsid();
    for (;;) pause();
  }
  if (p < 0) return Json(false, errno);
  return Json(true, 0, "\"pid\":" + std::to_string(p));
}

// Whether process `pid` still runs (not a zombie).
silt::Response Alive(long pid) {
  FILE* f = fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return Json(false, errno);
  char state = '?';
  if (fscanf(f, "%*d %*s %c", &state) != 1) state = '?';
  fclose(f);
  return Json(state != 'Z' && state != 'X', ESRCH,
              std::string("\"state\":\"") + state + "\"");
}

// What a process draws at run time, to compare across clones of one
// snapshot: kernel randomness, ids, where a new mapping lands, the stack
// protector's canary and the C library's generator.
silt::Response Draws(silt::Context& ctx) {
  unsigned char bytes[16];
  if (getrandom(bytes, sizeof(bytes), 0) != sizeof(bytes))
    return Json(false, errno);
  char hex[33];
  for (int i = 0; i < 16; ++i) snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
  void* map = mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  munmap(map, 4096);
  unsigned long canary = 0;
#if defined(__x86_64__)
  asm volatile("mov %%fs:0x28, %0" : "=r"(canary));
#elif defined(__aarch64__)
  extern unsigned long __stack_chk_guard;
  canary = __stack_chk_guard;
#endif
  char buf[512];
  snprintf(buf, sizeof(buf),
           "\"random\":\"%s\",\"pid\":%d,\"tid\":%ld,\"mmap\":\"%p\","
           "\"canary\":\"%lx\",\"libc_random\":%ld,\"instance\":\"%s\"",
           hex, getpid(), static_cast<long>(syscall(SYS_gettid)), map, canary,
           random(), std::string(ctx.instance_id()).c_str());
  return Json(true, 0, buf);
}

silt::Response Handle(const silt::Request& req, silt::Context& ctx) {
  std::string_view path = req.path;
  // Forbidden system calls: seccomp kills the instance at the call.
  if (path == "/ptrace")
    return Result(ptrace(PTRACE_ATTACH, static_cast<pid_t>(Num(req, "pid")),
                         nullptr, nullptr));
  if (path == "/mount")
    return Result(mount("none", "/tmp", "tmpfs", 0, nullptr));
  if (path == "/unshare") return Result(unshare(CLONE_NEWNS));
  if (path == "/setns") {
    int fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    return Result(setns(fd, CLONE_NEWNET));
  }
  if (path == "/module") {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return Result(syscall(SYS_finit_module, fd, "", 0));
  }
  if (path == "/bpf") {
    union bpf_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.map_type = BPF_MAP_TYPE_ARRAY;
    attr.key_size = 4;
    attr.value_size = 4;
    attr.max_entries = 1;
    return Result(syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof(attr)));
  }
  // Failing system calls.
  if (path == "/socket") {
    std::string kind = Param(req.query, "kind");
    int s = kind == "raw"      ? socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)
            : kind == "raw6"   ? socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6)
            : kind == "packet" ? socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL))
                               : socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP));
    int err = errno;
    if (s >= 0) close(s);
    return Json(s >= 0, err);
  }
  if (path == "/connect") return Connect(req);
  if (path == "/read") return Read(Param(req.query, "path"));
  if (path == "/list") return List(Param(req.query, "path"));
  if (path == "/write") return Write(Param(req.query, "path"), Num(req, "mb"));
  if (path == "/kill")
    return Result(kill(static_cast<pid_t>(Num(req, "pid")),
                       static_cast<int>(Num(req, "sig"))));
  // Resources: bounded by the cgroup and the /tmp size.
  if (path == "/forkbomb") return ForkBomb(Num(req, "max"));
  if (path == "/membomb") return MemoryBomb(Num(req, "mb"));
  // Leftovers: a child that tries to outlive the call.
  if (path == "/child") return Child();
  if (path == "/alive") return Alive(Num(req, "pid"));
  if (path == "/draws") return Draws(ctx);
  return silt::Response::Text(200, "ok");
}

}  // namespace

SILT_HANDLER(Handle)
