#include "oci_spec.h"

#include <nlohmann/json.hpp>

namespace silt::containerd {

using nlohmann::json;

std::string OciSpecJson(const ContainerSpec& spec, const std::string& ns) {
  // What `runc spec` writes, with the process and limits of this container:
  // its own pid, network, IPC, UTS and mount namespaces, no capabilities
  // beyond runc's default set, no new privileges.
  const json caps = {"CAP_CHOWN",
                     "CAP_DAC_OVERRIDE",
                     "CAP_FSETID",
                     "CAP_FOWNER",
                     "CAP_MKNOD",
                     "CAP_NET_RAW",
                     "CAP_SETGID",
                     "CAP_SETUID",
                     "CAP_SETFCAP",
                     "CAP_SETPCAP",
                     "CAP_NET_BIND_SERVICE",
                     "CAP_SYS_CHROOT",
                     "CAP_KILL",
                     "CAP_AUDIT_WRITE"};
  json process = {
      {"terminal", false},
      {"user", {{"uid", 0}, {"gid", 0}}},
      {"args", spec.args},
      {"env", spec.env},
      {"cwd", spec.cwd},
      {"capabilities",
       {{"bounding", caps}, {"effective", caps}, {"permitted", caps}}},
      {"rlimits",
       json::array(
           {{{"type", "RLIMIT_NOFILE"}, {"hard", 1024}, {"soft", 1024}}})},
      {"noNewPrivileges", true}};
  json mounts = json::array(
      {{{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}},
       {{"destination", "/dev"},
        {"type", "tmpfs"},
        {"source", "tmpfs"},
        {"options", {"nosuid", "strictatime", "mode=755", "size=65536k"}}},
       {{"destination", "/dev/pts"},
        {"type", "devpts"},
        {"source", "devpts"},
        {"options",
         {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}}},
       {{"destination", "/dev/shm"},
        {"type", "tmpfs"},
        {"source", "shm"},
        {"options", {"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}},
       {{"destination", "/dev/mqueue"},
        {"type", "mqueue"},
        {"source", "mqueue"},
        {"options", {"nosuid", "noexec", "nodev"}}},
       {{"destination", "/sys"},
        {"type", "sysfs"},
        {"source", "sysfs"},
        {"options", {"nosuid", "noexec", "nodev", "ro"}}},
       {{"destination", "/tmp"},
        {"type", "tmpfs"},
        {"source", "tmpfs"},
        {"options", {"nosuid", "nodev", "mode=1777", "size=65536k"}}}});
  for (const auto& m : spec.mounts)
    mounts.push_back(
        {{"destination", m.destination},
         {"type", "bind"},
         {"source", m.source},
         {"options", {"rbind", m.read_only ? "ro" : "rw", "nosuid", "nodev"}}});
  json resources = {
      {"devices", json::array({{{"allow", false}, {"access", "rwm"}}})}};
  if (spec.memory_limit_bytes > 0)
    resources["memory"] = {{"limit", spec.memory_limit_bytes}};
  if (spec.cpu_millis > 0)  // a quota per 100 ms period
    resources["cpu"] = {{"quota", spec.cpu_millis * 100}, {"period", 100000}};
  json network = {{"type", "network"}};
  if (!spec.netns.empty()) network["path"] = spec.netns;
  json linux = {
      {"namespaces", json::array({{{"type", "pid"}},
                                  network,
                                  {{"type", "ipc"}},
                                  {{"type", "uts"}},
                                  {{"type", "mount"}}})},
      {"resources", resources},
      {"cgroupsPath", CgroupPathOf(ns, spec.id)},
      {"maskedPaths",
       {"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
        "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
        "/proc/sched_debug", "/sys/firmware", "/proc/scsi"}},
      {"readonlyPaths",
       {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
        "/proc/sysrq-trigger"}}};
  json j = {{"ociVersion", "1.0.2-dev"},
            {"process", process},
            {"root", {{"path", "rootfs"}, {"readonly", spec.read_only_root}}},
            {"hostname", spec.id.substr(0, 63)},
            {"mounts", mounts},
            {"linux", linux}};
  return j.dump();
}

}  // namespace silt::containerd
