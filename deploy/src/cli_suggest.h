// What `silt` says for a word that names no command: the nearest one.
#ifndef SILT_DEPLOY_CLI_SUGGEST_H_
#define SILT_DEPLOY_CLI_SUGGEST_H_

#include <optional>

namespace CLI {
class App;
}

namespace silt::deploy {

// After a failed parse, or --help: if a word where a command belongs named
// none, says which word, suggests the nearest command and returns 2; with
// --help, any word nothing took is an error too (help must not hide a typo).
// Looks at the commands parsed from the top down, as the first unknown word is
// the one to fix. Else nullopt: CLI11's own message and code stand.
std::optional<int> ReportUnknownWord(const CLI::App& app, bool help);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_CLI_SUGGEST_H_
