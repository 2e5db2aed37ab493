// silt-gateway: the OpenFaaS-compatible HTTP API (and metrics) over the
// embedded store.
#ifndef SILT_GATEWAY_GATEWAY_H_
#define SILT_GATEWAY_GATEWAY_H_

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace silt::gateway {

struct Options {
  std::string listen = "127.0.0.1:8080";
  std::string metrics_listen = ":8082";
  std::string grpc_listen = "127.0.0.1:8081";  // where invokers connect
  // A listener for the OpenFaaS gateway, as faasd's provider (:8081 there):
  // the faas-provider contract exactly (GET /system/info flat, the function
  // and secret routes, logs, /function/, /healthz, /metrics), none of Silt's
  // own routes. Empty: none.
  std::string provider_listen;
  // Owner-only (0700) with everything the gateway keeps in it: Start tightens
  // a data dir, store or bundle file that group or others can reach.
  std::string data_dir;
  // The 32-byte key that seals secret values in the store. Empty: DATA_DIR/
  // secrets.key, created at the first start. Either way a key file of the
  // wrong size, or one group or others can access, stops the start.
  std::string secrets_key_file;
  bool auth = true;
  int threads = 0;  // 0 = one per core, at least 2
  size_t max_system_body_bytes = 10 << 20;
  // A synchronous call's body streams through (only the function holds it
  // whole); an async one is kept in the queue whole.
  size_t max_function_body_bytes = size_t{1} << 30;
  size_t max_async_body_bytes = 32 << 20;
  std::chrono::milliseconds read_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds write_timeout{std::chrono::seconds(60)};
  // Longest a function call may take (exec_timeout shortens it per function).
  std::chrono::milliseconds upstream_timeout{std::chrono::seconds(60)};
  // An invoker silent for this long is dropped; its replicas move to the
  // others.
  std::chrono::milliseconds node_timeout{std::chrono::seconds(5)};
  // The autoscaler (functions with com.openfaas.scale.* labels): how often it
  // decides, the window load is averaged over, and how long load must stay
  // low before replicas go down; or off (replicas stay the user's count).
  bool autoscale = true;
  std::chrono::milliseconds autoscale_interval{std::chrono::seconds(1)};
  std::chrono::milliseconds autoscale_window{std::chrono::seconds(10)};
  std::chrono::milliseconds scale_down_delay{std::chrono::seconds(60)};
  // A state shard splits once it passes this many bytes (0: the directory's
  // default, 16 MiB); structures may ask for less or more.
  uint64_t shard_split_bytes = 0;
  // The rebalancer: its high-water marks (fractions of a node's cores and
  // memory; the low marks sit 0.2 and 0.1 below), or off.
  bool rebalance = true;
  // Calls to a node on this machine go straight to instances it lends
  // (invoker/call_wire.h, "Leases"); off, every call goes through its call
  // port.
  bool instance_leases = true;
  double cpu_high = 0.9, memory_high = 0.9;
  // Async calls: runs before a call becomes a dead letter, the first wait
  // between runs (doubling up to the maximum), and how many of one function's
  // calls run at a time (the label com.silt.async.max-inflight overrides it).
  uint32_t async_max_attempts = 10;
  std::chrono::milliseconds async_initial_backoff{std::chrono::seconds(2)};
  std::chrono::milliseconds async_max_backoff{std::chrono::seconds(120)};
  uint32_t async_max_inflight = 4;
};

class Gateway {
 public:
  // Opens the store, loads or creates the credentials, binds both ports and
  // starts serving on its own threads.
  static absl::StatusOr<std::unique_ptr<Gateway>> Start(const Options& options);
  ~Gateway();  // stops serving and closes the store

  // The bound addresses as ADDR:PORT (the real port when 0 was asked for).
  std::string listen_address() const;
  std::string metrics_address() const;
  std::string provider_address() const;  // empty without provider_listen
  std::string grpc_address() const;
  // The file holding the basic-auth password, empty with auth off.
  std::string password_file() const;
  bool credentials_generated() const;
  // The key file in use, and whether this start created it.
  std::string secrets_key_file() const;
  bool secrets_key_generated() const;

  // Blocks until Shutdown() is called (from any thread or a signal handler
  // thread).
  void Wait();
  void Shutdown();

 private:
  struct Impl;
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_GATEWAY_H_
