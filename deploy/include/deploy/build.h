// `silt build`: turns a stack.yml function into a bundle (see
// proclets/bundle.h).
#ifndef SILT_DEPLOY_BUILD_H_
#define SILT_DEPLOY_BUILD_H_

#include <string>

#include "absl/status/statusor.h"
#include "deploy/stack.h"

namespace silt::deploy {

struct BuiltBundle {
  std::string path;    // the bundle file written
  std::string digest;  // sha256:<hex>
  std::string kind;
  size_t size = 0;
};

// Where `silt build` writes the bundle of `fn`: <stack
// dir>/build/<name>.bundle.
std::string BundlePath(const std::string& stack_dir, const StackFunction& fn);

// Builds one function: lang cpp compiles the handler directory's C++ sources
// against the Silt SDK into handler.so; lang exec/python packs the handler
// directory with fprocess as the entry (environment `mode`: classic (default)
// or http; `upstream_url` for http). Other files in the handler directory
// travel in the bundle too.
absl::StatusOr<BuiltBundle> BuildFunction(const std::string& stack_dir,
                                          const StackFunction& fn,
                                          std::string* log);

// The bundle already built for `fn`, if any.
absl::StatusOr<BuiltBundle> ReadBuiltBundle(const std::string& stack_dir,
                                            const StackFunction& fn);

// The directory holding silt/function.h: $SILT_SDK_INCLUDE, the source tree
// this CLI was built from, or the install prefix.
absl::StatusOr<std::string> SdkIncludeDir();

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_BUILD_H_
