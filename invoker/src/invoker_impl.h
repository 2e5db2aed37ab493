// The invoker's internals, shared by the files that implement it (one per
// concern: instances, images, restores, starts, calls, control). Private to
// invoker/src; nothing outside the invoker includes it.
#ifndef SILT_INVOKER_INVOKER_IMPL_H_
#define SILT_INVOKER_INVOKER_IMPL_H_

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <linux/magic.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysinfo.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bundle_cache.h"
#include "call_mux.h"
#include "call_port.h"
#include "channel.h"
#include "cluster_view.h"
#include "container_images.h"
#include "executor.h"
#include "gateway/proto/control.grpc.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gpu/devices.h"
#include "gpu_proclets.h"
#include "hosted_shard.h"
#include "image_catalog.h"
#include "invoker/call_wire.h"
#include "invoker/invoker.h"
#include "invoker/proto/invoker.grpc.pb.h"
#include "invoker/proto/proclets.grpc.pb.h"
#include "invoker/proto/worker.pb.h"
#include "lease_port.h"
#include "load_pulse.h"
#include "logs.h"
#include "node_cgroup.h"
#include "proclet_host.h"
#include "proclets/bundle.h"
#include "random_id.h"
#include "resident_budget.h"
#include "sandbox.h"
#include "seccomp_log.h"
#include "silt/abi.h"
#include "snapshot/criu.h"
#include "snapshot/fast_restore.h"
#include "snapshot/image.h"
#include "snapshot/working_set.h"

namespace silt::invoker {

namespace control = ::silt::control::v1;
using Clock = std::chrono::steady_clock;
using call_wire::ColdStart;
using control::FunctionSpec;

// Cold starts of one function this close together make a burst; a function
// keeps earning fork templates for this long after its last one.
constexpr auto kBurstGap = std::chrono::seconds(2);
constexpr auto kTemplateAfterBurst = std::chrono::minutes(10);

inline grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

// Go durations ("1m30s", "500ms", "10s") or plain seconds ("30").
inline std::optional<std::chrono::milliseconds> ParseDuration(
    absl::string_view s) {
  s = absl::StripAsciiWhitespace(s);
  if (s.empty()) return std::nullopt;
  double secs_only = 0;
  if (absl::SimpleAtod(s, &secs_only)) {
    return std::chrono::milliseconds(static_cast<int64_t>(secs_only * 1000));
  }
  double total_ms = 0;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() && (absl::ascii_isdigit(s[j]) || s[j] == '.')) ++j;
    double v = 0;
    if (j == i || !absl::SimpleAtod(s.substr(i, j - i), &v))
      return std::nullopt;
    size_t k = j;
    while (k < s.size() && absl::ascii_isalpha(s[k])) ++k;
    absl::string_view unit = s.substr(j, k - j);
    if (unit == "h")
      total_ms += v * 3600000;
    else if (unit == "m")
      total_ms += v * 60000;
    else if (unit == "s")
      total_ms += v * 1000;
    else if (unit == "ms")
      total_ms += v;
    else if (unit == "us" || unit == "µs")
      total_ms += v / 1000;
    else if (unit == "ns")
      total_ms += v / 1e6;
    else
      return std::nullopt;
    i = k;
  }
  return std::chrono::milliseconds(static_cast<int64_t>(total_ms));
}

inline std::string Key(const std::string& ns, const std::string& name) {
  return ns + "/" + name;
}

// ---- instances ----

struct Template;

