#include "node_cgroup.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "cgroup.h"

namespace silt::invoker {
namespace {

// A short period (the kernel's default is 100 ms): a node over its quota is
// throttled for at most ~10 ms at a time, so its CPU use reads the same over
// any window of a few periods, which is what load pulses sample.
constexpr uint64_t kCpuPeriodUs = 10000;

}  // namespace

absl::StatusOr<std::unique_ptr<NodeCgroup>> NodeCgroup::Create(
    const std::string& name, uint64_t memory_bytes, uint64_t cpu_millis) {
  std::unique_ptr<NodeCgroup> cg(new NodeCgroup());
  auto make = [&](const std::string& dir) -> absl::Status {
    if (auto s = CreateCgroupDir(dir); !s.ok()) return s;
    cg->dirs_.push_back(dir);
    return absl::OkStatus();
  };
  std::string quota =
      cpu_millis > 0 ? std::to_string(cpu_millis * kCpuPeriodUs / 1000) : "";
  if (CgroupV2()) {
    std::string dir = CgroupDir("", name);
    if (auto s = make(dir); !s.ok()) return s;
    cg->memory_dir_ = cg->cpu_dir_ = dir;
    // Controllers reach a cgroup only through its ancestors' subtree_control:
    // from this process's own cgroup down to `dir` (whose children are the
    // instances). Writing the top one fails while processes live in it; the
    // limit writes below say so if that matters.
    std::filesystem::path own = CgroupDir("", "");
    std::filesystem::path at = own;
    std::vector<std::filesystem::path> chain = {own};
    for (const auto& part : std::filesystem::path(name)) {
      at /= part;
      chain.push_back(at);
    }
    for (const auto& p : chain)
      WriteCgroupFile((p / "cgroup.subtree_control").string(),
                      "+cpu +memory +pids")
          .IgnoreError();  // see above
    if (auto s = WriteCgroupFile(
            dir + "/memory.max",
            memory_bytes > 0 ? std::to_string(memory_bytes) : "max");
        !s.ok())
      return s;
    if (auto s = WriteCgroupFile(
            dir + "/cpu.max",
            absl::StrCat(quota.empty() ? "max" : quota, " ", kCpuPeriodUs));
        !s.ok())
      return s;
    return cg;
  }
  std::string mem = CgroupDir("memory", name);
  if (auto s = make(mem); !s.ok()) return s;
  cg->memory_dir_ = mem;
  std::string limit = memory_bytes > 0 ? std::to_string(memory_bytes) : "-1";
  // memsw (memory + swap) must stay >= the memory limit: on the way down set
  // memory first, on the way up memsw first; "-1" for both always works.
  bool memsw = std::filesystem::exists(mem + "/memory.memsw.limit_in_bytes");
  if (memsw)
    WriteCgroupFile(mem + "/memory.memsw.limit_in_bytes", "-1")
        .IgnoreError();  // widen
  if (auto s = WriteCgroupFile(mem + "/memory.limit_in_bytes", limit); !s.ok())
    return s;
  if (memsw) {
    if (auto s = WriteCgroupFile(mem + "/memory.memsw.limit_in_bytes", limit);
        !s.ok())
      return s;
  }
  std::string cpu = CgroupDir("cpu", name);
  if (auto s = make(cpu); !s.ok()) return s;
  cg->cpu_dir_ = cpu;
  if (auto s = WriteCgroupFile(cpu + "/cpu.cfs_period_us",
                               std::to_string(kCpuPeriodUs));
      !s.ok())
    return s;
  if (auto s = WriteCgroupFile(cpu + "/cpu.cfs_quota_us",
                               quota.empty() ? "-1" : quota);
      !s.ok())
    return s;
  // The instances' pids cgroups live below this one too, and their CPU time
  // is counted in cpuacct (see CpuUsageNanos).
  if (auto s = make(CgroupDir("pids", name)); !s.ok()) return s;
  if (std::filesystem::exists(CgroupDir("cpuacct", "") + "/cpuacct.usage")) {
    std::string acct = CgroupDir("cpuacct", name);
    if (auto s = make(acct); !s.ok()) return s;
    cg->cpuacct_dir_ = acct;
  }
  return cg;
}

namespace {

// A small file's text, read with plain syscalls from offset 0 (cgroup files
// give their current value on every such read): load pulses read these every
// few milliseconds. With `fd`, the file is kept open there between reads.
std::string ReadSmall(const std::string& path, int* fd = nullptr) {
  int own = -1;
  if (fd == nullptr) fd = &own;
  if (*fd < 0) *fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (*fd < 0) return "";
  char buf[1024];
  ssize_t n = pread(*fd, buf, sizeof(buf) - 1, 0);
  if (own >= 0) close(own);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

uint64_t FirstNumber(const std::string& text) {
  return strtoull(text.c_str(), nullptr, 10);
}

// CPU time from cpuacct.usage (v1, nanoseconds) or cpu.stat (v2, usage_usec).
uint64_t CpuNanosOf(const std::string& text, bool v2) {
  if (!v2) return FirstNumber(text);
  size_t at = text.find("usage_usec ");
  return at == std::string::npos
             ? 0
             : strtoull(text.c_str() + at + 11, nullptr, 10) * 1000;
}

const char* CpuFile(bool v2) { return v2 ? "/cpu.stat" : "/cpuacct.usage"; }

}  // namespace

uint64_t NodeCgroup::CpuUsageNanos() const {
  bool v2 = CgroupV2();
  const std::string& dir = v2 ? cpu_dir_ : cpuacct_dir_;
  if (dir.empty()) return 0;
  return CpuNanosOf(ReadSmall(dir + CpuFile(v2), &cpu_fd_), v2);
}

uint64_t NodeCgroup::InstancesCpuNanos() const {
  bool v2 = CgroupV2();
  const std::string& dir = v2 ? cpu_dir_ : cpuacct_dir_;
  if (dir.empty()) return 0;
  uint64_t sum = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_directory(ec))
      sum += CpuNanosOf(ReadSmall(e.path().string() + CpuFile(v2)), v2);
  return sum;
}

uint64_t NodeCgroup::MemoryUsageBytes() const {
  return FirstNumber(ReadSmall(
      memory_dir_ + (CgroupV2() ? "/memory.current" : "/memory.usage_in_bytes"),
      &memory_fd_));
}

NodeCgroup::~NodeCgroup() {
  if (cpu_fd_ >= 0) close(cpu_fd_);
  if (memory_fd_ >= 0) close(memory_fd_);
  for (const auto& d : dirs_) rmdir(d.c_str());  // fails while not empty
}

}  // namespace silt::invoker
