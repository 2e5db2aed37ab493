#include "resident_budget.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>

namespace silt::invoker {

const char* ResidentKindName(ResidentKind k) {
  switch (k) {
    case ResidentKind::kRestorer:
      return "restorer";
    case ResidentKind::kTemplate:
      return "template";
    case ResidentKind::kStaged:
      return "staged instance";
  }
  return "?";
}

std::optional<std::vector<size_t>> PlanEviction(
    const std::vector<ResidentHolder>& holders, uint64_t budget, uint64_t need,
    std::chrono::steady_clock::time_point used_before) {
  uint64_t held = 0;
  for (const auto& h : holders) held += h.bytes;
  std::vector<size_t> order(holders.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return holders[a].last_used < holders[b].last_used;
  });
  std::vector<size_t> out;
  for (size_t i : order) {
    if (need <= budget && held <= budget - need) return out;
    if (holders[i].last_used >= used_before) break;
    held -= holders[i].bytes;
    out.push_back(i);
  }
  if (need <= budget && held <= budget - need) return out;
  return std::nullopt;
}

uint64_t ProportionalSetBytes(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/smaps_rollup";
  FILE* f = fopen(path.c_str(), "re");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (fgets(line, sizeof(line), f) != nullptr)
    if (strncmp(line, "Pss:", 4) == 0 && sscanf(line + 4, "%llu", &kib) == 1)
      break;
  fclose(f);
  return static_cast<uint64_t>(kib) << 10;
}

}  // namespace silt::invoker
