#include "watch.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace silt::deploy {
namespace {

using nlohmann::json;

std::string EventLine(const json& e) {
  std::string time = e.value("time", "");
  if (auto t = time.find('T'); t != std::string::npos)
    time = time.substr(t + 1);
  std::string what = e.value("type", "");
  std::string line =
      absl::StrFormat("%-18.18s %-11s %-11s %-12s", time, what,
                      e.value("reason", ""), e.value("node", ""));
  if (what == "move") {
    absl::StrAppend(&line, " ", e.value("kind", ""), " ",
                    e.value("subject", ""), " -> ", e.value("to", ""),
                    absl::StrFormat(" (%.2f ms)", e.value("ms", 0.0)));
  } else if (what == "equilibrium") {
    absl::StrAppend(&line,
                    absl::StrFormat(" after %.1f ms", e.value("ms", 0.0)));
  }
  std::string detail = e.value("detail", "");
  if (!detail.empty()) absl::StrAppend(&line, ": ", detail);
  return line;
}

std::string Bar(double used, double total, int width) {
  int n = total > 0 ? static_cast<int>(used / total * width + 0.5) : 0;
  n = std::clamp(n, 0, width);
  return "[" + std::string(n, '#') + std::string(width - n, '.') + "]";
}

}  // namespace

void PrintEvents(const JsonGetter& get, bool follow,
                 const std::string& output) {
  uint64_t after = 0;
  if (output != "json")
    std::cout << absl::StrFormat("%-18s %-11s %-11s %-12s %s\n", "Time",
                                 "Event", "Reason", "Node", "What")
              << std::flush;
  while (true) {
    json events = get(absl::StrCat("/system/events?after=", after));
    for (const auto& e : events) {
      after = std::max(after, e.value("seq", uint64_t{0}));
      std::cout << (output == "json" ? e.dump() : EventLine(e)) << "\n";
    }
    std::cout << std::flush;
    if (!follow) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // poll
  }
}

void Top(const JsonGetter& get, std::chrono::milliseconds interval,
         int iterations) {
  bool tty = isatty(STDOUT_FILENO);
  std::vector<std::string> recent;
  uint64_t after = 0;
  for (int frame = 0; iterations <= 0 || frame < iterations; ++frame) {
    json nodes = get("/system/nodes");
    for (const auto& e : get(absl::StrCat("/system/events?after=", after))) {
      after = std::max(after, e.value("seq", uint64_t{0}));
      recent.push_back(EventLine(e));
    }
    if (recent.size() > 12) recent.erase(recent.begin(), recent.end() - 12);
    std::string out = tty ? "\033[H\033[2J" : "";
    absl::StrAppend(
        &out, absl::StrFormat("%-14s %-22s %-7s %-4s %-24s %-5s %-12s %s\n",
                              "NODE", "CPU", "OTHER", "HOT", "MEMORY", "INST",
                              "MEM PROCLETS", "COMPUTE"));
    for (const auto& n : nodes) {
      double cores = n.value("cores", 0);
      double cpu = n.value("cpuUsed", 0.0);
      double mem = static_cast<double>(n.value("memoryBytes", uint64_t{0}));
      double used =
          static_cast<double>(n.value("memoryUsedBytes", uint64_t{0}));
      absl::StrAppend(
          &out,
          absl::StrFormat(
              "%-14.14s %s %4.1f/%-3.0f %-7.2f %-4s %s %5.0f%% %-5d %-12s %d\n",
              n.value("name", ""), Bar(cpu, cores, 10), cpu, cores,
              n.value("cpuForeign", 0.0), n.value("hot", false) ? "yes" : "-",
              Bar(used, mem, 16), mem > 0 ? used / mem * 100 : 0.0,
              n.value("instances", 0),
              absl::StrFormat(
                  "%d (%.0fMiB)", n.value("proclets", 0),
                  n.value("procletBytes", uint64_t{0}) / double(1 << 20)),
              n.value("computeProclets", 0)));
    }
    absl::StrAppend(&out, "\nLatest rebalancer events:\n");
    if (recent.empty()) absl::StrAppend(&out, "  (none)\n");
    for (const auto& l : recent) absl::StrAppend(&out, "  ", l, "\n");
    std::cout << out << std::flush;
    if (iterations > 0 && frame + 1 >= iterations) break;
    std::this_thread::sleep_for(interval);  // the refresh period
  }
}

}  // namespace silt::deploy