struct Instance {
  std::string id;
  // A container instance's container and network (OCI image functions):
  // stopped after the worker that proxies to it (declared before `proc`).
  ContainerLease container;
  std::unique_ptr<SandboxedProcess> proc;
  int channel = -1;
  std::string base_dir;  // DATA_DIR/instances/<id>: secrets, run, work
  uint32_t host_id = 0;  // the function's (HostIdOf): owns secrets and run
  Clock::time_point last_used;
  bool fresh = true;  // has not served a call yet
  double start_ms = 0;
  call_wire::StartTier tier = call_wire::StartTier::kBoot;  // how it started
  // A clone keeps its template (and so its PID namespace) alive.
  std::shared_ptr<Template> tmpl;
  bool tmp_mounted = false;  // base_dir/tmp is a tmpfs of ours
  int listener = -1;         // a ready restorer's run/s
  // Restored lazily from this image (its pages file mapped, not read ahead)
  // with no working set recorded yet: its first call records one (read and
  // cleared under Impl::mu once the instance may take calls at once).
  std::string record_working_set;
  // How many calls it takes at once (WorkerReady.concurrency: a thread-safe
  // native function). Above 1, `mux` carries them and its pool holds it in
  // `sharing` while any runs: `calls` of them (Impl::mu); once `retired`
  // (a call of it timed out or lost its caller) it takes no more and stops
  // when the last ends.
  uint32_t concurrency = 1;
  std::unique_ptr<CallMux> mux;
  int calls = 0;
  bool retired = false;
  std::mutex death_mu;  // its calls that failed ask DeathReason one at a time
  ~Instance() {
    mux.reset();
    if (channel >= 0) close(channel);
    if (listener >= 0) close(listener);
    if (proc) proc->Kill();
    proc.reset();
    if (tmp_mounted) umount2((base_dir + "/tmp").c_str(), MNT_DETACH);
    std::error_code ec;
    if (!base_dir.empty()) std::filesystem::remove_all(base_dir, ec);
  }
};

// A call's hold on an instance: the whole of it (`own`, one call at a time),
// or one of the calls of one that takes several (`shared`: its pool keeps it).
struct Lease {
  std::unique_ptr<Instance> own;
  Instance* shared = nullptr;
  Instance* get() const { return own ? own.get() : shared; }
  Instance* operator->() const { return get(); }
  Instance& operator*() const { return *get(); }
};

// What an instance said when it became ready: how many calls it takes.
inline void TakeReady(Instance& inst, const v1::WorkerReady& ready) {
  // (After a park the channel is a new one: no call runs meanwhile.)
  inst.concurrency = std::clamp(ready.concurrency(), 1u, SILT_MAX_CONCURRENCY);
  inst.mux =
      inst.concurrency > 1 ? std::make_unique<CallMux>(inst.channel) : nullptr;
}

// A paused instance of one function version that forks clones.
struct Template {
  std::string snapshot_id;
  std::unique_ptr<Instance> inst;
  std::mutex fork_mu;  // one fork at a time on its channel
  Clock::time_point last_used;
};

inline std::string SnapshotIdOf(const FunctionSpec& spec) {
  FunctionSpec copy = spec;
  copy.set_min_instances(0);
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    copy.SerializeToCodedStream(&coded);
  }
  std::string digest = proclets::Sha256Digest(bytes);  // sha256:<hex>
  return absl::StrCat(spec.name(), "-", digest.substr(7, 20));
}

inline bool SnapshotsWanted(const FunctionSpec& spec) {
  auto it = spec.labels().find("com.silt.snapshot");
  return it == spec.labels().end() ||
         !(it->second == "false" || it->second == "0" || it->second == "off");
}

// A listening socket at DIR/s (the worker's /var/silt/run/s), for `host_id`
// alone.
inline absl::StatusOr<int> ListenIn(const std::string& dir, uint32_t host_id) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return absl::InternalError("socket failed");
  std::string path = dir + "/s";
  int dfd = -1;
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    dfd = open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    path = absl::StrCat("/proc/self/fd/", dfd, "/s");
  }
  unlink((dir + "/s").c_str());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int rc = bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  if (dfd >= 0) close(dfd);
  if (rc != 0 || listen(s, 4) != 0) {
    close(s);
    return absl::InternalError(
        absl::StrCat("cannot listen in ", dir, ": ", strerror(err)));
  }
  chmod((dir + "/s").c_str(), 0600);
  (void)!chown((dir + "/s").c_str(), host_id, host_id);
  return s;
}

// The ProcletHost gRPC service (invoker.cc).
class ProcletService;

