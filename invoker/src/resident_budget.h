// The node's budget for what it keeps resident ahead of cold starts: staged
// restorers (a sandbox with a function's image mapped, waiting for the next
// restore), fork templates (a restored instance that clones fork from) and
// staged container instances (restored and frozen, for the next cold start
// of a container function). All hold memory that serves no call until a cold
// start comes, so they share one budget (`--resident-memory-mib`); when
// something new must fit, the holders of the functions that started least
// recently go first, and never one used more recently than the function that
// wants the room.
//
// Pure policy: the invoker lists what is resident and carries out the plan.
#ifndef SILT_INVOKER_RESIDENT_BUDGET_H_
#define SILT_INVOKER_RESIDENT_BUDGET_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace silt::invoker {

enum class ResidentKind { kRestorer, kTemplate, kStaged };
// "restorer", "template", "staged instance"
const char* ResidentKindName(ResidentKind k);

struct ResidentHolder {
  ResidentKind kind = ResidentKind::kRestorer;
  uint64_t bytes = 0;
  // The last cold start or call of the holder's function.
  std::chrono::steady_clock::time_point last_used;
};

// Which holders to let go (indices into `holders`, least recently used
// first) so that `need` more bytes fit under `budget`, choosing only among
// holders last used before `used_before`. nullopt when even letting all of
// those go would not make room (then nothing should go). With `need` 0 and
// `used_before` at its maximum, it is what brings the node back under its
// budget.
std::optional<std::vector<size_t>> PlanEviction(
    const std::vector<ResidentHolder>& holders, uint64_t budget, uint64_t need,
    std::chrono::steady_clock::time_point used_before);

// What a process holds, with the pages it shares counted in proportion to
// its sharers (PSS, /proc/PID/smaps_rollup): a staged restorer and a
// template of one function map the same image pages, and counting them whole
// for each would count the image twice. 0 when the process is gone.
uint64_t ProportionalSetBytes(pid_t pid);

}  // namespace silt::invoker

#endif  // SILT_INVOKER_RESIDENT_BUDGET_H_
