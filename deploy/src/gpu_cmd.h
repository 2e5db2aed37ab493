// `silt gpu`: the nodes' GPUs and the GPU proclets on them (/system/gpu),
// reclaiming a node's GPU (its proclets move to another GPU with room, else
// onto that node's CPU cores; it takes none until released) and resizing a
// proclet's allocation. Moving one
// proclet is `silt proclets migrate gN --to NODE [--backend cuda|host]`.
#ifndef SILT_DEPLOY_GPU_CMD_H_
#define SILT_DEPLOY_GPU_CMD_H_

#include <string>

#include "async_cmd.h"  // Requester
#include "nlohmann/json.hpp"

namespace silt::deploy {

// Each returns the command's exit code; errors go to stderr.
int GpuList(const Requester& send, const std::string& output);
int GpuReclaim(const Requester& send, const std::string& node);
int GpuRelease(const Requester& send, const std::string& node);
int GpuResize(const Requester& send, const std::string& id,
              const std::string& memory);
// One GPU proclet's move (a /system/proclets/gN/migrate answer), printed.
void PrintGpuMove(const nlohmann::json& m);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_GPU_CMD_H_
