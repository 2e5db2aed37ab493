// The GPU proclets this node hosts: one sandboxed silt-gpu-host process per
// (namespace, function, proclet name), started on the proclet's first
// request, each with its own lock so one function's launches never wait on
// another's. Instances' GPU requests (silt/gpu_wire.h, arriving on their
// state connections) are forwarded to it in order.
#ifndef SILT_INVOKER_GPU_PROCLETS_H_
#define SILT_INVOKER_GPU_PROCLETS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace silt::invoker {

struct GpuProcletsOptions {
  std::string data_dir;       // proclets' own dirs go under DATA_DIR/gpu
  std::string root_dir;       // the sandbox root skeleton
  std::string dev_dir;        // device nodes bound as /dev
  std::string worker_dir;     // holds silt-gpu-host
  std::string cgroup_prefix;  // e.g. "silt/node-a"
  // "auto" (CUDA where the node has a GPU, else the host backend), "cuda"
  // or "host".
  std::string backend = "auto";
  // Where the function's bundle is unpacked on this node, and the most
  // device memory its proclets may hold (0: the device's). NotFound when
  // the node does not run the function.
  struct FunctionInfo {
    std::string bundle_dir;
    uint64_t memory_limit = 0;
    uint32_t host_id = 0;
  };
  std::function<absl::StatusOr<FunctionInfo>(const std::string& ns,
                                             const std::string& function)>
      function;
};

struct GpuProcletInfo {
  std::string ns, function, name;
  std::string backend, device;
  uint64_t memory_limit = 0, memory_used = 0, launches = 0;
};

class GpuProclets {
 public:
  explicit GpuProclets(GpuProcletsOptions options);
  ~GpuProclets();  // ends every proclet's process

  // Serves one instance's state request with op kGpu (header included);
  // the reply (StateCode, results).
  std::string Serve(const std::string& ns, const std::string& function,
                    std::string_view request);
  std::vector<GpuProcletInfo> List();
  // Ends the proclets of a function that left this node (their state goes).
  void DropFunction(const std::string& ns, const std::string& function);

 private:
  struct Proclet;
  absl::StatusOr<std::shared_ptr<Proclet>> Find(const std::string& ns,
                                                const std::string& function,
                                                std::string_view name);

  GpuProcletsOptions options_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Proclet>> proclets_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_GPU_PROCLETS_H_
