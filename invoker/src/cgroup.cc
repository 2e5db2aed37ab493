#include "cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "mount_flags.h"

namespace silt::invoker {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteFile(const std::string& path, const std::string& value) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::InternalError(
        absl::StrCat("open ", path, ": ", strerror(errno)));
  ssize_t n = write(fd, value.data(), value.size());
  int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(value.size()))
    return absl::InternalError(
        absl::StrCat("write ", value, " to ", path, ": ", strerror(err)));
  return absl::OkStatus();
}

bool IsV2() {
  return std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers");
}

// This process's cgroup path in the hierarchy that has `controller` ("" for
// v2).
std::string OwnCgroup(const std::string& controller) {
  std::string text = ReadFile("/proc/self/cgroup");
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (controller.empty()
            ? parts[1].empty()
            : absl::StrContains(absl::StrCat(",", parts[1], ","),
                                absl::StrCat(",", controller, ","))) {
      return std::string(parts[2]);
    }
  }
  return "/";
}

std::string ControllerRoot(const std::string& controller) {
  if (controller == "cpu") return "/sys/fs/cgroup/cpu";
  return "/sys/fs/cgroup/" + controller;
}

}  // namespace

absl::Status CreateCgroupDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create cgroup ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Cgroup>> Cgroup::Create(
    const std::string& name, uint64_t memory_limit_bytes, uint64_t cpu_millis,
    uint64_t max_pids) {
  std::unique_ptr<Cgroup> cg(new Cgroup());
  cg->v2_ = IsV2();
  auto make = [&](const std::string& dir) -> absl::Status {
    if (auto s = CreateCgroupDir(dir); !s.ok()) return s;
    cg->dirs_.push_back(dir);
    return absl::OkStatus();
  };
  if (cg->v2_) {
    std::string dir = "/sys/fs/cgroup" + OwnCgroup("") + "/" + name;
    if (auto s = make(dir); !s.ok()) return s;
    cg->memory_dir_ = dir;
    if (memory_limit_bytes > 0) {
      if (auto s = WriteFile(dir + "/memory.max",
                             std::to_string(memory_limit_bytes));
          !s.ok())
        return s;
      WriteFile(dir + "/memory.swap.max", "0").IgnoreError();  // no swap escape
    }
    if (cpu_millis > 0) {
      if (auto s = WriteFile(dir + "/cpu.max",
                             absl::StrCat(cpu_millis * 100, " 100000"));
          !s.ok())
        return s;
    }
    if (auto s = WriteFile(dir + "/pids.max", std::to_string(max_pids));
        !s.ok())
      return s;
    return cg;
  }
  std::string mem = ControllerRoot("memory") + OwnCgroup("memory") + "/" + name;
  if (auto s = make(mem); !s.ok()) return s;
  cg->memory_dir_ = mem;
  if (memory_limit_bytes > 0) {
    if (auto s = WriteFile(mem + "/memory.limit_in_bytes",
                           std::to_string(memory_limit_bytes));
        !s.ok())
      return s;
    // With swap accounting, also cap memory+swap so the limit cannot be dodged
    // by swapping.
    if (std::filesystem::exists(mem + "/memory.memsw.limit_in_bytes"))
      WriteFile(mem + "/memory.memsw.limit_in_bytes",
                std::to_string(memory_limit_bytes))
          .IgnoreError();
  }
  std::string cpu = ControllerRoot("cpu") + OwnCgroup("cpu") + "/" + name;
  if (auto s = make(cpu); !s.ok()) return s;
  if (cpu_millis > 0) {
    if (auto s = WriteFile(cpu + "/cpu.cfs_period_us", "100000"); !s.ok())
      return s;
    if (auto s = WriteFile(cpu + "/cpu.cfs_quota_us",
                           std::to_string(cpu_millis * 100));
        !s.ok())
      return s;
  }
  // CPU time is counted by cpuacct where it is a hierarchy of its own (the
  // node's load reports read it; cpu.stat has no usage on v1).
  if (std::filesystem::exists(ControllerRoot("cpuacct") + "/cpuacct.usage")) {
    std::string acct =
        ControllerRoot("cpuacct") + OwnCgroup("cpuacct") + "/" + name;
    if (auto s = make(acct); !s.ok()) return s;
  }
  std::string pids = ControllerRoot("pids") + OwnCgroup("pids") + "/" + name;
  if (auto s = make(pids); !s.ok()) return s;
  if (auto s = WriteFile(pids + "/pids.max", std::to_string(max_pids)); !s.ok())
    return s;
  return cg;
}

Cgroup::~Cgroup() {
  for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) rmdir(it->c_str());
}

std::vector<std::string> Cgroup::ProcsFiles() const {
  std::vector<std::string> files;
  for (const auto& d : dirs_) files.push_back(d + "/cgroup.procs");
  return files;
}

absl::Status Cgroup::AddProcess(pid_t pid) {
  for (const auto& d : dirs_) {
    if (auto s = WriteFile(d + "/cgroup.procs", std::to_string(pid)); !s.ok())
      return s;
  }
  return absl::OkStatus();
}

namespace {

// The oom_kill count of a memory.events (v2) or memory.oom_control (v1).
uint64_t OomKillCount(const std::string& memory_dir, bool v2) {
  std::string text =
      ReadFile(memory_dir + (v2 ? "/memory.events" : "/memory.oom_control"));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    uint64_t n = 0;
    if (absl::ConsumePrefix(&line, "oom_kill ") && absl::SimpleAtoi(line, &n))
      return n;
  }
  return 0;
}

}  // namespace

