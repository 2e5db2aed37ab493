// silt-invoker: parses flags, starts the node agent, waits for SIGINT/SIGTERM.
// SIGTERM (a planned stop) first drains the node's memory proclets to its
// peers; SIGINT, or a second signal during the drain, stops at once.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "invoker/invoker.h"
#include "silt/version.h"

#ifdef __SANITIZE_ADDRESS__  // the ASan+UBSan build
#include <sanitizer/lsan_interface.h>
#endif

int main(int argc, char** argv) {
  // gRPC's absl::Mutex runs deadlock detection unless told not to: measurable
  // per call.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (auto s = silt::invoker::PrepareProcess(); !s.ok())
    std::cerr << "silt-invoker: " << s.message() << std::endl;
  silt::invoker::Options o;
  CLI::App app{"silt-invoker: the Silt node agent (runs function instances)"};
  app.set_version_flag("--version",
                       std::string(silt::kVersion) + " " + silt::kGitSha);
  app.add_option("--gateway", o.gateway,
                 "The gateway's gRPC endpoint ADDR:PORT")
      ->capture_default_str();
  app.add_option("--listen", o.listen,
                 "This invoker's gRPC address (port 0 picks one)")
      ->capture_default_str();
  app.add_option("--data-dir", o.data_dir,
                 "Directory for bundles and instances")
      ->required();
  app.add_option("--containerd", o.containerd,
                 "containerd's socket for OCI images (default: a containerd "
                 "of the invoker's own under the data dir)");
  app.add_option("--gpu-backend", o.gpu_backend,
                 "Where GPU proclets run: auto (the node's GPU if it has one, "
                 "else its CPU cores), cuda, or host (CPU cores)")
      ->check(CLI::IsMember({"auto", "cuda", "host"}));
  app.add_option("--node-name", o.node_name,
                 "Node name (default: hostname-port)");
  app.add_option("--worker", o.worker_binary,
                 "silt-worker binary (default: next to this one)");
  int idle_s = 300, report_ms = 1000;
  app.add_option("--idle-timeout", idle_s,
                 "Seconds before idle instances above the minimum stop")
      ->capture_default_str();
  app.add_option("--report-interval-ms", report_ms, "Load report interval")
      ->capture_default_str();
  int pulse_ms = 5;
  app.add_option("--pulse-ms", pulse_ms,
                 "Sample CPU, memory and running work this often and tell the "
                 "gateway when they moved (0: full reports only)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--pulse-change", o.pulse_change,
                 "Fraction of capacity a figure must move by to be sent "
                 "before the next full report (0: every sample)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--max-instances", o.max_instances_per_function,
                 "Instances per function on this node")
      ->capture_default_str();
  app.add_option("--max-queue", o.max_queue_per_function,
                 "Queued calls per function before 429")
      ->capture_default_str();
  bool no_snapshots = false;
  app.add_flag("--no-snapshots", no_snapshots,
               "Always boot instances (no checkpoints, restores or forks)");
  bool criu_restore = false;
  app.add_flag("--criu-restore", criu_restore,
               "Restore every snapshot with CRIU (not silt-restorer)");
  uint64_t resident_mib = o.resident_memory_bytes >> 20;
  app.add_option("--resident-memory-mib", resident_mib,
                 "Memory that staged restorers and fork templates hold "
                 "together, least recently started functions' first to go "
                 "(0: neither; no fork tier)")
      ->capture_default_str();
  app.add_option("--template-memory-mib", resident_mib,
                 "Old name of --resident-memory-mib");
  app.add_option("--cpus", o.cpus,
                 "CPU cores this node offers, for placement and as the "
                 "instances' CPU quota together (default: all, no quota)");
  uint64_t memory_mib = 0;
  app.add_option("--memory", memory_mib,
                 "Memory in MiB this node offers, for placement and as the "
                 "instances' memory limit together (default: all, no limit)");
  double drain_timeout_s = 30;
  app.add_option("--drain-timeout", drain_timeout_s,
                 "On SIGTERM, seconds to wait for this node's memory proclets "
                 "to move to other nodes before stopping (0: do not drain)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  o.memory_bytes = memory_mib << 20;
  o.snapshots = !no_snapshots;
  o.fast_restore = !criu_restore;
  o.resident_memory_bytes = resident_mib << 20;
  o.idle_timeout = std::chrono::seconds(idle_s);
  o.report_interval = std::chrono::milliseconds(report_ms);
  o.pulse_interval = std::chrono::milliseconds(pulse_ms);

  // SIGUSR1 is internal: the drain is over. Blocked in every thread (they
  // inherit the mask) and taken by sigwait below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto inv = silt::invoker::Invoker::Start(o);
  if (!inv.ok()) {
    std::cerr << "silt-invoker: " << inv.status().message() << std::endl;
    return 1;
  }
  std::cout << "node " << (*inv)->node_name() << ", gateway " << o.gateway
            << "\n"
            << "listening on " << (*inv)->listen_address() << std::endl;
  silt::invoker::Invoker* invoker = inv->get();
  int sig = 0;
  while (sigwait(&stop, &sig) == 0 && sig == SIGUSR1) {
  }
  std::thread drainer;
  if (sig == SIGTERM && drain_timeout_s > 0) {
    pthread_t self = pthread_self();
    auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(drain_timeout_s * 1000));
    // On stdout, as "listening on" is: supervisors and tests wait for it.
    std::cout << "stopping: draining memory proclets to other nodes (at most "
              << drain_timeout_s << " s; signal again to stop now)"
              << std::endl;
    drainer = std::thread([invoker, timeout, self] {
      // Drain logs its outcome, including what will be lost.
      invoker->Drain(timeout).IgnoreError();
      pthread_kill(self, SIGUSR1);
    });
    sigwait(&stop, &sig);
    if (sig != SIGUSR1)
      fprintf(stderr,
              "silt-invoker: %s during the drain: stopping now; proclets "
              "still here will be lost\n",
              sig == SIGINT ? "SIGINT" : "SIGTERM");
  }
  invoker->Shutdown();  // cancels a drain still in progress
  if (drainer.joinable()) drainer.join();
  inv->reset();
  // Everything is stopped, flushed and closed. Skip static destructors: gRPC's
  // own threads may still be winding down and would call into them.
  fflush(nullptr);
#ifdef __SANITIZE_ADDRESS__
  __lsan_do_leak_check();  // what exit() would have run
#endif
  _exit(0);
}