struct Invoker::Impl final : public v1::Invoker::Service {
  Options options;
  std::string node_name;
  std::string cgroup_id;  // names this invoker's cgroups: silt/<id>/<instance>
  // silt/<id>: the node's capacity, the parent of every instance's cgroup.
  // Outlives the instances (members go in reverse order).
  std::unique_ptr<NodeCgroup> node_cgroup;
  std::string worker_dir;  // DATA_DIR/bin: a private copy of silt-worker, bound
                           // into sandboxes
  // GPUs found at start (none with --gpu-backend host): reported for the
  // placement of GPU proclets; the first one's model and memory.
  uint32_t gpus = 0;
  std::string gpu_model;
  uint32_t gpu_compute = 0;  // its compute capability, 75 for 7.5
  uint64_t gpu_memory = 0;
  std::string address;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> gateway_channel;
  std::unique_ptr<control::Control::Stub> control;
  // OCI images in containerd (silt image import); uses `control`.
  std::unique_ptr<ContainerImages> container_images;
  // Streams an image archive from the gateway into `path`.
  absl::Status FetchArchive(const std::string& digest, const std::string& path);
  LogBook logs;
  std::unique_ptr<LogCollector> collector;
  // Memory proclets held here and the instances' state connections.
  std::unique_ptr<ProcletHost> proclet_host;
  std::unique_ptr<CallPort> call_port;    // after proclet_host: its key
  std::unique_ptr<LeasePort> lease_port;  // likewise
  std::unique_ptr<ProcletService> proclet_service;
  std::atomic<uint64_t> instance_seq{0};
  // Compute jobs of the instances here, and the cluster they run on.
  ClusterView cluster;
  std::unique_ptr<Executor> executor;
  // The GPU proclets hosted here (one sandboxed process each).
  std::unique_ptr<GpuProclets> gpu_proclets;
  GpuProcletsOptions GpuProcletsHere();
  std::unique_ptr<SeccompLog> seccomp_log;  // null without /dev/kmsg

