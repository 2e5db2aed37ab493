// silt local: a gateway and one invoker on this machine, as child
// processes of the CLI.
#ifndef SILT_DEPLOY_LOCAL_CMD_H_
#define SILT_DEPLOY_LOCAL_CMD_H_

#include <string>

namespace silt::deploy {

struct LocalOptions {
  std::string data_dir;
  std::string listen = "127.0.0.1:8080";  // the gateway's HTTP API
  // The gateway's invoker-facing gRPC and its metrics port; empty: the host of
  // `listen`, port 0 (a free port, so two `silt local` never collide).
  std::string grpc_listen;
  std::string metrics_listen;
  std::string provider_listen;  // the faas-provider API; empty: none
  bool no_auth = false;
  // Every call through the invoker's call port (silt-gateway
  // --no-instance-leases).
  bool no_instance_leases = false;
};

// `silt local`: a gateway and one invoker on this machine, as child processes.
// The invoker learns the gateway's gRPC address from the gateway's output, so
// every port but --listen's may be 0.
int Local(LocalOptions o);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_LOCAL_CMD_H_
