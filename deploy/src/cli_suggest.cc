#include "cli_suggest.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace silt::deploy {
namespace {

// Optimal string alignment distance: insertions, deletions, substitutions and
// swaps of two neighbours each count one.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1,
                                     std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t subst = d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, subst});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// `cmd`'s named subcommands (CLI11 keeps option groups among them, unnamed).
std::vector<const CLI::App*> Commands(const CLI::App& cmd) {
  return cmd.get_subcommands(
      [](const CLI::App* sub) { return !sub->get_name().empty(); });
}

// The subcommand name or alias of `cmd` nearest to `word`, if it is near
// enough to be a typo of it; else empty. Names win ties with aliases.
std::string NearestCommand(const CLI::App& cmd, const std::string& word) {
  std::string lower = absl::AsciiStrToLower(word);
  size_t best = lower.size() <= 3 ? 2 : 3;  // one more than the edits allowed
  std::string nearest;
  for (const CLI::App* sub : Commands(cmd)) {
    std::vector<std::string> words = {sub->get_name()};
    for (const auto& alias : sub->get_aliases()) words.push_back(alias);
    for (const auto& w : words) {
      size_t d = EditDistance(lower, w);
      if (d < best) {
        best = d;
        nearest = w;
      }
    }
  }
  return nearest;
}

void PrintUnknownCommand(const CLI::App& cmd, const std::string& path,
                         const std::string& word) {
  std::string near = NearestCommand(cmd, word);
  std::cerr << path << ": unknown command \"" << word << "\"; "
            << (near.empty()
                    ? absl::StrCat("run \"", path, " --help\" for the commands")
                    : absl::StrCat("did you mean \"", near, "\"?"))
            << std::endl;
}

}  // namespace

// After a failed parse, or --help: if a word where a command belongs named
// none, says which word, suggests the nearest command and returns 2; with
// --help, any word nothing took is an error too (help must not hide a typo).
// Looks at the commands parsed from the top down, as the first unknown word is
// the one to fix. Else nullopt: CLI11's own message and code stand.
std::optional<int> ReportUnknownWord(const CLI::App& app, bool help) {
  std::string path = "silt";
  for (const CLI::App* cmd = &app;;) {
    std::vector<std::string> words = cmd->remaining();
    for (const std::string& word : words) {
      if (Commands(*cmd).empty() || word.empty() || word[0] == '-') continue;
      PrintUnknownCommand(*cmd, path, word);
      return 2;
    }
    if (help && !words.empty()) {
      std::cerr << path << ": unexpected argument \"" << words.front()
                << "\"; run \"" << path << " --help\" for the usage"
                << std::endl;
      return 2;
    }
    std::vector<CLI::App*> parsed = cmd->get_subcommands();
    if (parsed.empty()) return std::nullopt;
    cmd = parsed.front();
    path += " " + cmd->get_name();
  }
}

}  // namespace silt::deploy