  // One pool per function version.
  struct Pool {
    FunctionSpec spec;
    std::shared_ptr<const Bundle> bundle;
    std::vector<std::unique_ptr<Instance>> idle;
    // Instances taking several calls at once with calls running (each counts
    // in `busy` once).
    std::vector<std::unique_ptr<Instance>> sharing;
    int busy = 0;
    int starting = 0;
    int waiting = 0;
    int filling =
        0;  // of `starting`, those started by Fill (no caller waits for them)
    uint32_t min_instances = 0;
    // min_instances went down (scaled down): the idle instances above it
    // stop at the next reap, however recently they served.
    bool trim = false;
    std::condition_variable cv;
    // Snapshots of this version: its id, whether one is being taken, and the
    // resident fork template, if any.
    std::string snapshot_id;
    bool snapshot_wanted = false;
    bool forkable = false;  // exec http servers are not forked
    bool checkpointing = false;
    std::shared_ptr<Template> tmpl;
    bool template_starting = false;
    Clock::time_point template_retry_after;
    std::condition_variable template_cv;  // template_starting went false
    // A silt-restorer waiting in a ready sandbox for the next restore.
    std::unique_ptr<Instance> restorer;
    bool restorer_starting = false;
    // The last cold start: which function's staged restorer and template go
    // first when the resident budget is short (resident_budget.h); what its
    // restorer and template held when last measured (0: not yet).
    Clock::time_point last_start;
    uint64_t restorer_bytes = 0, template_bytes = 0;
    // Whether its staged restorer has the image's pages faulted in (else it
    // only mapped them: a few hundred KiB instead of the image's size, and
    // the first call faults in what it touches); what such a one held.
    bool restorer_populated = false;
    uint64_t light_restorer_bytes = 0;
    // The last cold start that found no restorer staged soon after another
    // (a burst: the fork tier serves those; kBurstGap).
    Clock::time_point last_burst;
    // A container function's next instance, restored from its checkpoint
    // ahead of need with its container frozen (no CPU): a cold start thaws
    // it (TakeStaged). Held under the resident budget like a restorer; what
    // it held when last measured (0: not yet), and its checkpoint's size.
    // (Like the rest of a Pool, under Impl::mu.)
    std::unique_ptr<Instance> staged;
    bool staging = false;
    Clock::time_point staging_retry_after;
    uint64_t staged_bytes = 0, staged_estimate = 0;
    // Of `busy`, instances lent to the gateway (lent, below).
    int lent = 0;
  };
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Pool>> pools;  // key ns/name
  // Instances lent to a gateway on this machine (lease_port.h; under mu):
  // taken like a call's, held until given back (invoker_leases.cc).
  struct LentInstance {
    uint64_t conn = 0;  // the lease connection
    std::shared_ptr<Pool> pool;
    Lease lease;
    bool recalled = false;
  };
  std::map<uint64_t, LentInstance> lent;
  uint64_t next_lease = 1;
  std::condition_variable lent_cv;       // `lent` lost one
  std::unique_ptr<BundleCache> bundles;  // DATA_DIR/bundles
  // What a container function's instances run: no files, its worker only
  // proxies to the container's watchdog (kind "container").
  std::shared_ptr<const Bundle> container_bundle;
  // The function's bundle, or container_bundle for an OCI image function.
  absl::StatusOr<std::shared_ptr<const Bundle>> BundleFor(
      const FunctionSpec& spec);
  // Starts the container of a container function's instance: its network
  // namespace for the worker's sandbox (sb->netns).
  // `tier`: kAny restores from the function's checkpoint on this node by
  // runc when there is one and that measured faster than a boot, else boots
  // (and checkpoints the first instance it boots); kBoot boots; kCriu (or
  // kRestore: no instance was staged) restores by runc or fails.
  absl::Status StartContainer(const FunctionSpec& spec, Instance& inst,
                              SandboxSpec* sb, ColdStart tier);
  // Stages the next instance of one container function that has a
  // checkpoint here and none staged (the most recently started first),
  // when the resident budget has room: restored by runc, then frozen.
  void TendStagedContainers();
  // `pool`'s staged instance, thawed, as a cold start's (tier restore); null
  // when there is none (or it was found gone).
  std::unique_ptr<Instance> TakeStaged(Pool& pool);
  // Image `name` (normalized) was imported again with other content: the
  // checkpoints of functions that run it go, with what was staged from them
  // (their warm instances run on, as faasd's containers do).
  void ImageReplaced(const std::string& name);
  // Checkpoints container `id`, an instance of `spec` booted from the
  // image whose digest is `image_digest`, into the catalog (the function's
  // log says how it went).
  void CheckpointContainer(const FunctionSpec& spec, ContainerRuntime& runtime,
                           const std::string& id,
                           const std::string& image_digest);
  // How long a container function version's instances took to boot and to
  // restore on this node (the last of each, ms; 0: not yet): restore is the
  // default only where it is the faster (runc restoring a small image takes
  // longer than booting it).
  struct ContainerStartTimes {
    double boot_ms = 0, restore_ms = 0;
    bool told = false;  // the log says already that its instances boot
  };
  absl::Mutex container_times_mu;
  std::map<std::string, ContainerStartTimes> container_times
      ABSL_GUARDED_BY(container_times_mu);
  // Snapshot images complete on this node, their plans and working sets
  // (DATA_DIR/snapshots, DATA_DIR/working-sets).
  std::unique_ptr<ImageCatalog> images;
  std::string dev_dir;  // DATA_DIR/dev: device nodes bound as /dev
  // DATA_DIR/gpu-dev: the same and the GPU's, for GPU proclets' processes
  // (dev_dir where the node has no NVIDIA device or uses --gpu-backend host).
  std::string gpu_dev_dir;
  std::string root_skeleton;  // DATA_DIR/root: every sandbox's mount points
  bool bind_dev_tmp = false;
  bool snapshots_on = false;     // options.snapshots and CRIU 4.1+ present
  bool fast_restore_on = false;  // silt-restorer is installed
  // Instances done with, for the reaper to tear down off the call path.
  std::vector<std::unique_ptr<Instance>> graveyard;
  int criu_version = 0;
  bool have_assignment = false;
  // Compute proclets running here: their instances' channels (shut down
  // when the invoker stops, so their waits end).
  std::multiset<int> task_channels;
  uint32_t tasks_running = 0;
  // The most that ran at once since the last pulse and the last report (what
  // they send: a node running shares back to back must not read as running
  // none when a sample falls between two shares).
  uint32_t tasks_peak_pulse = 0, tasks_peak_report = 0;
  LoadPulse::Sample last_sample;  // the connector thread's
  // The node cgroup's CPU time at the last report (under mu).
  uint64_t cpu_nanos = 0;
  Clock::time_point cpu_sampled;

  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;
  std::thread connector;
  std::thread reaper;
  std::thread tender;      // keeps ready restorers (TendLoop)
  bool tend_kick = false;  // under stop_mu: a restorer was taken
  // Under stop_mu: the gateway connection's call (ConnectLoop) and a
  // Drain() call, cancelled when the invoker stops.
  grpc::ClientContext* connect_ctx = nullptr;
  grpc::ClientContext* drain_ctx = nullptr;
  ~Impl() override;

