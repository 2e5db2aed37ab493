// silt-gateway: parses flags, starts the gateway, waits for SIGINT/SIGTERM.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "gateway/gateway.h"
#include "silt/version.h"

#ifdef __SANITIZE_ADDRESS__  // the ASan+UBSan build
#include <sanitizer/lsan_interface.h>
#endif

int main(int argc, char** argv) {
  // Everything the gateway creates (store, keys, credentials, bundles) is for
  // its own user only.
  umask(077);
  // gRPC's absl::Mutex runs deadlock detection unless told not to: measurable
  // per call.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  silt::gateway::Options o;
  CLI::App app{
      "silt-gateway: the Silt API gateway (OpenFaaS-compatible REST API)"};
  app.set_version_flag("--version",
                       std::string(silt::kVersion) + " " + silt::kGitSha);
  app.add_option("--listen", o.listen,
                 "HTTP API address ADDR:PORT (port 0 picks one)")
      ->capture_default_str();
  app.add_option("--metrics-listen", o.metrics_listen,
                 "Prometheus metrics address")
      ->capture_default_str();
  app.add_option("--provider-listen", o.provider_listen,
                 "Also serve the faas-provider API here, for the OpenFaaS "
                 "gateway's functions_provider_url (faasd's provider port; "
                 "off by default)");
  app.add_option("--grpc-listen", o.grpc_listen,
                 "gRPC address invokers connect to")
      ->capture_default_str();
  app.add_option("--data-dir", o.data_dir,
                 "Directory for the store and credentials")
      ->required();
  app.add_option(
      "--secrets-key-file", o.secrets_key_file,
      "32-byte key (mode 0600) that seals secret values in the "
      "store (default DATA_DIR/secrets.key, created at first start)");
  bool no_auth = false;
  app.add_flag("--no-auth", no_auth,
               "Disable basic auth on /system/* (local development)");
  app.add_option("--threads", o.threads, "I/O threads (0 = one per core)");
  size_t max_body_mib = o.max_system_body_bytes >> 20;
  app.add_option("--max-body-mib", max_body_mib,
                 "Largest /system/* request body, MiB")
      ->capture_default_str();
  int read_timeout_s = 60, write_timeout_s = 60, upstream_timeout_s = 60;
  int node_timeout_ms = 5000;
  size_t max_function_body_mib = o.max_function_body_bytes >> 20;
  app.add_option("--max-function-body-mib", max_function_body_mib,
                 "Largest request body of a call to /function/, MiB (it "
                 "streams through to the function)")
      ->capture_default_str();
  size_t max_async_body_mib = o.max_async_body_bytes >> 20;
  app.add_option("--max-async-body-mib", max_async_body_mib,
                 "Largest request body of an async call, MiB (kept whole "
                 "in the queue)")
      ->capture_default_str();
  app.add_option("--upstream-timeout", upstream_timeout_s,
                 "Seconds a function call may take")
      ->capture_default_str();
  app.add_option("--node-timeout-ms", node_timeout_ms,
                 "Drop an invoker silent for this long")
      ->capture_default_str();
  bool no_autoscale = false;
  int64_t autoscale_interval_ms = o.autoscale_interval.count();
  int64_t autoscale_window_ms = o.autoscale_window.count();
  int64_t scale_down_delay_ms = o.scale_down_delay.count();
  app.add_flag("--no-autoscale", no_autoscale,
               "Keep every function at the replicas its user set");
  app.add_option("--autoscale-interval-ms", autoscale_interval_ms,
                 "How often the autoscaler samples load and decides")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
  app.add_option("--autoscale-window-ms", autoscale_window_ms,
                 "Load is averaged over this long")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
  app.add_option("--scale-down-delay-ms", scale_down_delay_ms,
                 "Replicas go down only after load stayed low this long")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}));
  app.add_option("--read-timeout", read_timeout_s,
                 "Seconds to receive a request")
      ->capture_default_str();
  app.add_option("--write-timeout", write_timeout_s,
                 "Seconds to send a response")
      ->capture_default_str();
  uint64_t shard_split_mib = 16;
  app.add_option("--shard-split-mib", shard_split_mib,
                 "Split a state shard once it passes this many MiB (moving "
                 "16 MiB takes ~25 ms here)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{4096}));
  bool no_leases = false;
  app.add_flag("--no-instance-leases", no_leases,
               "Send every call through its node's call port, also to a node "
               "on this machine (which otherwise lends the gateway warm "
               "instances to call directly)");
  bool no_rebalance = false;
  app.add_flag("--no-rebalance", no_rebalance,
               "Never move proclets or instances because of load");
  app.add_option("--cpu-high", o.cpu_high,
                 "Rebalance a node whose CPU use passes this fraction of its "
                 "cores while other work takes it")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 1.0));
  app.add_option("--memory-high", o.memory_high,
                 "Move memory proclets off a node whose memory use passes "
                 "this fraction of its memory")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 1.0));
  int64_t async_backoff_ms = o.async_initial_backoff.count();
  int64_t async_max_backoff_ms = o.async_max_backoff.count();
  app.add_option("--async-attempts", o.async_max_attempts,
                 "Runs of an async call before it becomes a dead letter")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  app.add_option("--async-backoff-ms", async_backoff_ms,
                 "First wait before an async call runs again (doubles)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  app.add_option("--async-max-backoff-ms", async_max_backoff_ms,
                 "Longest wait between runs of an async call")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}));
  app.add_option("--async-max-inflight", o.async_max_inflight,
                 "Async calls of one function running at a time (label "
                 "com.silt.async.max-inflight overrides)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));
  CLI11_PARSE(app, argc, argv);
  o.async_initial_backoff = std::chrono::milliseconds(async_backoff_ms);
  o.async_max_backoff = std::chrono::milliseconds(
      std::max(async_backoff_ms, async_max_backoff_ms));
  o.rebalance = !no_rebalance;
  o.instance_leases = !no_leases;
  o.shard_split_bytes = shard_split_mib << 20;
  o.auth = !no_auth;
  o.max_system_body_bytes = max_body_mib << 20;
  o.read_timeout = std::chrono::seconds(read_timeout_s);
  o.max_function_body_bytes = max_function_body_mib << 20;
  o.max_async_body_bytes = max_async_body_mib << 20;
  o.upstream_timeout = std::chrono::seconds(upstream_timeout_s);
  o.node_timeout = std::chrono::milliseconds(node_timeout_ms);
  o.autoscale = !no_autoscale;
  o.autoscale_interval = std::chrono::milliseconds(autoscale_interval_ms);
  o.autoscale_window = std::chrono::milliseconds(autoscale_window_ms);
  o.scale_down_delay = std::chrono::milliseconds(scale_down_delay_ms);
  o.write_timeout = std::chrono::seconds(write_timeout_s);

  // Block the stop signals before any thread starts so only the waiter below
  // sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto gw = silt::gateway::Gateway::Start(o);
  if (!gw.ok()) {
    std::cerr << "silt-gateway: " << gw.status().message() << std::endl;
    return 1;
  }
  std::string url = "http://" + (*gw)->listen_address();
  if (o.auth) {
    std::cout << "basic auth: user admin, password in "
              << (*gw)->password_file()
              << ((*gw)->credentials_generated() ? " (generated now)" : "")
              << "\n"
              << "log in with: cat " << (*gw)->password_file()
              << " | silt login --username admin --password-stdin --gateway "
              << url << "\n";
  } else {
    std::cout << "basic auth disabled (--no-auth)\n";
  }
  std::cout << "secrets sealed with the key in " << (*gw)->secrets_key_file()
            << ((*gw)->secrets_key_generated()
                    ? " (generated now: back it up with the data dir)"
                    : "")
            << "\n";
  std::cout << "metrics on " << (*gw)->metrics_address() << "\n";
  std::cout << "invokers connect to " << (*gw)->grpc_address() << "\n";
  if (!(*gw)->provider_address().empty())
    std::cout << "faas-provider API on " << (*gw)->provider_address() << "\n";
  std::cout << "listening on " << (*gw)->listen_address() << std::endl;

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop, &sig);
    std::cout << "silt-gateway: signal " << sig << ", shutting down"
              << std::endl;
    (*gw)->Shutdown();
  });
  (*gw)->Wait();
  waiter.join();  // Shutdown is only called by the waiter, so it has returned
  gw->reset();
  // Everything is stopped, flushed and closed. Skip static destructors: gRPC's
  // own threads may still be winding down and would call into them.
  fflush(nullptr);
#ifdef __SANITIZE_ADDRESS__
  __lsan_do_leak_check();  // what exit() would have run
#endif
  _exit(0);
}