absl::Status Cgroup::SetMemoryLimit(uint64_t bytes) {
  if (v2_)
    return WriteFile(memory_dir_ + "/memory.max",
                     bytes > 0 ? std::to_string(bytes) : "max");
  const std::string value = bytes > 0 ? std::to_string(bytes) : "-1";
  const std::string plain = memory_dir_ + "/memory.limit_in_bytes";
  const std::string memsw = memory_dir_ + "/memory.memsw.limit_in_bytes";
  if (!std::filesystem::exists(memsw)) return WriteFile(plain, value);
  // memory+swap is never below the plain limit: raised first, lowered last.
  if (auto s = WriteFile(memsw, value); s.ok()) return WriteFile(plain, value);
  if (auto s = WriteFile(plain, value); !s.ok()) return s;
  return WriteFile(memsw, value);
}

bool Cgroup::OomKilled() const { return OomKillCount(memory_dir_, v2_) > 0; }

uint64_t Cgroup::NewOomKills() {
  uint64_t n = OomKillCount(memory_dir_, v2_);
  uint64_t fresh = n > oom_kills_seen_ ? n - oom_kills_seen_ : 0;
  oom_kills_seen_ = n;
  return fresh;
}

uint64_t Cgroup::MemoryUsage() const {
  uint64_t v = 0;
  std::string text = ReadFile(
      memory_dir_ + (v2_ ? "/memory.current" : "/memory.usage_in_bytes"));
  (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v);
  return v;
}

absl::StatusOr<std::string> FavorCgroupMoves() {
  std::ifstream in("/proc/self/mounts");
  std::string line, v2, v1;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() < 4) continue;
    if (absl::StrContains(f[3], "favordynmods")) return f[1] + " (already)";
    if (f[2] == "cgroup2" && v2.empty()) v2 = f[1];
    if (f[2] == "cgroup" && v1.empty() && absl::StrContains(f[3], "memory"))
      v1 = f[1];
  }
  std::string target = v2.empty() ? v1 : v2;
  if (target.empty()) return absl::NotFoundError("no cgroup mount");
  // A remount sets the mount flags too: keep the ones it has.
  struct statvfs st;
  if (statvfs(target.c_str(), &st) != 0)
    return absl::InternalError(absl::StrCat(target, ": ", strerror(errno)));
  unsigned long flags = MS_REMOUNT | KeptMountFlags(st);
  if (st.f_flag & ST_RDONLY) flags |= MS_RDONLY;
  // v1 needs its controller list again.
  std::string opts = "favordynmods";
  if (v2.empty()) opts = "memory,favordynmods";
  if (mount(nullptr, target.c_str(), nullptr, flags, opts.c_str()) != 0)
    return absl::UnavailableError(absl::StrCat(
        "remounting ", target, " with favordynmods: ", strerror(errno)));
  return target;
}

void CleanupStaleCgroups(const std::string& prefix) {
  std::vector<std::string> roots;
  if (IsV2()) {
    roots.push_back("/sys/fs/cgroup" + OwnCgroup("") + "/" + prefix);
  } else {
    for (const char* c : {"memory", "cpu", "cpuacct", "pids"})
      roots.push_back(ControllerRoot(c) + OwnCgroup(c) + "/" + prefix);
  }
  // Every hierarchy's processes are killed first, then every cgroup is
  // removed once empty: killed processes leave asynchronously (one with much
  // memory takes a while), and giving up on one hierarchy after a few
  // yields left its cgroups behind while the next one's went (CI: an empty
  // instance cgroup in cpu, cpuacct and memory, not pids).
  std::vector<std::string> dirs;
  for (const auto& root : roots) {
    std::error_code ec;
    if (!std::filesystem::is_directory(root, ec)) continue;
    std::vector<std::string> mine;
    for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
         it != std::filesystem::recursive_directory_iterator();
         it.increment(ec)) {
      if (ec) break;
      if (it->is_directory()) mine.push_back(it->path().string());
    }
    mine.push_back(root);
    std::sort(mine.rbegin(), mine.rend());  // children first
    for (const auto& d : mine) {
      std::string procs = ReadFile(d + "/cgroup.procs");
      for (absl::string_view p :
           absl::StrSplit(procs, '\n', absl::SkipEmpty())) {
        int pid = 0;
        if (absl::SimpleAtoi(p, &pid) && pid > 1) kill(pid, SIGKILL);
      }
    }
    dirs.insert(dirs.end(), mine.begin(), mine.end());
  }
  // rmdir succeeds once a cgroup is empty; at most 10 s in all.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!dirs.empty()) {
    std::vector<std::string> left;
    for (const auto& d : dirs)
      if (rmdir(d.c_str()) != 0 && errno != ENOENT) left.push_back(d);
    dirs.swap(left);
    if (dirs.empty() || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (const auto& d : dirs)
    fprintf(stderr,
            "silt-invoker: could not remove cgroup %s: still in use after "
            "10 s\n",
            d.c_str());
}

bool CgroupV2() { return IsV2(); }

absl::Status WriteCgroupFile(const std::string& path,
                             const std::string& value) {
  return WriteFile(path, value);
}

std::string CgroupDir(const std::string& controller, const std::string& name) {
  std::string root = controller.empty()
                         ? "/sys/fs/cgroup" + OwnCgroup("")
                         : ControllerRoot(controller) + OwnCgroup(controller);
  return name.empty() ? root : root + "/" + name;
}

}  // namespace silt::invoker