  bool Stopping();

  // A bundle's archive from the gateway (BundleCache::Fetch).
  absl::StatusOr<std::string> FetchBundle(const std::string& digest);

  // ---- instances ----

  // Creates DATA_DIR/instances/<id> with secrets/ (the function's secrets),
  // run/ and work/.
  std::unique_ptr<Instance> NewInstance(const FunctionSpec& spec);

  // Log pipes for an instance: returns the write ends; the read ends go to
  // the collector.
  absl::Status LogPipes(const FunctionSpec& spec, const std::string& id,
                        int* out_w, int* err_w);

  // An instance's state connection: the proclet host serves one end; the
  // other (returned) goes to the worker.
  absl::StatusOr<int> StateSocket(const FunctionSpec& spec);

  // The sandbox of an instance of `spec` (argv, env and fds are the
  // caller's).
  absl::Status SandboxFor(const FunctionSpec& spec, const Bundle& bundle,
                          Instance& inst, bool snapshot_ready, SandboxSpec* sb);

  // An instance's own limits, at most the node's (its parent cgroup's): v1
  // refuses a child CPU quota above its parent's, and a larger memory limit
  // would only pretend. 0: none of its own (the node's still applies).
  uint64_t MemoryLimit(const FunctionSpec& spec) const;
  uint64_t CpuMillis(const FunctionSpec& spec) const;

  // Boot: a new sandbox, silt-worker, the function's init.
  // `container_tier`: how a container function's instance starts
  // (StartContainer).
  absl::StatusOr<std::unique_ptr<Instance>> StartInstance(
      const FunctionSpec& spec, const Bundle& bundle,
      bool snapshot_ready = false, ColdStart container_tier = ColdStart::kAny);

  // Why an instance's channel broke: OOM kill, seccomp violation, crash.
  // How an instance died (it is killed first if it has not).
  struct Death {
    call_wire::Failure kind = call_wire::Failure::kCrash;
    std::string text;  // "killed: out of memory (memory limit reached)", ...
  };
  Death DeathReason(Instance& inst);

  // ---- snapshots ----
  std::vector<snapshot::ExternalMount> Mounts(const Instance& inst,
                                              const Bundle& bundle);

  void DropImage(const std::string& id, const std::string& why);

  // Wakes a parked worker (SIGUSR1; it connects to run/s), hands it its log
  // fds and identity, and waits for it to be ready. A future template keeps
  // the image's identity: its clones reseed and run the after-restore hook.
  absl::Status WakeAndResume(const FunctionSpec& spec, Instance& inst,
                             pid_t pid, int listener, bool as_template = false);

  // Not a zombie, not gone.
  static bool Alive(pid_t pid);

  uint64_t Seed();

  // Parks a freshly booted instance, checkpoints it (it keeps running) into
  // DATA_DIR/snapshots/<id>, and resumes it.
  absl::Status Checkpoint(Pool& pool, Instance& inst);

