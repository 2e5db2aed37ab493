// silt-gpu-host: one GPU proclet's process. The invoker starts it in a
// sandbox (the function's own uid, a cgroup and seccomp filter, none of the
// function's files: modules come as bytes, kLoadImage), so a GPU context,
// or kernels run on the host backend, are isolated from every other
// function's. On fd 3 it serves gpu::Proclet requests (silt/gpu_wire.h, no
// state header) in order, framed as gpu/channel.h says, until the invoker
// closes the channel.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gpu/backend.h"
#include "gpu/channel.h"
#include "gpu/proclet.h"

namespace {

std::string_view Flag(int argc, char** argv, std::string_view name) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a.size() > name.size() + 3 && a.substr(0, 2) == "--" &&
        a.substr(2, name.size()) == name && a[2 + name.size()] == '=')
      return a.substr(name.size() + 3);
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace silt::gpu;
  const std::string backend_flag(Flag(argc, argv, "backend"));
  const uint64_t limit = strtoull(
      std::string(Flag(argc, argv, "memory-limit")).c_str(), nullptr, 10);
  std::unique_ptr<Backend> backend;
  if (backend_flag == "cuda" ||
      (backend_flag == "auto" && CudaDeviceCount() > 0)) {
    auto b = MakeCudaBackend(0);
    if (!b.ok()) {
      fprintf(stderr, "silt-gpu-host: %s\n",
              std::string(b.status().message()).c_str());
      return 2;
    }
    backend = *std::move(b);
  } else {
    backend = MakeHostBackend();
  }
  ProcletOptions options;
  options.memory_limit = limit;
  Proclet proclet(std::move(backend), std::move(options));
  constexpr int kChannel = 3;
  std::string request;
  for (;;) {
    // Until the invoker is done (it closes the channel).
    if (!ReadFrame(kChannel, &request)) return 0;
    if (!WriteFrame(kChannel, {proclet.Serve(request)})) return 0;
  }
}
