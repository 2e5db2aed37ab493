// stack.yml as `silt` and faas-cli users write it: a stack or an error, never
// a crash or an escaped exception.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "deploy/stack.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view yaml(reinterpret_cast<const char*>(data), size);
  auto stack = silt::deploy::ParseStack(yaml, "/nonexistent", false);
  if (stack.ok()) {
    for (const auto& f : stack->functions)
      (void)silt::deploy::DeploymentJson(f);
  }
  (void)silt::deploy::EnvSubst(
      yaml, [](const std::string&) { return std::optional<std::string>("x"); });
  return 0;
}