  // The image of `pool`'s version on this node, fetched from a peer if
  // another node has it. NotFound when nobody has one.
  absl::StatusOr<std::string> EnsureImage(Pool& pool);

  absl::Status FetchImage(const std::string& peer, const std::string& id);

  grpc::Status FetchSnapshot(
      grpc::ServerContext* ctx, const v1::FetchSnapshotRequest* req,
      grpc::ServerWriter<v1::SnapshotChunk>* writer) override;

  // Restore: a new instance from the image on this node, by silt-restorer
  // when the image allows it, else by CRIU. With `by_criu`, always by libcriu
  // with the options Silt's own CRIU path uses (empty network namespace,
  // loopback up, kdat cached): the `criu` tier, the benchmark's baseline.
  absl::StatusOr<std::unique_ptr<Instance>> RestoreInstance(
      Pool& pool, bool by_criu = false, bool as_template = false);

  // ---- working sets (snapshot/working_set.h) ----
  // Starts reading image `id`'s working set ahead, off this thread (the
  // reads overlap the sandbox's start), and the files of the function's
  // bundle the process maps (its code: small, read whole). With no working
  // set recorded yet, the whole pages file (what CRIU would read), and
  // returns false: this restore's first call records one.
  bool PrefetchWorkingSet(const Pool& pool, const snapshot::FastPlan& plan);

  // What instance `pid`, restored lazily from image `id`, touched in its
  // first call becomes the image's working set (once per image: REAP's
  // record-once; a new function version is a new image).
  void RecordWorkingSet(const std::string& id, pid_t pid);

  // A silt-restorer in a sandbox of `pool`'s function: namespaces, cgroup,
  // mounts, credentials and seccomp ready, the image mapped. `populate`: it
  // also fills the page tables (the first call then takes no page faults),
  // for restorers staged ahead while the resident budget has room for it.
  absl::StatusOr<std::unique_ptr<Instance>> SpawnRestorer(Pool& pool,
                                                          bool populate);

  // Hands a fresh restorer the plan and the pages file; it prepares
  // everything and waits for 'G'.
  absl::Status StageRestorer(Instance& inst, const snapshot::FastPlan& plan,
                             bool populate);

  // Replaces taken restorers at once, looks for new images every 100 ms, and
  // keeps the node within its resident budget (measured once a second).
  void TendLoop();

  void KickTender();

  // Keeps a ready restorer per function version that has an image here, as
  // the resident budget allows (the most recently started functions first).
  void TendRestorers();

  // Whether `need` more bytes of image held whole for `pool` (a populated
  // restorer or a template) fit in the half of the budget those may take,
  // after the ones of functions started less recently go (their restorers
  // come back only mapping the image; their templates in a minute, if
  // there is room then).
  bool MakeFullRoomLocked(const Pool& pool, uint64_t need,
                          std::vector<std::shared_ptr<Template>>* dropped);

  // Restore by silt-restorer: hand the ready restorer the plan and the pages
  // file; it maps the image and becomes the worker, which then reconnects.
  absl::StatusOr<std::unique_ptr<Instance>> FastRestore(Pool& pool,
                                                        bool as_template);

  absl::StatusOr<std::unique_ptr<Instance>> CriuRestoreInstance(
      Pool& pool, bool by_criu, bool as_template);

  // Turns a ready instance into `pool`'s fork template.
  absl::StatusOr<std::shared_ptr<Template>> MakeTemplate(
      Pool& pool, std::unique_ptr<Instance> inst);

  // Fork: a clone of the template, in its own cgroup.
  absl::StatusOr<std::unique_ptr<Instance>> ForkInstance(
      Pool& pool, std::shared_ptr<Template> t);

  // The host PID of `parent`'s child whose PID in the sandbox is `ns_pid`.
  static pid_t HostPidOfChild(pid_t parent, const std::string& ns_pid);

  // ---- what is held resident ahead of cold starts (resident_budget.h) ----

