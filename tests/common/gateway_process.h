// Starts the real silt-gateway binary on 127.0.0.1:0 for integration tests.
#ifndef SILT_TESTS_COMMON_GATEWAY_PROCESS_H_
#define SILT_TESTS_COMMON_GATEWAY_PROCESS_H_

#include <string>
#include <vector>

#include "common/process.h"
#include "deploy/http_client.h"

namespace silt::testing {

class GatewayProcess {
 public:
  // Starts silt-gateway with --data-dir `data_dir` and `extra` flags, its
  // invoker-facing gRPC on `grpc_listen`; waits for "listening on".
  static absl::StatusOr<GatewayProcess> Start(
      const std::string& data_dir, const std::vector<std::string>& extra = {},
      const std::string& grpc_listen = "127.0.0.1:0");

  const std::string& url() const { return url_; }  // http://127.0.0.1:PORT
  const std::string& metrics_url() const { return metrics_url_; }
  // With --provider-listen in `extra`: its URL.
  const std::string& provider_url() const { return provider_url_; }
  const std::string& grpc_address() const {
    return grpc_address_;
  }                              // for invokers
  std::string password() const;  // from DATA_DIR/secrets/basic-auth-password
  std::string auth_header() const;
  Process& process() { return process_; }
  int Stop(int sig) { return process_.Stop(sig); }

  // One request; with_auth adds the admin credentials.
  // Pushes a small exec bundle (classic mode, `cat`) and returns
  // "NAME@sha256:...".
  std::string PushTestBundle(const std::string& name = "test") const;
  // Pushes an exec bundle (classic mode) whose fprocess is `entry`, holding
  // `files` (path, content); returns "NAME@sha256:...".
  std::string PushExecBundle(
      const std::string& name, const std::string& entry,
      const std::vector<std::pair<std::string, std::string>>& files) const;

  deploy::HttpResult Call(const std::string& method, const std::string& path,
                          const std::string& body = "", bool with_auth = true,
                          const deploy::Headers& headers = {}) const;

 private:
  Process process_;
  std::string data_dir_;
  std::string url_;
  std::string metrics_url_;
  std::string provider_url_;
  std::string grpc_address_;
};

}  // namespace silt::testing

#endif  // SILT_TESTS_COMMON_GATEWAY_PROCESS_H_
