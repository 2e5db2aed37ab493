// stack.yml, faas-cli's schema (go-sdk stack/schema.go), and its mapping to the
// OpenFaaS FunctionDeployment JSON the gateway takes.
#ifndef SILT_DEPLOY_STACK_H_
#define SILT_DEPLOY_STACK_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::deploy {

using StringMap = std::map<std::string, std::string>;

struct StackResources {
  std::string memory;
  std::string cpu;
  bool empty() const { return memory.empty() && cpu.empty(); }
};

struct StackFunction {
  std::string name;
  std::string lang;
  std::string handler;
  std::string image;
  std::string fprocess;
  std::string ns;
  StringMap environment;  // environment_file entries, then environment
  std::vector<std::string> secrets;
  std::vector<std::string> constraints;
  std::optional<StringMap> labels;
  std::optional<StringMap> annotations;
  StackResources limits;
  StackResources requests;
  bool readonly_root_filesystem = false;
  bool skip_build = false;
};

struct Stack {
  std::string provider_name;
  std::string gateway;
  std::vector<StackFunction> functions;  // in file order
};

// Expands ${VAR} and ${VAR:-default} with `lookup` (the environment by
// default).
std::string EnvSubst(
    absl::string_view text,
    const std::function<std::optional<std::string>(const std::string&)>&
        lookup = nullptr);

// Parses stack.yml text. `dir` resolves environment_file paths.
absl::StatusOr<Stack> ParseStack(absl::string_view yaml, const std::string& dir,
                                 bool envsubst = true);
absl::StatusOr<Stack> LoadStack(const std::string& path, bool envsubst = true);

// The FunctionDeployment JSON for one function.
std::string DeploymentJson(const StackFunction& f);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_STACK_H_