  // What a pool's restorer, template or staged instance holds (or would):
  // as last measured, else its image's (or checkpoint's) size.
  uint64_t HeldBytesLocked(const Pool& pool, ResidentKind kind);

  uint64_t ImageBytesLocked(const Pool& pool);

  // A staged restorer of `pool`, populated or only mapped: as last measured,
  // else its image's size or (only mapped) kMappedRestorerBytes.
  static constexpr uint64_t kMappedRestorerBytes = 2 << 20;
  uint64_t RestorerBytesLocked(const Pool& pool, bool populated);

  // Measures what the restorers, templates and staged instances hold (PSS:
  // they share their image's pages), off the lock; the tender does it once a
  // second.
  void MeasureResident();

  struct Resident {
    std::shared_ptr<Pool> pool;
    ResidentHolder holder;
  };
  std::vector<Resident> ResidentLocked();

  // Makes room for `need` more bytes for `pool` (null: brings the node back
  // under its budget) by letting go of the holders of functions started less
  // recently. Restorers and staged instances go to the reaper; templates end
  // in `dropped`, outside
  // the lock (clones keep theirs alive until they end). False: no room.
  bool MakeRoomLocked(const Pool* pool, uint64_t need,
                      std::vector<std::shared_ptr<Template>>* dropped);

  // What the images' holders hold here, by image id (for the reports).
  std::map<std::string, std::pair<uint64_t, bool>> ResidentByImageLocked();

  // Starts an instance for a call that found none idle: fork from the
  // template, else restore from the image (fetched from a peer if need be),
  // else boot (and take the snapshot). `force` picks one tier.
  absl::StatusOr<std::unique_ptr<Instance>> StartFresh(
      std::shared_ptr<Pool> pool, ColdStart force = ColdStart::kAny);

  // Boot; the first boot of a version without a snapshot takes it.
  absl::StatusOr<std::unique_ptr<Instance>> BootAndCheckpoint(
      std::shared_ptr<Pool> pool);

  // A template for `pool` from its image (restored anew: the instance that
  // serves calls stays separate). Waits for one another thread is starting.
  // NotFound: there is no image (any more).
  absl::Status EnsureTemplate(std::shared_ptr<Pool> pool);

  // Keeps templates for functions that have images and recent bursts of cold
  // starts (all recently started ones without silt-restorer),
  // within the memory budget (least recently used go first).
  void TendTemplates();

  // Drops images no assigned function version uses (updated or deleted
  // functions).
  void CollectImages(const std::set<std::string>& wanted_ids);

  std::shared_ptr<Pool> PoolFor(const FunctionSpec& spec,
                                std::shared_ptr<const Bundle> bundle);

  int MaxInstances(const FunctionSpec& spec);

  // Joins a running instance that takes more calls at once (the fullest
  // that has room: fewer instances stay busy), or takes an idle instance, or
  // starts one, or waits in the bounded queue. `headroom`: instances it may
  // start beyond the function's maximum (compute proclets, so that the jobs
  // of callers holding every instance still run).
  absl::StatusOr<Lease> Acquire(std::shared_ptr<Pool> pool_ptr,
                                Clock::time_point deadline,
                                call_wire::StartTier* tier, int headroom = 0);
  // A running instance of `pool` with room for one more call, or null.
  Instance* OpenLocked(Pool& pool);
  // The lease of an instance just taken for a call (counted in busy).
  Lease LeaseLocked(Pool& pool, std::unique_ptr<Instance> inst);

  // Gives a lease back: the instance serves on if `keep`; otherwise it is
  // discarded (one taking several calls once its last call ends). `count`,
  // when given, gets the pool's instances after that.
  void Release(Pool& pool, Lease lease, bool keep,
               control::InstanceCount* count = nullptr);

  std::chrono::milliseconds Timeout(const FunctionSpec& spec,
                                    uint64_t requested_ms);

  // Takes each part of a streamed reply (WorkerReply.more) as it arrives;
  // false when the caller is gone.
  using Parts = std::function<bool(v1::WorkerReply& part)>;

