#include "node_cgroup.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "sandbox.h"

namespace silt::invoker {
namespace {

constexpr uint64_t kCpuPeriodUs = 100000;

}  // namespace

absl::StatusOr<std::unique_ptr<NodeCgroup>> NodeCgroup::Create(
    const std::string& name, uint64_t memory_bytes, uint64_t cpu_millis) {
  std::unique_ptr<NodeCgroup> cg(new NodeCgroup());
  auto make = [&](const std::string& dir) -> absl::Status {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create cgroup ", dir, ": ", ec.message()));
    cg->dirs_.push_back(dir);
    return absl::OkStatus();
  };
  std::string quota = cpu_millis > 0 ? std::to_string(cpu_millis * 100) : "";
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

uint64_t NodeCgroup::CpuUsageNanos() const {
  if (CgroupV2()) {
    std::ifstream in(cpu_dir_ + "/cpu.stat");
    std::string key;
    uint64_t v;
    while (in >> key >> v)
      if (key == "usage_usec") return v * 1000;
    return 0;
  }
  if (cpuacct_dir_.empty()) return 0;
  uint64_t v = 0;
  std::ifstream(cpuacct_dir_ + "/cpuacct.usage") >> v;
  return v;
}

NodeCgroup::~NodeCgroup() {
  for (const auto& d : dirs_) rmdir(d.c_str());  // fails while not empty
}

}  // namespace silt::invoker
