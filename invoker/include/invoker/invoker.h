// silt-invoker: the node agent. Registers with the gateway, streams load
// reports, fetches bundles, and runs function instances (silt-worker processes
// in sandboxes), serving Invoker.Invoke and Invoker.Logs over gRPC.
#ifndef SILT_INVOKER_INVOKER_H_
#define SILT_INVOKER_INVOKER_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace silt::invoker {

struct Options {
  std::string gateway = "127.0.0.1:8081";  // the gateway's gRPC endpoint
  std::string listen = "127.0.0.1:0";      // this invoker's gRPC endpoint
  std::string data_dir;
  std::string node_name;      // default: hostname + listen port
  std::string worker_binary;  // default: silt-worker next to this binary
  std::chrono::milliseconds report_interval{std::chrono::seconds(1)};
  // Between reports, a compact pulse (CPU, memory, running work) whenever a
  // figure moved by more than `pulse_change` of capacity, sampled this often
  // (0: reports only).
  std::chrono::milliseconds pulse_interval{5};
  double pulse_change = 0.05;
  // Idle instances beyond a function's minimum are stopped after this long
  // (per function: label com.openfaas.scale.zero-duration).
  std::chrono::milliseconds idle_timeout{std::chrono::minutes(5)};
  int max_instances_per_function =
      8;  // per node (label com.openfaas.scale.max caps it too)
  int max_queue_per_function = 64;  // waiting calls beyond that get 429
  // Checkpoint instances after init and start later ones from the snapshot
  // (per function: label com.silt.snapshot=false opts out).
  bool snapshots = true;
  // Restore images with silt-restorer (maps the image's pages, no CRIU on
  // the critical path) when it is installed and the image allows; else CRIU.
  bool fast_restore = true;
  // Memory that staged restorers and fork templates hold together, ahead of
  // cold starts (the least recently started functions' go first when more
  // must fit); 0: neither (restores map their image when the call comes; no
  // fork tier).
  uint64_t resident_memory_bytes = uint64_t{1} << 30;
  // This node's capacity: reported to the gateway (placement) and enforced
  // on the instances together by their parent cgroup (silt/<node id>: CPU
  // quota and memory limit; each instance's own limits apply below it). 0:
  // the machine's, not limited.
  uint32_t cpus = 0;
  // containerd's socket for OCI images and containers; empty: the invoker
  // runs its own under DATA_DIR/containerd when the first image comes.
  std::string containerd;
  uint64_t memory_bytes = 0;
  // Where GPU proclets run: "auto" (the node's GPU where it has one, else
  // its CPU cores), "cuda" or "host" (CPU cores: the host backend).
  std::string gpu_backend = "auto";
};

// Call first thing in main, while the process has one thread: gives the
// invoker a mount namespace of its own (a slave of the host's), so that the
// mounts it makes for instances die with it, and a tmpfs on /run where /run
// is not one: CRIU keeps its kernel-feature cache there (criu.kdat), which
// takes tens of milliseconds off every checkpoint and restore.
absl::Status PrepareProcess();

class Invoker {
 public:
  static absl::StatusOr<std::unique_ptr<Invoker>> Start(const Options& options);
  ~Invoker();  // stops every instance

  std::string listen_address() const;
  std::string node_name() const;
  // Before a planned stop: asks the gateway to move every memory proclet held
  // here to the other nodes and waits for it, at most `timeout`. From the
  // request on, the gateway places nothing new here; instances keep running
  // and serving meanwhile. Logs the outcome. Returns OK when nothing is left
  // here; otherwise why the rest will be lost when this node stops:
  // Unavailable (no other node, or no gateway), ResourceExhausted (no other
  // node has room), DeadlineExceeded, Cancelled (Shutdown() was called), or
  // the failed migration's error. Thread-safe; meant to be called once.
  absl::Status Drain(std::chrono::milliseconds timeout);
  void Wait();
  // Stops Wait(), cancels a Drain() in progress and aborts the proclet moves
  // from here (their proclets stay, and are lost when the node stops).
  // Thread-safe.
  void Shutdown();

 private:
  struct Impl;
  explicit Invoker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_INVOKER_H_