  // Sends `call` to an acquired instance (its timeout: what is left until
  // `deadline`) and reads the reply: the parts of a streamed one go to
  // `parts` as they come (without it, a streamed reply fails the call), and
  // *reply gets the last frame. On failure (the caller then releases the
  // instance as discarded) the line "silt: instance ID <role>WHY" goes to
  // the function's log, and *why says what happened: "timed out"
  // (DeadlineExceeded), the caller left mid-stream (Cancelled) or how the
  // instance died (it is killed; one taking several calls at once is not
  // killed for a timeout or a caller that left: its other calls run on).
  // While a reply streams, `watch` (the caller's connection, which carries
  // nothing else meanwhile) closing ends the call too. `body`: the rest of
  // the call's body, sent after `call` part by part as it arrives (a body
  // that breaks off ends the call as Cancelled).
  absl::Status CallInstance(Pool& pool, Instance& inst, v1::WorkerCall& call,
                            Clock::time_point deadline, const char* role,
                            v1::WorkerReply* reply, Death* why,
                            const Parts& parts = {}, int watch = -1,
                            RequestBody* body = nullptr);

  // ---- leases (invoker_leases.cc; lease_port.h) ----
  // Lends an idle instance of the version asked for that takes one call at
  // a time and needs nothing done after its calls (no working set to
  // record, not a container's); nullopt when there is none.
  std::optional<LeasePort::Lent> Lend(uint64_t conn,
                                      const call_wire::LeaseAsk& ask);
  // A lease given back (or, kCheck, checked); see call_wire::ReturnHow.
  call_wire::Returned TakeBack(uint64_t conn, const call_wire::Return& ret);
  // Lease connection `conn` closed: its instances are stopped (a call may
  // have been running in them).
  void LeasesClosed(uint64_t conn);
  // On the way out: recalls every lease and waits (up to `wait`) for them
  // to come back, so that the calls on them end first.
  void RecallLeases(std::chrono::milliseconds wait);
  // A call waits for an instance of `pool` while some are lent: recalls one
  // (not already recalled). Call with mu held (as `l`); lets it go while
  // it asks. Whether one was recalled.
  bool RecallOneLocked(Pool& pool, std::unique_lock<std::mutex>& l);

  // A call from the gateway (CallPort): runs it in an instance of the
  // function, taking an idle one or starting one. `body`: the rest of a
  // streamed request body. A streamed response goes out on `stream` as the
  // function writes it; *res then ends it.
  void Call(call_wire::Request& req, RequestBody* body, call_wire::Reply* res,
            ReplyStream& stream);

  // A compute proclet's share of a job (executor.h), in an instance of the
  // function: the task's reply. kRetry when nothing ran (the function is not
  // here, or it is at capacity).
  std::string RunTask(const TaskTarget& t, std::string_view task_call);

  // This node's CPU capacity: --cpus, else the machine's.
  uint32_t Cores() const;

  // What the executor's shares run as: the function's version here, and its
  // timeout.
  TaskTarget TargetOf(const std::string& ns, const std::string& function);

  void SetCluster(const control::ClusterView& v);

  grpc::Status Logs(grpc::ServerContext* ctx, const v1::LogsRequest* req,
                    grpc::ServerWriter<v1::LogEntry>* writer) override;

  // ---- desired state, reports, reaping ----
  void ApplyAssignment(const control::Assignment& a);

  void DeleteSnapshots(const control::DeleteSnapshots& d);

  // Starts instances until the pool has its minimum.
  void Fill(std::shared_ptr<Pool> pool);

  std::chrono::milliseconds IdleTimeout(const FunctionSpec& spec);

  void ReapLoop();

  LoadPulse::Sample PulseSample();

  uint64_t MemoryCapacity() const;

  control::InstanceCount CountLocked(const Pool& pool);

  control::LoadReport Report(uint64_t seq);

  // Keeps a Connect stream to the gateway: register, report, apply assignments;
  // reconnects with backoff when the gateway goes away.
  void ConnectLoop();
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_INVOKER_IMPL_H_
