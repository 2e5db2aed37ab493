// silt build, push, up and new: a stack file's functions built into bundles
// (deploy/build.h), uploaded, deployed; a new function from a template.
#ifndef SILT_DEPLOY_BUILD_CMD_H_
#define SILT_DEPLOY_BUILD_CMD_H_

#include <string>

#include "cli_common.h"
#include "deploy/stack.h"

namespace silt::deploy {

// The directory a stack file's handlers are relative to.
std::string StackDir(const std::string& stack_file);
// The image a built function deploys as: NAME@sha256:<digest>.
std::string BundleImage(const StackFunction& f, const std::string& digest);

// build, push, up: a stack file's functions into bundles, onto the gateway,
// deployed.
enum class BuildStep { kBuild, kPush, kUp };

// `step` for the stack file's functions (`filter`: only that one).
int BuildPushUp(const GatewayFlags& g, const std::string& ns,
                std::string stack_file, const std::string& filter,
                BuildStep step);
void NewFunction(const std::string& name, const std::string& lang,
                 const std::string& stack_file);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_BUILD_CMD_H_
