// `silt events` and `silt top`: the rebalancer's decisions and the nodes'
// load as they change, from /system/events and /system/nodes.
#ifndef SILT_DEPLOY_WATCH_H_
#define SILT_DEPLOY_WATCH_H_

#include <chrono>
#include <functional>
#include <string>

#include "nlohmann/json.hpp"

namespace silt::deploy {

// GETs a gateway path and returns its JSON (fails the command on errors).
using JsonGetter = std::function<nlohmann::json(const std::string& path)>;

// Prints the events (table, or json lines); with `follow`, keeps polling for
// new ones until the process is interrupted.
void PrintEvents(const JsonGetter& get, bool follow, const std::string& output);

// Redraws nodes, their load and the latest moves every `interval`;
// `iterations` > 0 stops after that many frames (0: until interrupted).
void Top(const JsonGetter& get, std::chrono::milliseconds interval,
         int iterations);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_WATCH_H_
