#include "gpu_cmd.h"

#include <iostream>

#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace silt::deploy {
namespace {

using nlohmann::json;

int Error(const HttpResult& r) {
  std::cerr << "error (" << r.status
            << "): " << absl::StripTrailingAsciiWhitespace(r.body) << std::endl;
  return 1;
}

std::string Mib(uint64_t bytes) {
  return absl::StrFormat("%.1f MiB", bytes / double(1 << 20));
}

}  // namespace

void PrintGpuMove(const json& m) {
  std::cout << absl::StrFormat(
                   "GPU proclet %s: %s (%s) -> %s (%s%s%s), %s; copied %s "
                   "while it ran (%.1f ms), then launches paused %.2f ms for "
                   "%s written meanwhile (copy out %.2f ms, in %.2f ms)",
                   m.value("id", ""), m.value("from", ""),
                   m.value("fromBackend", ""), m.value("to", ""),
                   m.value("toBackend", ""),
                   m.value("toDevice", "").empty() ? "" : ", ",
                   m.value("toDevice", ""), Mib(m.value("bytes", uint64_t{0})),
                   Mib(m.value("precopyBytes", uint64_t{0})),
                   m.value("precopyMs", 0.0), m.value("pauseMs", 0.0),
                   Mib(m.value("pausedBytes", uint64_t{0})),
                   m.value("extractMs", 0.0), m.value("injectMs", 0.0))
            << std::endl;
}

int GpuList(const Requester& send, const std::string& output) {
  HttpResult r = send("GET", "/system/gpu", "");
  if (r.status != 200) return Error(r);
  json j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("nodes") || !j.contains("proclets")) {
    std::cerr << "cannot parse the gateway's answer" << std::endl;
    return 1;
  }
  if (output == "json") {
    std::cout << j.dump(2) << std::endl;
    return 0;
  }
  std::cout << absl::StrFormat("%-16s\t%-4s\t%-28s\t%-12s\t%-12s\t%-5s\t%s\n",
                               "Node", "GPUs", "Model", "Memory", "Used",
                               "Busy", "Proclets (GPU/CPU)");
  for (const auto& n : j["nodes"])
    std::cout << absl::StrFormat(
        "%-16s\t%-4d\t%-28s\t%-12s\t%-12s\t%-5s\t%d/%d\n", n.value("node", ""),
        n.value("gpus", 0),
        (n.value("model", "").empty() ? "-" : n.value("model", "")) +
            (n.value("reclaimed", false) ? " (reclaimed)" : ""),
        Mib(n.value("memory", uint64_t{0})),
        Mib(n.value("memoryUsed", uint64_t{0})),
        n.value("gpus", 0) == 0
            ? std::string("-")
            : absl::StrFormat("%.0f%%", 100 * n.value("utilization", 0.0)),
        n.value("proclets", 0), n.value("hostProclets", 0));
  if (j["proclets"].empty()) return 0;
  std::cout << "\n"
            << absl::StrFormat(
                   "%-6s\t%-24s\t%-16s\t%-7s\t%-12s\t%-12s\t%-5s\t%s\n", "ID",
                   "Proclet", "Node", "Backend", "Memory", "Limit", "Busy",
                   "Launches");
  for (const auto& p : j["proclets"])
    std::cout << absl::StrFormat(
        "%-6s\t%-24s\t%-16s\t%-7s\t%-12s\t%-12s\t%-5s\t%d\n", p.value("id", ""),
        p.value("function", "") + "/" + p.value("structure", ""),
        p.value("node", ""), p.value("backend", ""),
        Mib(p.value("bytes", uint64_t{0})),
        p.value("memoryLimit", uint64_t{0}) == 0
            ? std::string("device")
            : Mib(p.value("memoryLimit", uint64_t{0})),
        absl::StrFormat("%.0f%%", 100 * p.value("utilization", 0.0)),
        p.value("launches", uint64_t{0}));
  return 0;
}

int GpuReclaim(const Requester& send, const std::string& node) {
  HttpResult r = send("POST", "/system/gpu/" + node + "/reclaim", "");
  if (r.status != 200) return Error(r);
  json j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("moved")) {
    std::cerr << "cannot parse the gateway's answer" << std::endl;
    return 1;
  }
  for (const auto& m : j["moved"]) PrintGpuMove(m);
  std::cout << "Reclaimed the GPU of " << node << ": " << j["moved"].size()
            << " proclet(s) moved; it takes none until `silt gpu release "
            << node << "`." << std::endl;
  return 0;
}

int GpuRelease(const Requester& send, const std::string& node) {
  HttpResult r = send("POST", "/system/gpu/" + node + "/release", "");
  if (r.status != 200) return Error(r);
  std::cout << "Released the GPU of " << node
            << ": placement and the rebalancer use it again." << std::endl;
  return 0;
}

int GpuResize(const Requester& send, const std::string& id,
              const std::string& memory) {
  HttpResult r = send("POST", "/system/proclets/" + id + "/resize",
                      json{{"memory", memory}}.dump());
  if (r.status != 200) return Error(r);
  json p = json::parse(r.body, nullptr, false);
  if (!p.is_object()) {
    std::cerr << "cannot parse the gateway's answer" << std::endl;
    return 1;
  }
  std::cout << "GPU proclet " << p.value("id", "") << " ("
            << p.value("function", "") << "/" << p.value("structure", "")
            << " on " << p.value("node", "") << "): allocation "
            << Mib(p.value("memoryLimit", uint64_t{0})) << ", "
            << Mib(p.value("bytes", uint64_t{0})) << " in use" << std::endl;
  return 0;
}

}  // namespace silt::deploy
