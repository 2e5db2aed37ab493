// `silt async`: the gateway's queue of async calls (/system/async): what
// waits, what runs, what gave up, and putting dead letters back.
#ifndef SILT_DEPLOY_ASYNC_CMD_H_
#define SILT_DEPLOY_ASYNC_CMD_H_

#include <functional>
#include <string>
#include <vector>

#include "deploy/http_client.h"

namespace silt::deploy {

// Sends one authorised request to the gateway (fails the command when it
// cannot be reached).
using Requester =
    std::function<HttpResult(const std::string& method, const std::string& path,
                             const std::string& body)>;

struct AsyncSelection {
  std::string ns;        // empty: every namespace
  std::string function;  // empty: every function
  std::string state;     // queued, callback or dead; empty: all
};

// Each returns the command's exit code; errors go to stderr.
int AsyncList(const Requester& send, const AsyncSelection& sel,
              const std::string& output);
// Retries the given calls, or with `all` every dead letter `sel` selects.
int AsyncRetry(const Requester& send, const std::vector<std::string>& ids,
               bool all, const AsyncSelection& sel);
int AsyncRemove(const Requester& send, const std::vector<std::string>& ids);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_ASYNC_CMD_H_
