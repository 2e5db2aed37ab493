#include "cluster_cmd.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace silt::deploy {
namespace {

using nlohmann::json;

std::string Mib(uint64_t bytes) {
  return absl::StrFormat("%.1fMiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

void NodesList(const Client& c, const std::string& output) {
  json nodes = GetJson(c, "/system/nodes", "node list");
  if (output == "json") {
    std::cout << nodes.dump(2) << std::endl;
    return;
  }
  std::cout << absl::StrFormat(
      "%-16s\t%-5s\t%-8s\t%-12s\t%-12s\t%-12s\t%-9s\t%-18s\t%s\n", "Node",
      "CPUs", "CPU used", "Memory", "Used", "Free", "Instances",
      "Memory proclets", "Compute proclets");
  for (const auto& n : nodes) {
    std::cout << absl::StrFormat(
        "%-16s\t%-5d\t%-8.2f\t%-12s\t%-12s\t%-12s\t%-9d\t%-18s\t%d\n",
        n.value("name", ""), n.value("cores", 0), n.value("cpuUsed", 0.0),
        Mib(n.value("memoryBytes", uint64_t{0})),
        Mib(n.value("memoryUsedBytes", uint64_t{0})),
        Mib(n.value("memoryFreeBytes", uint64_t{0})), n.value("instances", 0),
        absl::StrFormat("%d (%s)", n.value("proclets", 0),
                        Mib(n.value("procletBytes", uint64_t{0}))),
        n.value("computeProclets", 0));
  }
}

void ProcletsList(const Client& c, const std::string& ns,
                  const std::string& function, const std::string& output) {
  std::string q = NsQuery(ns);
  if (!function.empty())
    q += (q.empty() ? "?" : "&") + std::string("function=") +
         UrlEncode(function);
  json ps = GetJson(c, "/system/proclets" + q, "proclet list");
  if (output == "json") {
    std::cout << ps.dump(2) << std::endl;
    return;
  }
  std::cout << absl::StrFormat(
      "%-8s\t%-6s\t%-24s\t%-16s\t%-10s\t%-9s\t%-5s\t%s\n", "ID", "Kind",
      "Structure", "Node", "Bytes", "Elements", "Epoch", "State");
  for (const auto& p : ps) {
    std::cout << absl::StrFormat(
        "%-8d\t%-6s\t%-24s\t%-16s\t%-10s\t%-9d\t%-5d\t%s\n",
        p.value("id", uint64_t{0}), p.value("kind", ""),
        absl::StrCat(p.value("structure", ""), ".", p.value("namespace", "")),
        p.value("node", ""), Mib(p.value("bytes", uint64_t{0})),
        p.value("count", uint64_t{0}), p.value("epoch", uint64_t{0}),
        p.value("state", ""));
  }
}

void PrintMigration(const json& m) {
  std::cout << absl::StrFormat(
                   "proclet %d: %s -> %s, %s in %.2f ms (%d rounds), writes "
                   "held %.3f ms",
                   m.value("id", uint64_t{0}), m.value("from", ""),
                   m.value("to", ""), Mib(m.value("bytes", uint64_t{0})),
                   m.value("totalMs", 0.0), m.value("rounds", 0),
                   m.value("pauseMs", 0.0))
            << std::endl;
}

void StateList(const Client& c, const std::string& ns,
               const std::string& output) {
  json st = GetJson(c, "/system/state" + NsQuery(ns), "state list");
  if (output == "json") {
    std::cout << st.dump(2) << std::endl;
    return;
  }
  std::cout << absl::StrFormat("%-24s\t%-6s\t%-6s\t%-10s\t%-9s\t%s\n", "State",
                               "Kind", "Shards", "Bytes", "Elements",
                               "Functions");
  for (const auto& s : st) {
    auto fns = s.value("functions", std::vector<std::string>{});
    uint32_t lost = s.value("lostShards", 0u);
    std::cout << absl::StrFormat(
        "%-24s\t%-6s\t%-6s\t%-10s\t%-9d\t%s\n",
        absl::StrCat(s.value("name", ""), ".", s.value("namespace", "")),
        s.value("kind", ""),
        absl::StrCat(s.value("shards", 0),
                     lost ? absl::StrCat(" (", lost, " lost)") : ""),
        Mib(s.value("bytes", uint64_t{0})), s.value("count", uint64_t{0}),
        fns.empty() ? "-" : absl::StrJoin(fns, ","));
  }
}

}  // namespace silt::deploy
