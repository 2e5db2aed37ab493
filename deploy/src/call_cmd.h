// silt logs and silt invoke: a function's log lines, and calling it.
#ifndef SILT_DEPLOY_CALL_CMD_H_
#define SILT_DEPLOY_CALL_CMD_H_

#include <string>
#include <vector>

#include "cli_common.h"

namespace silt::deploy {

void Logs(const Client& c, const std::string& name, const std::string& ns,
          bool follow, int lines, const std::string& since,
          const std::string& since_time, const std::string& output);
int Invoke(const Client& c, const std::string& name, const std::string& ns,
           const std::string& method, const std::vector<std::string>& headers,
           const std::vector<std::string>& query,
           const std::string& content_type, bool show_headers, bool async,
           const std::string& callback_url);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_CALL_CMD_H_
