// silt nodes, proclets and state: the nodes, and where the pieces of the
// functions are (memory proclets' shards, GPU proclets, state structures).
#ifndef SILT_DEPLOY_CLUSTER_CMD_H_
#define SILT_DEPLOY_CLUSTER_CMD_H_

#include <string>

#include "cli_common.h"
#include "nlohmann/json.hpp"

namespace silt::deploy {

void NodesList(const Client& c, const std::string& output);
void ProcletsList(const Client& c, const std::string& ns,
                  const std::string& function, const std::string& output);
// A memory proclet's move (a /system/proclets/N/migrate answer), printed.
void PrintMigration(const nlohmann::json& m);
void StateList(const Client& c, const std::string& ns,
               const std::string& output);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_CLUSTER_CMD_H_
