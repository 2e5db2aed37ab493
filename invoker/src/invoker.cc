#include "invoker/invoker.h"

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

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
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
#include "call_port.h"
#include "channel.h"
#include "cluster_view.h"
#include "executor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gpu/devices.h"
#include "hosted_shard.h"
#include "invoker/call_wire.h"
#include "invoker/proto/invoker.grpc.pb.h"
#include "invoker/proto/proclets.grpc.pb.h"
#include "load_pulse.h"
#include "logs.h"
#include "node_cgroup.h"
#include "proclet_host.h"
#include "proclets/bundle.h"
#include "resident_budget.h"
#include "sandbox.h"
#include "seccomp_log.h"
#include "snapshot/criu.h"
#include "snapshot/fast_restore.h"
#include "snapshot/image.h"
#include "snapshot/working_set.h"

namespace silt::invoker {
namespace {

using Clock = std::chrono::steady_clock;
using call_wire::ColdStart;
using v1::FunctionSpec;

// Cold starts of one function this close together make a burst; a function
// keeps earning fork templates for this long after its last one.
constexpr auto kBurstGap = std::chrono::seconds(2);
constexpr auto kTemplateAfterBurst = std::chrono::minutes(10);

std::string RandomId(size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(kAlphabet[rng() % 36]);
  return s;
}

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

// Go durations ("1m30s", "500ms", "10s") or plain seconds ("30").
std::optional<std::chrono::milliseconds> ParseDuration(absl::string_view s) {
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

std::string Key(const std::string& ns, const std::string& name) {
  return ns + "/" + name;
}

// ---- instances ----

struct Bundle {
  std::string dir;
  proclets::BundleManifest manifest;
};

struct Template;

struct Instance {
  std::string id;
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
  // with no working set recorded yet: its first call records one.
  std::string record_working_set;
  ~Instance() {
    if (channel >= 0) close(channel);
    if (listener >= 0) close(listener);
    if (proc) proc->Kill();
    proc.reset();
    if (tmp_mounted) umount2((base_dir + "/tmp").c_str(), MNT_DETACH);
    std::error_code ec;
    if (!base_dir.empty()) std::filesystem::remove_all(base_dir, ec);
  }
};

// A paused instance of one function version that forks clones.
struct Template {
  std::string snapshot_id;
  std::unique_ptr<Instance> inst;
  std::mutex fork_mu;  // one fork at a time on its channel
  Clock::time_point last_used;
};

std::string SnapshotIdOf(const FunctionSpec& spec) {
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

bool SnapshotsWanted(const FunctionSpec& spec) {
  auto it = spec.labels().find("com.silt.snapshot");
  return it == spec.labels().end() ||
         !(it->second == "false" || it->second == "0" || it->second == "off");
}

// A listening socket at DIR/s (the worker's /var/silt/run/s), for `host_id`
// alone.
absl::StatusOr<int> ListenIn(const std::string& dir, uint32_t host_id) {
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

}  // namespace

// ProcletHost over gRPC: the gateway's control of the shards held here.
class ProcletService final : public pv1::ProcletHost::Service {
 public:
  explicit ProcletService(ProcletHost* host) : host_(host) {}

  grpc::Status CreateShard(grpc::ServerContext*,
                           const pv1::CreateShardRequest* req,
                           pv1::CreateShardResponse*) override {
    return ToGrpc(host_->CreateShard(req->shard()));
  }
  grpc::Status DropShards(grpc::ServerContext*,
                          const pv1::DropShardsRequest* req,
                          pv1::DropShardsResponse*) override {
    host_->DropShards({req->ids().begin(), req->ids().end()});
    return grpc::Status::OK;
  }
  grpc::Status MigrateShard(grpc::ServerContext*,
                            const pv1::MigrateShardRequest* req,
                            pv1::MigrateShardResponse* res) override {
    auto deadline = std::chrono::system_clock::time_point::max();
    if (req->deadline_unix_ms() > 0)
      deadline = std::chrono::system_clock::time_point(
          std::chrono::milliseconds(req->deadline_unix_ms()));
    auto r = host_->Migrate(req->id(), req->target_data_address(), deadline);
    if (!r.ok()) return ToGrpc(r.status());
    *res = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status SplitShard(grpc::ServerContext*,
                          const pv1::SplitShardRequest* req,
                          pv1::SplitShardResponse* res) override {
    auto r = host_->Split(req->id(), req->new_id());
    if (!r.ok()) return ToGrpc(r.status());
    *res = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status MergeShards(grpc::ServerContext*,
                           const pv1::MergeShardsRequest* req,
                           pv1::MergeShardsResponse* res) override {
    auto r = host_->Merge(req->keep(), req->absorb());
    if (!r.ok()) return ToGrpc(r.status());
    *res->mutable_merged() = *std::move(r);
    return grpc::Status::OK;
  }

 private:
  ProcletHost* host_;
};

struct Invoker::Impl final : public v1::Invoker::Service {
  Options options;
  std::string node_name;
  std::string cgroup_id;  // names this invoker's cgroups: silt/<id>/<instance>
  // silt/<id>: the node's capacity, the parent of every instance's cgroup.
  // Outlives the instances (members go in reverse order).
  std::unique_ptr<NodeCgroup> node_cgroup;
  std::string worker_dir;  // DATA_DIR/bin: a private copy of silt-worker, bound
                           // into sandboxes
  uint32_t gpus = 0;  // GPUs found at start (reported; GPU proclets come later)
  std::string address;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> gateway_channel;
  std::unique_ptr<v1::Control::Stub> control;
  LogBook logs;
  std::unique_ptr<LogCollector> collector;
  // Memory proclets held here and the instances' state connections.
  std::unique_ptr<ProcletHost> proclet_host;
  std::unique_ptr<CallPort> call_port;  // after proclet_host: its key
  std::unique_ptr<ProcletService> proclet_service;
  std::atomic<uint64_t> instance_seq{0};
  // Compute jobs of the instances here, and the cluster they run on.
  ClusterView cluster;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<SeccompLog> seccomp_log;  // null without /dev/kmsg

  // One pool per function version.
  struct Pool {
    FunctionSpec spec;
    std::shared_ptr<Bundle> bundle;
    std::vector<std::unique_ptr<Instance>> idle;
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
  };
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Pool>> pools;  // key ns/name
  std::map<std::string, std::shared_ptr<Bundle>> bundles;
  std::map<std::string, std::shared_ptr<std::mutex>> bundle_locks;
  // Snapshot images complete on this node, by id.
  std::map<std::string, snapshot::Manifest> images;
  std::map<std::string, std::shared_ptr<std::mutex>> image_locks;
  std::string snapshot_dir;  // DATA_DIR/snapshots
  // DATA_DIR/working-sets/<image id>: what lazy restores of it touched
  // (snapshot/working_set.h); loaded at first need (null: none recorded).
  std::string working_set_dir;
  std::map<std::string, std::shared_ptr<const std::vector<snapshot::FileRange>>>
      working_sets;
  std::string dev_dir;        // DATA_DIR/dev: device nodes bound as /dev
  std::string root_skeleton;  // DATA_DIR/root: every sandbox's mount points
  bool bind_dev_tmp = false;
  bool snapshots_on = false;     // options.snapshots and CRIU 4.1+ present
  bool fast_restore_on = false;  // silt-restorer is installed
  // Restore plans by image id; images the restorer cannot take (CRIU
  // restores those).
  std::map<std::string, std::shared_ptr<const snapshot::FastPlan>> plans;
  std::set<std::string> no_fast;
  // Instances done with, for the reaper to tear down off the call path.
  std::vector<std::unique_ptr<Instance>> graveyard;
  int criu_version = 0;
  bool have_assignment = false;
  // Compute proclets running here: their instances' channels (shut down
  // when the invoker stops, so their waits end).
  std::set<int> task_channels;
  uint32_t tasks_running = 0;
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
  std::atomic<grpc::ClientContext*> connect_ctx{nullptr};
  grpc::ClientContext* drain_ctx = nullptr;  // under stop_mu: a Drain() call

  ~Impl() override {
    {
      std::lock_guard<std::mutex> l(stop_mu);
      stopping = true;
    }
    stop_cv.notify_all();
    if (auto* c = connect_ctx.load()) c->TryCancel();
    // A move in progress would hold the server's shutdown until it ends.
    if (proclet_host) proclet_host->StopMoves();
    if (server)
      server->Shutdown(std::chrono::system_clock::now() +
                       std::chrono::seconds(2));
    if (connector.joinable()) connector.join();
    // Calls in flight end first (they use everything below).
    if (call_port) call_port->Stop();
    if (reaper.joinable()) reaper.join();
    if (tender.joinable()) tender.join();
    {
      std::lock_guard<std::mutex> l(mu);
      for (int fd : task_channels) shutdown(fd, SHUT_RDWR);
    }
    // The data port's peer threads run tasks and jobs here (RunTask: the
    // pools, mu, seccomp_log, the proclet host itself; the executor), so they
    // are joined while all of those still exist.
    if (proclet_host) proclet_host->StopPeers();
    executor.reset();
    proclet_host.reset();
    std::lock_guard<std::mutex> l(mu);
    pools.clear();
  }

  bool Stopping() {
    std::lock_guard<std::mutex> l(stop_mu);
    return stopping;
  }

  // ---- bundles ----

  absl::StatusOr<std::shared_ptr<Bundle>> EnsureBundle(
      const std::string& digest) {
    std::shared_ptr<std::mutex> lock;
    {
      std::lock_guard<std::mutex> l(mu);
      if (auto it = bundles.find(digest); it != bundles.end())
        return it->second;
      auto& m = bundle_locks[digest];
      if (!m) m = std::make_shared<std::mutex>();
      lock = m;
    }
    std::lock_guard<std::mutex> fetch_lock(*lock);
    {
      std::lock_guard<std::mutex> l(mu);
      if (auto it = bundles.find(digest); it != bundles.end())
        return it->second;
    }
    std::string hex = digest.substr(7);
    std::string dir = options.data_dir + "/bundles/" + hex;
    std::string tar;
    if (!std::filesystem::exists(dir + "/manifest.json")) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::minutes(2));
      v1::FetchBundleRequest req;
      req.set_digest(digest);
      auto reader = control->FetchBundle(&ctx, req);
      v1::BundleChunk chunk;
      while (reader->Read(&chunk)) tar += chunk.data();
      grpc::Status st = reader->Finish();
      if (!st.ok()) {
        return absl::UnavailableError(
            absl::StrCat("cannot fetch bundle ", digest,
                         " from the gateway: ", st.error_message()));
      }
      if (proclets::Sha256Digest(tar) != digest)
        return absl::DataLossError(
            absl::StrCat("bundle ", digest, " arrived corrupted"));
      std::string tmp = dir + ".tmp-" + RandomId(6);
      std::filesystem::create_directories(tmp);
      if (auto s = proclets::UnpackBundle(tar, tmp); !s.ok()) {
        std::filesystem::remove_all(tmp);
        return s;
      }
      std::error_code ec;
      std::filesystem::rename(tmp, dir, ec);
      if (ec) std::filesystem::remove_all(tmp);  // another process won the race
    }
    std::ifstream in(dir + "/manifest.json");
    std::stringstream ss;
    ss << in.rdbuf();
    auto manifest = proclets::ParseManifest(ss.str());
    if (!manifest.ok()) return manifest.status();
    auto b = std::make_shared<Bundle>(Bundle{dir, *manifest});
    std::lock_guard<std::mutex> l(mu);
    bundles[digest] = b;
    return b;
  }

  // ---- instances ----

  // Creates DATA_DIR/instances/<id> with secrets/ (the function's secrets),
  // run/ and work/.
  std::unique_ptr<Instance> NewInstance(const FunctionSpec& spec) {
    auto inst = std::make_unique<Instance>();
    inst->id = absl::StrCat(spec.name(), "-", RandomId(8));
    inst->base_dir = options.data_dir + "/instances/" + inst->id;
    std::error_code ec;
    for (const char* d : {"/secrets", "/run", "/work"})
      std::filesystem::create_directories(inst->base_dir + d, ec);
    // Only the function's own host id reads its secrets and uses its run dir.
    inst->host_id = HostIdOf(spec.namespace_(), spec.name());
    auto own = [&](const std::string& path, mode_t mode) {
      chmod(path.c_str(), mode);
      (void)!chown(path.c_str(), inst->host_id, inst->host_id);
    };
    chmod(inst->base_dir.c_str(), 0755);
    for (const auto& [name, value] : spec.secrets()) {
      if (name.find('/') != std::string::npos || name == ".." || name == ".")
        continue;
      std::string path = inst->base_dir + "/secrets/" + name;
      {
        std::ofstream out(path, std::ios::binary);
        out << value;
      }
      own(path, 0400);
    }
    own(inst->base_dir + "/secrets", 0500);
    own(inst->base_dir + "/run", 0700);
    return inst;
  }

  // Log pipes for an instance: returns the write ends; the read ends go to
  // the collector.
  absl::Status LogPipes(const FunctionSpec& spec, const std::string& id,
                        int* out_w, int* err_w) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      return absl::InternalError("pipe failed");
    }
    std::string fn_key = Key(spec.namespace_(), spec.name());
    collector->Add(out[0], fn_key, id);
    collector->Add(err[0], fn_key, id);
    *out_w = out[1];
    *err_w = err[1];
    return absl::OkStatus();
  }

  // An instance's state connection: the proclet host serves one end; the
  // other (returned) goes to the worker.
  absl::StatusOr<int> StateSocket(const FunctionSpec& spec) {
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0)
      return absl::InternalError("socketpair failed");
    proclet_host->Attach(sp[0], spec.namespace_(), spec.name());
    return sp[1];
  }

  // The sandbox of an instance of `spec` (argv, env and fds are the
  // caller's).
  absl::Status SandboxFor(const FunctionSpec& spec, const Bundle& bundle,
                          Instance& inst, bool snapshot_ready,
                          SandboxSpec* sb) {
    sb->root_dir = root_skeleton;  // shared: every mount on it is private
    sb->host_id = inst.host_id;
    sb->bundle_dir = bundle.dir;
    sb->secrets_dir = inst.base_dir + "/secrets";
    sb->worker_dir = worker_dir;
    sb->snapshot_ready = snapshot_ready;
    sb->run_dir = inst.base_dir + "/run";
    if (!bind_dev_tmp)
      return absl::FailedPreconditionError(absl::StrCat(
          "no device nodes for sandboxes in ", dev_dir, " (see the log)"));
    if (auto s = MountTmp(inst.base_dir + "/tmp", sb->tmp_bytes); !s.ok())
      return s;
    inst.tmp_mounted = true;
    sb->dev_dir = dev_dir;
    sb->tmp_dir = inst.base_dir + "/tmp";
    sb->hostname = spec.name();
    sb->cgroup = absl::StrCat("silt/", cgroup_id, "/", inst.id);
    sb->memory_limit_bytes = MemoryLimit(spec);
    sb->cpu_millis = CpuMillis(spec);
    return absl::OkStatus();
  }

  // An instance's own limits, at most the node's (its parent cgroup's): v1
  // refuses a child CPU quota above its parent's, and a larger memory limit
  // would only pretend. 0: none of its own (the node's still applies).
  uint64_t MemoryLimit(const FunctionSpec& spec) const {
    uint64_t own = spec.memory_limit_bytes(), node = options.memory_bytes;
    return own > 0 && node > 0 ? std::min(own, node) : own;
  }
  uint64_t CpuMillis(const FunctionSpec& spec) const {
    uint64_t own = spec.cpu_millis(), node = uint64_t{options.cpus} * 1000;
    return own > 0 && node > 0 ? std::min(own, node) : own;
  }

  // Boot: a new sandbox, silt-worker, the function's init.
  absl::StatusOr<std::unique_ptr<Instance>> StartInstance(
      const FunctionSpec& spec, const Bundle& bundle,
      bool snapshot_ready = false) {
    auto start = Clock::now();
    auto inst = NewInstance(spec);
    inst->tier = call_wire::StartTier::kBoot;
    int chan[2], out_w, err_w;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) != 0)
      return absl::InternalError("socketpair failed");
    if (auto s = LogPipes(spec, inst->id, &out_w, &err_w); !s.ok()) {
      close(chan[0]);
      close(chan[1]);
      return s;
    }

    SandboxSpec sb;
    if (auto s = SandboxFor(spec, bundle, *inst, snapshot_ready, &sb);
        !s.ok()) {
      close(chan[0]);
      close(chan[1]);
      close(out_w);
      close(err_w);
      return s;
    }
    sb.argv = {kSandboxWorkerPath};
    sb.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8",
              absl::StrCat("HOSTNAME=", spec.name())};
    for (const auto& [k, v] : spec.env())
      sb.env.push_back(absl::StrCat(k, "=", v));
    if (!spec.env_process().empty() && !spec.env().contains("fprocess"))
      sb.env.push_back("fprocess=" + spec.env_process());
    sb.channel_fd = chan[1];
    sb.stdout_fd = out_w;
    sb.stderr_fd = err_w;
    auto proc = Spawn(sb);
    close(chan[1]);
    close(out_w);
    close(err_w);
    inst->channel = chan[0];
    if (!proc.ok()) return proc.status();
    inst->proc = *std::move(proc);

    auto state = StateSocket(spec);
    if (!state.ok()) return state.status();
    absl::Status sent = SendFds(inst->channel, &*state, 1);
    close(*state);
    if (!sent.ok())
      return absl::UnavailableError(
          absl::StrCat("instance ", inst->id, " died at start"));
    v1::WorkerConfig cfg;
    *cfg.mutable_spec() = spec;
    cfg.mutable_spec()->clear_secrets();
    cfg.set_instance_id(inst->id);
    cfg.set_bundle_dir(kSandboxBundleDir);
    cfg.set_kind(bundle.manifest.kind);
    cfg.set_entry(bundle.manifest.kind == "exec" && !spec.env_process().empty()
                      ? spec.env_process()
                      : bundle.manifest.entry);
    cfg.set_mode(bundle.manifest.mode);
    cfg.set_upstream_url(bundle.manifest.upstream_url);
    if (auto s = WriteFrame(inst->channel, cfg); !s.ok())
      return absl::UnavailableError(
          absl::StrCat("instance ", inst->id, " died at start"));
    v1::WorkerReady ready;
    if (auto s = ReadFrame(inst->channel, &ready, std::chrono::seconds(60));
        !s.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "instance ", inst->id, " did not start: ", DeathReason(*inst).text));
    }
    if (!ready.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "function ", spec.name(), " failed to start: ", ready.error()));
    }
    inst->start_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    inst->last_used = Clock::now();
    return inst;
  }

  // Why an instance's channel broke: OOM kill, seccomp violation, crash.
  // How an instance died (it is killed first if it has not).
  struct Death {
    call_wire::Failure kind = call_wire::Failure::kCrash;
    std::string text;  // "killed: out of memory (memory limit reached)", ...
  };
  Death DeathReason(Instance& inst) {
    using call_wire::Failure;
    int st = inst.proc->Kill();
    if (inst.proc->cgroup().OomKilled())
      return {Failure::kOom, "killed: out of memory (memory limit reached)"};
    if (WIFSIGNALED(st)) {
      int sig = WTERMSIG(st);
      if (sig == SIGSYS)
        return {Failure::kSeccomp, "killed: forbidden system call (seccomp)"};
      // A clone's parent is inside its sandbox: the kernel's log says
      // whether seccomp killed it.
      if (sig == SIGKILL && seccomp_log && inst.proc->pid() > 0)
        if (auto nr = seccomp_log->KilledBy(inst.proc->pid(),
                                            absl::Milliseconds(200)))
          return {Failure::kSeccomp,
                  absl::StrCat("killed: forbidden system call ", *nr,
                               " (seccomp)")};
      if (sig == SIGKILL) return {Failure::kCrash, "killed (SIGKILL)"};
      return {Failure::kCrash, absl::StrCat("crashed with signal ", sig, " (",
                                            strsignal(sig), ")")};
    }
    if (WIFEXITED(st))
      return {Failure::kCrash,
              absl::StrCat("exited with status ", WEXITSTATUS(st))};
    return {Failure::kCrash, "ended"};
  }

  // ---- snapshots ----

  std::shared_ptr<std::mutex> ImageLock(const std::string& id) {
    std::lock_guard<std::mutex> l(mu);
    auto& m = image_locks[id];
    if (!m) m = std::make_shared<std::mutex>();
    return m;
  }

  std::string ImageDir(const std::string& id) {
    return snapshot_dir + "/" + id;
  }

  std::vector<snapshot::ExternalMount> Mounts(const Instance& inst,
                                              const Bundle& bundle) {
    std::vector<snapshot::ExternalMount> m = {
        {kSandboxBundleDir, "bundle", bundle.dir},
        {kSandboxSecretsDir, "secrets", inst.base_dir + "/secrets"},
        {kSandboxWorkerDir, "bin", worker_dir},
        {kSandboxRunDir, "run", inst.base_dir + "/run"}};
    if (bind_dev_tmp) {
      m.push_back({"/dev", "dev", dev_dir});
      m.push_back({"/tmp", "tmp", inst.base_dir + "/tmp"});
    }
    return m;
  }

  void DropImage(const std::string& id, const std::string& why) {
    std::vector<std::shared_ptr<Template>> templates;
    {
      std::lock_guard<std::mutex> l(mu);
      images.erase(id);
      // Staged restorers and templates map this image's pages: they go too
      // (clones keep their template until they end), and the next cold
      // start boots and snapshots again.
      plans.erase(id);
      no_fast.erase(id);
      working_sets.erase(id);
      unlink(WorkingSetPath(id).c_str());
      for (auto& [key, pool] : pools) {
        if (pool->snapshot_id != id) continue;
        if (pool->restorer) graveyard.push_back(std::move(pool->restorer));
        if (pool->tmpl) {
          templates.push_back(std::move(pool->tmpl));
          pool->template_retry_after = Clock::now() + std::chrono::seconds(5);
        }
      }
    }
    templates.clear();
    std::string dir = ImageDir(id);
    std::string trash = absl::StrCat(snapshot_dir, "/.trash-", RandomId(8));
    std::error_code ec;
    if (std::filesystem::exists(dir, ec)) {
      std::filesystem::rename(dir, trash, ec);
      std::filesystem::remove_all(ec ? dir : trash, ec);
    }
    if (!why.empty())
      fprintf(stderr, "silt-invoker: dropped snapshot %s: %s\n", id.c_str(),
              why.c_str());
  }

  // Wakes a parked worker (SIGUSR1; it connects to run/s), hands it its log
  // fds and identity, and waits for it to be ready. A future template keeps
  // the image's identity: its clones reseed and run the after-restore hook.
  absl::Status WakeAndResume(const FunctionSpec& spec, Instance& inst,
                             pid_t pid, int listener,
                             bool as_template = false) {
    kill(pid, SIGUSR1);
    pollfd p{listener, POLLIN, 0};
    int r = 0;
    for (int waited = 0; r != 1 && waited < 10000; waited += 20) {
      r = poll(&p, 1, 20);
      if (r < 0 && errno != EINTR) break;
      if (r != 1 && !Alive(pid)) break;
    }
    if (r != 1)
      return absl::UnavailableError(absl::StrCat(
          "instance ", inst.id, " did not reconnect after restore (",
          Alive(pid) ? "timed out" : "it died", ")"));
    int chan = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (chan < 0) return absl::InternalError("accept failed");
    if (inst.channel >= 0) close(inst.channel);
    inst.channel = chan;
    int out_w, err_w;
    if (auto s = LogPipes(spec, inst.id, &out_w, &err_w); !s.ok()) return s;
    auto state = StateSocket(spec);
    if (!state.ok()) {
      close(out_w);
      close(err_w);
      return state.status();
    }
    int fds[3] = {out_w, err_w, *state};
    absl::Status s = SendFds(chan, fds, 3);
    close(out_w);
    close(err_w);
    close(*state);
    if (!s.ok()) return s;
    v1::WorkerCall resume;
    resume.set_op("resume");
    resume.set_instance_id(inst.id);
    resume.set_seed(Seed());
    resume.set_as_template(as_template);
    if (auto w = WriteFrame(chan, resume); !w.ok()) return w;
    v1::WorkerReady ready;
    if (auto rd = ReadFrame(chan, &ready, std::chrono::seconds(30)); !rd.ok())
      return absl::UnavailableError(absl::StrCat(
          "instance ", inst.id, " did not resume: ", rd.message()));
    if (!ready.ok())
      return absl::FailedPreconditionError(
          absl::StrCat("instance ", inst.id, " failed to resume"));
    return absl::OkStatus();
  }

  // Not a zombie, not gone.
  static bool Alive(pid_t pid) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat;
    std::getline(in, stat);
    size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() &&
           stat[paren + 2] != 'Z' && stat[paren + 2] != 'X';
  }

  uint64_t Seed() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    return rng();
  }

  // Parks a freshly booted instance, checkpoints it (it keeps running) into
  // DATA_DIR/snapshots/<id>, and resumes it.
  absl::Status Checkpoint(Pool& pool, Instance& inst) {
    auto start = Clock::now();
    v1::WorkerCall park;
    park.set_op("park");
    v1::WorkerReply ok;
    if (auto s = WriteFrame(inst.channel, park); !s.ok()) return s;
    if (auto s = ReadFrame(inst.channel, &ok, std::chrono::seconds(10));
        !s.ok())
      return s;
    // It closes the channel once its stdio points at /dev/null: then nothing
    // of ours is open in it.
    v1::WorkerReply none;
    auto closed = ReadFrame(inst.channel, &none, std::chrono::seconds(10));
    if (!absl::IsUnavailable(closed))
      return absl::InternalError("the worker did not park");
    close(inst.channel);
    inst.channel = -1;

    const std::string& id = pool.snapshot_id;
    std::string tmp =
        absl::StrCat(snapshot_dir, "/.tmp-", id, "-", RandomId(6));
    std::error_code ec;
    std::filesystem::create_directories(tmp, ec);
    auto listener = ListenIn(inst.base_dir + "/run", inst.host_id);
    if (!listener.ok()) return listener.status();
    snapshot::DumpOptions d;
    d.pid = inst.proc->pid();
    d.images_dir = tmp;
    d.mounts = Mounts(inst, *pool.bundle);
    d.leave_running = true;
    absl::Status dumped = snapshot::Dump(d);
    double dump_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (dumped.ok()) {
      snapshot::Manifest m;
      m.id = id;
      m.function = pool.spec.name();
      m.ns = pool.spec.namespace_();
      m.generation = pool.spec.generation();
      m.bundle_digest = pool.spec.bundle_digest();
      m.kind = pool.bundle->manifest.kind;
      m.kernel = snapshot::KernelRelease();
      m.criu_version = criu_version;
      m.created_unix = WallNanos() / 1000000000;
      m.checkpoint_ms = dump_ms;
      unlink((tmp + "/dump.log").c_str());
      dumped = snapshot::Seal(tmp, ImageDir(id), &m);
      if (dumped.ok()) {
        std::lock_guard<std::mutex> l(mu);
        images[id] = m;
      }
    }
    if (!dumped.ok()) std::filesystem::remove_all(tmp, ec);
    // Running on either way.
    absl::Status resumed =
        WakeAndResume(pool.spec, inst, inst.proc->pid(), *listener);
    close(*listener);
    if (!resumed.ok()) return resumed;
    return dumped;
  }

  // The image of `pool`'s version on this node, fetched from a peer if
  // another node has it. NotFound when nobody has one.
  absl::StatusOr<std::string> EnsureImage(Pool& pool) {
    const std::string& id = pool.snapshot_id;
    {
      std::lock_guard<std::mutex> l(mu);
      if (images.contains(id)) return ImageDir(id);
    }
    auto lock = ImageLock(id);
    std::lock_guard<std::mutex> fetch_lock(*lock);
    {
      std::lock_guard<std::mutex> l(mu);
      if (images.contains(id)) return ImageDir(id);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    v1::FindSnapshotRequest req;
    req.set_id(id);
    v1::FindSnapshotResponse peers;
    grpc::Status st = control->FindSnapshot(&ctx, req, &peers);
    if (!st.ok())
      return absl::UnavailableError(
          absl::StrCat("cannot ask the gateway for snapshot ", id, ": ",
                       st.error_message()));
    absl::Status last =
        absl::NotFoundError(absl::StrCat("no node holds snapshot ", id));
    for (const auto& addr : peers.addresses()) {
      if (addr == address) continue;
      last = FetchImage(addr, id);
      if (last.ok()) return ImageDir(id);
      fprintf(stderr, "silt-invoker: fetching snapshot %s from %s: %s\n",
              id.c_str(), addr.c_str(), std::string(last.message()).c_str());
    }
    return last;
  }

  absl::Status FetchImage(const std::string& peer, const std::string& id) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    auto channel = grpc::CreateCustomChannel(
        peer, grpc::InsecureChannelCredentials(), args);
    auto stub = v1::Invoker::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::minutes(2));
    v1::FetchSnapshotRequest req;
    req.set_id(id);
    auto reader = stub->FetchSnapshot(&ctx, req);
    std::string tmp =
        absl::StrCat(snapshot_dir, "/.tmp-", id, "-", RandomId(6));
    std::error_code ec;
    std::filesystem::create_directories(tmp, ec);
    v1::SnapshotChunk chunk;
    int fd = -1;
    std::string current;
    bool have_manifest = false;
    absl::Status status = absl::OkStatus();
    while (reader->Read(&chunk)) {
      if (!chunk.manifest().empty()) {
        std::ofstream(tmp + "/" + snapshot::kManifestName, std::ios::binary)
            << chunk.manifest();
        have_manifest = true;
        continue;
      }
      const std::string& name = chunk.file();
      if (name.empty() || name.find('/') != std::string::npos ||
          name == snapshot::kManifestName || name[0] == '.') {
        status = absl::DataLossError("peer sent a bad file name");
        break;
      }
      if (name != current) {
        if (fd >= 0) close(fd);
        fd = open((tmp + "/" + name).c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        current = name;
        if (fd < 0) {
          status = absl::InternalError("cannot write a fetched image file");
          break;
        }
      }
      const std::string& data = chunk.data();
      size_t off = 0;
      while (off < data.size()) {
        ssize_t n = write(fd, data.data() + off, data.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
    }
    if (fd >= 0) close(fd);
    if (!status.ok()) ctx.TryCancel();
    grpc::Status st = reader->Finish();
    if (status.ok() && !st.ok())
      status = absl::UnavailableError(st.error_message());
    if (status.ok() && !have_manifest)
      status = absl::DataLossError("peer sent no manifest");
    absl::StatusOr<snapshot::Manifest> m =
        status.ok() ? snapshot::Verify(tmp, /*full=*/true)
                    : absl::StatusOr<snapshot::Manifest>(status);
    if (m.ok() && m->id != id)
      m = absl::DataLossError("peer sent another snapshot");
    if (m.ok()) {
      // Exactly the manifest's files.
      for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
        std::string n = e.path().filename().string();
        bool listed = n == snapshot::kManifestName;
        for (const auto& f : m->files) listed = listed || f.name == n;
        if (!listed) std::filesystem::remove_all(e.path(), ec);
      }
      if (rename(tmp.c_str(), ImageDir(id).c_str()) != 0)
        m = absl::InternalError("cannot move the fetched snapshot in place");
    }
    if (!m.ok()) {
      std::filesystem::remove_all(tmp, ec);
      return m.status();
    }
    std::lock_guard<std::mutex> l(mu);
    images[id] = *m;
    return absl::OkStatus();
  }

  grpc::Status FetchSnapshot(
      grpc::ServerContext* ctx, const v1::FetchSnapshotRequest* req,
      grpc::ServerWriter<v1::SnapshotChunk>* writer) override {
    {
      std::lock_guard<std::mutex> l(mu);
      if (!images.contains(req->id()))
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            "no such snapshot here");
    }
    std::string dir = ImageDir(req->id());
    auto m = snapshot::Verify(dir);
    if (!m.ok()) {
      DropImage(req->id(), std::string(m.status().message()));
      return ToGrpc(m.status());
    }
    std::ifstream in(dir + "/" + snapshot::kManifestName, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    v1::SnapshotChunk c;
    c.set_manifest(ss.str());
    if (!writer->Write(c)) return grpc::Status::CANCELLED;
    std::vector<char> buf(1 << 20);
    for (const auto& f : m->files) {
      int fd = open((dir + "/" + f.name).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        return grpc::Status(grpc::StatusCode::DATA_LOSS, "image file vanished");
      bool sent_any = false;
      ssize_t n;
      while ((n = read(fd, buf.data(), buf.size())) > 0 || !sent_any) {
        v1::SnapshotChunk d;
        d.set_file(f.name);
        if (n > 0) d.set_data(buf.data(), static_cast<size_t>(n));
        sent_any = true;
        if (ctx->IsCancelled() || !writer->Write(d)) {
          close(fd);
          return grpc::Status::CANCELLED;
        }
        if (n <= 0) break;
      }
      close(fd);
    }
    return grpc::Status::OK;
  }

  // Restore: a new instance from the image on this node, by silt-restorer
  // when the image allows it, else by CRIU. With `by_criu`, always by libcriu
  // with the options Silt's own CRIU path uses (empty network namespace,
  // loopback up, kdat cached): the `criu` tier, the benchmark's baseline.
  absl::StatusOr<std::unique_ptr<Instance>> RestoreInstance(
      Pool& pool, bool by_criu = false, bool as_template = false) {
    // Checked before every restore (checksums once per file version): a
    // damaged image is dropped, never restored.
    const std::string& id = pool.snapshot_id;
    if (auto m = snapshot::Verify(ImageDir(id)); !m.ok()) {
      logs.Append(Key(pool.spec.namespace_(), pool.spec.name()), "invoker",
                  absl::StrCat("silt: not restoring: ", m.status().message()));
      DropImage(id, std::string(m.status().message()));
      return m.status();
    }
    if (!by_criu && fast_restore_on) {
      auto inst = FastRestore(pool, as_template);
      if (inst.ok()) return inst;
      // Unimplemented: an image the restorer does not take (not a failure).
      if (!absl::IsUnimplemented(inst.status())) {
        fprintf(stderr,
                "silt-invoker: fast restore of %s failed (%s); restoring "
                "with CRIU\n",
                id.c_str(), std::string(inst.status().message()).c_str());
        logs.Append(
            Key(pool.spec.namespace_(), pool.spec.name()), "invoker",
            absl::StrCat("silt: fast restore failed (", inst.status().message(),
                         "); restoring with CRIU"));
      }
    }
    return CriuRestoreInstance(pool, by_criu, as_template);
  }

  // The restore plan of image `id`, digested once.
  absl::StatusOr<std::shared_ptr<const snapshot::FastPlan>> PlanFor(
      const std::string& id) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (no_fast.contains(id))
        return absl::UnimplementedError(
            "not restorable without CRIU (seen before)");
      if (auto it = plans.find(id); it != plans.end()) return it->second;
    }
    auto plan = snapshot::BuildRestorePlan(ImageDir(id));
    std::lock_guard<std::mutex> l(mu);
    if (!plan.ok()) {
      no_fast.insert(id);
      return plan.status();
    }
    auto p = std::make_shared<const snapshot::FastPlan>(*std::move(plan));
    plans[id] = p;
    return p;
  }

  // ---- working sets (snapshot/working_set.h) ----

  std::string WorkingSetPath(const std::string& id) {
    return working_set_dir + "/" + id;
  }

  std::shared_ptr<const std::vector<snapshot::FileRange>> WorkingSetOf(
      const std::string& id) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (auto it = working_sets.find(id); it != working_sets.end())
        return it->second;
    }
    auto ws = snapshot::LoadWorkingSet(WorkingSetPath(id));
    std::shared_ptr<const std::vector<snapshot::FileRange>> p;
    if (ws.ok()) p = std::make_shared<std::vector<snapshot::FileRange>>(*ws);
    std::lock_guard<std::mutex> l(mu);
    return working_sets.try_emplace(id, p).first->second;
  }

  // Starts reading image `id`'s working set ahead, off this thread (the
  // reads overlap the sandbox's start), and the files of the function's
  // bundle the process maps (its code: small, read whole). With no working
  // set recorded yet, the whole pages file (what CRIU would read), and
  // returns false: this restore's first call records one.
  bool PrefetchWorkingSet(const Pool& pool, const snapshot::FastPlan& plan) {
    auto ws = WorkingSetOf(pool.snapshot_id);
    struct Read {
      int fd;
      std::vector<snapshot::FileRange> ranges;
    };
    std::vector<Read> reads;
    auto add = [&reads](const std::string& path,
                        std::vector<snapshot::FileRange> want) {
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return;
      struct stat st;
      if (want.empty() && fstat(fd, &st) == 0 && st.st_size > 0)
        want.push_back({0, static_cast<uint64_t>(st.st_size)});
      // In the page cache already (started lately): nothing to read.
      auto uncached = snapshot::Uncached(fd, want);
      if (uncached.empty()) {
        close(fd);
        return;
      }
      reads.push_back({fd, std::move(uncached)});
    };
    add(plan.pages_file,
        ws != nullptr ? *ws : std::vector<snapshot::FileRange>{});
    const std::string bundle_prefix = std::string(kSandboxBundleDir) + "/";
    for (const auto& f : plan.mapped_files)
      if (absl::StartsWith(f, bundle_prefix))
        add(pool.bundle->dir + "/" + f.substr(bundle_prefix.size()), {});
    if (!reads.empty()) {
      try {
        // Holds only its own fds and ranges: nothing of the invoker's.
        std::thread([reads = std::move(reads)] {
          for (const auto& r : reads) {
            snapshot::Prefetch(r.fd, r.ranges);
            close(r.fd);
          }
        }).detach();
      } catch (const std::system_error&) {
        for (const auto& r : reads) close(r.fd);
      }
    }
    return ws != nullptr;
  }

  // What instance `pid`, restored lazily from image `id`, touched in its
  // first call becomes the image's working set (once per image: REAP's
  // record-once; a new function version is a new image).
  void RecordWorkingSet(const std::string& id, pid_t pid) {
    if (WorkingSetOf(id) != nullptr) return;
    auto plan = PlanFor(id);
    if (!plan.ok()) return;
    auto ranges = snapshot::TouchedRanges(pid, (*plan)->pages_file);
    if (!ranges.ok() || ranges->empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(working_set_dir, ec);
    if (!snapshot::SaveWorkingSet(WorkingSetPath(id), *ranges).ok()) return;
    std::lock_guard<std::mutex> l(mu);
    working_sets[id] =
        std::make_shared<std::vector<snapshot::FileRange>>(*std::move(ranges));
  }

  void NoFastRestore(const std::string& id) {
    std::lock_guard<std::mutex> l(mu);
    no_fast.insert(id);
    plans.erase(id);
  }

  // A silt-restorer in a sandbox of `pool`'s function: namespaces, cgroup,
  // mounts, credentials and seccomp ready, the image mapped. `populate`: it
  // also fills the page tables (the first call then takes no page faults),
  // for restorers staged ahead while the resident budget has room for it.
  absl::StatusOr<std::unique_ptr<Instance>> SpawnRestorer(Pool& pool,
                                                          bool populate) {
    auto plan = PlanFor(pool.snapshot_id);
    if (!plan.ok()) return plan.status();
    auto inst = NewInstance(pool.spec);
    inst->tier = call_wire::StartTier::kRestore;
    int chan[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) != 0)
      return absl::InternalError("socketpair failed");
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    SandboxSpec sb;
    absl::Status s = SandboxFor(pool.spec, *pool.bundle, *inst,
                                /*snapshot_ready=*/true, &sb);
    if (s.ok()) {
      sb.argv = {absl::StrCat(kSandboxWorkerDir, "/silt-restorer")};
      sb.env = {"GLIBC_TUNABLES=glibc.pthread.rseq=0"};
      sb.channel_fd = chan[1];
      sb.stdout_fd = null;
      sb.stderr_fd = null;
      auto proc = Spawn(sb);
      if (proc.ok())
        inst->proc = *std::move(proc);
      else
        s = proc.status();
    }
    close(chan[1]);
    close(null);
    inst->channel = chan[0];
    if (!s.ok()) return s;
    auto listener = ListenIn(inst->base_dir + "/run", inst->host_id);
    if (!listener.ok()) return listener.status();
    inst->listener = *listener;
    if (auto st = StageRestorer(*inst, **plan, populate); !st.ok()) {
      NoFastRestore(pool.snapshot_id);
      return st;
    }
    return inst;
  }

  // Hands a fresh restorer the plan and the pages file; it prepares
  // everything and waits for 'G'.
  absl::Status StageRestorer(Instance& inst, const snapshot::FastPlan& plan,
                             bool populate) {
    int pages = open(plan.pages_file.c_str(), O_RDONLY | O_CLOEXEC);
    if (pages < 0)
      return absl::InternalError(absl::StrCat("cannot open ", plan.pages_file));
    absl::Status s = SendFds(inst.channel, &pages, 1);
    close(pages);
    uint32_t len = static_cast<uint32_t>(plan.bytes.size());
    std::string msg(1, populate ? 'P' : 'M');
    msg.append(reinterpret_cast<const char*>(&len), 4);
    msg += plan.bytes;
    for (size_t off = 0; s.ok() && off < msg.size();) {
      ssize_t n = write(inst.channel, msg.data() + off, msg.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) s = absl::UnavailableError("the restorer went away");
      off += n > 0 ? static_cast<size_t>(n) : 0;
    }
    if (!s.ok()) return s;
    // 'K': staged; 'E' and why: it cannot restore this image.
    pollfd p{inst.channel, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1)
      return absl::DeadlineExceededError("the restorer did not answer");
    char reply[512];
    ssize_t n = read(inst.channel, reply, sizeof(reply));
    if (n <= 0 || reply[0] != 'K')
      return absl::FailedPreconditionError(
          n > 1 ? std::string(reply + 1, static_cast<size_t>(n - 1))
                : "the restorer quit");
    return absl::OkStatus();
  }

  // Replaces taken restorers at once, looks for new images every 100 ms, and
  // keeps the node within its resident budget (measured once a second).
  void TendLoop() {
    for (uint64_t tick = 0;; ++tick) {
      {
        std::unique_lock<std::mutex> l(stop_mu);
        if (stop_cv.wait_for(l, std::chrono::milliseconds(100),
                             [&] { return stopping || tend_kick; }) &&
            stopping)
          return;
        tend_kick = false;
      }
      if (tick % 10 == 0) {  // once a second
        MeasureResident();
        std::vector<std::shared_ptr<Template>> dropped;
        std::lock_guard<std::mutex> l(mu);
        MakeRoomLocked(nullptr, 0, &dropped);
        // (the lock goes before `dropped`, declared first, ends templates)
      }
      TendRestorers();
    }
  }

  void KickTender() {
    {
      std::lock_guard<std::mutex> l(stop_mu);
      tend_kick = true;
    }
    stop_cv.notify_all();
  }

  // Keeps a ready restorer per function version that has an image here, as
  // the resident budget allows (the most recently started functions first).
  void TendRestorers() {
    if (!fast_restore_on) return;
    std::shared_ptr<Pool> chosen;
    bool populate = true;
    std::vector<std::shared_ptr<Template>> dropped;
    {
      std::lock_guard<std::mutex> l(mu);
      std::vector<std::shared_ptr<Pool>> candidates;
      for (auto& [key, pool] : pools) {
        if (pool->restorer || pool->restorer_starting ||
            !pool->snapshot_wanted || !images.contains(pool->snapshot_id) ||
            no_fast.contains(pool->snapshot_id))
          continue;
        candidates.push_back(pool);
      }
      std::stable_sort(candidates.begin(), candidates.end(),
                       [](const auto& a, const auto& b) {
                         return a->last_start > b->last_start;
                       });
      // One per pass, the most recently started function's first: a
      // function whose restorer was just used never waits behind a long
      // list (each takes a sandbox start); the next pass comes at once.
      // Populated while those take at most half the budget (and there is
      // room), else only mapped: many functions each get a restorer that
      // saves the sandbox start, the most recent also their page faults.
      for (auto& pool : candidates) {
        populate = true;
        uint64_t whole = RestorerBytesLocked(*pool, true);
        if (!MakeFullRoomLocked(*pool, whole, &dropped) ||
            !MakeRoomLocked(pool.get(), whole, &dropped)) {
          populate = false;
          if (!MakeRoomLocked(pool.get(), RestorerBytesLocked(*pool, false),
                              &dropped))
            continue;
        }
        pool->restorer_starting = true;
        pool->restorer_populated = populate;
        chosen = pool;
        break;
      }
    }
    dropped.clear();
    if (chosen == nullptr) return;
    auto r = SpawnRestorer(*chosen, populate);
    bool staged = r.ok();
    {
      std::lock_guard<std::mutex> l(mu);
      chosen->restorer_starting = false;
      if (r.ok()) chosen->restorer = *std::move(r);
    }
    if (staged) KickTender();  // (a failed one is tried again in 100 ms)
  }

  // Whether `need` more bytes of image held whole for `pool` (a populated
  // restorer or a template) fit in the half of the budget those may take,
  // after the ones of functions started less recently go (their restorers
  // come back only mapping the image; their templates in a minute, if
  // there is room then).
  bool MakeFullRoomLocked(const Pool& pool, uint64_t need,
                          std::vector<std::shared_ptr<Template>>* dropped) {
    const uint64_t share = options.resident_memory_bytes / 2;
    struct Full {
      Pool* pool;
      ResidentKind kind;
      uint64_t bytes;
      Clock::time_point used;
    };
    uint64_t held = 0, freeable = 0;
    std::vector<Full> older;
    for (const auto& [key, p] : pools) {
      std::vector<Full> mine;
      if (p->restorer && p->restorer_populated)
        mine.push_back({p.get(), ResidentKind::kRestorer,
                        RestorerBytesLocked(*p, true), p->last_start});
      if (p->tmpl)
        mine.push_back({p.get(), ResidentKind::kTemplate,
                        HeldBytesLocked(*p, ResidentKind::kTemplate),
                        std::max(p->last_start, p->tmpl->last_used)});
      for (const auto& f : mine) {
        held += f.bytes;
        if (f.used < pool.last_start) {
          freeable += f.bytes;
          older.push_back(f);
        }
      }
    }
    if (need > share || held - freeable + need > share) return false;
    std::sort(older.begin(), older.end(),
              [](const Full& a, const Full& b) { return a.used < b.used; });
    for (const Full& f : older) {
      if (held + need <= share) break;
      held -= f.bytes;
      if (f.kind == ResidentKind::kRestorer) {
        // Demoted in place: it keeps its sandbox and its mapping of the
        // image and gives back the pages ('D'; restorer.cc), which saves
        // the sandbox start of a new one that only maps.
        if (write(f.pool->restorer->channel, "D", 1) == 1)
          f.pool->restorer_populated = false;
        else
          graveyard.push_back(std::move(f.pool->restorer));
      } else {
        dropped->push_back(std::move(f.pool->tmpl));
        f.pool->template_retry_after = Clock::now() + std::chrono::minutes(1);
      }
    }
    return true;
  }

  // Restore by silt-restorer: hand the ready restorer the plan and the pages
  // file; it maps the image and becomes the worker, which then reconnects.
  absl::StatusOr<std::unique_ptr<Instance>> FastRestore(Pool& pool,
                                                        bool as_template) {
    auto start = Clock::now();
    const std::string& id = pool.snapshot_id;
    std::unique_ptr<Instance> inst;
    bool populated = false;
    {
      std::lock_guard<std::mutex> l(mu);
      inst = std::move(pool.restorer);
      populated = inst != nullptr && pool.restorer_populated;
    }
    // Mapped lazily: what the last lazy restore touched is read ahead now,
    // or, with none recorded, this one's first call records it.
    bool record = false;
    if (!populated) {
      if (auto plan = PlanFor(id); plan.ok())
        record = !PrefetchWorkingSet(pool, **plan);
    }
    if (inst == nullptr) {
      auto r = SpawnRestorer(pool, /*populate=*/false);
      if (!r.ok()) return r.status();
      inst = *std::move(r);
    }
    if (write(inst->channel, "G", 1) != 1)
      return absl::UnavailableError("the restorer went away");
    close(inst->channel);
    inst->channel = -1;
    pid_t pid = inst->proc->pid();
    absl::Status resumed =
        WakeAndResume(pool.spec, *inst, pid, inst->listener, as_template);
    KickTender();  // the next one, now that this one is up
    close(inst->listener);
    inst->listener = -1;
    if (!resumed.ok()) {
      NoFastRestore(id);
      return absl::InternalError(
          absl::StrCat(resumed.message(), ": ", DeathReason(*inst).text));
    }
    inst->start_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    inst->last_used = Clock::now();
    if (record && !as_template) inst->record_working_set = id;
    return inst;
  }

  absl::StatusOr<std::unique_ptr<Instance>> CriuRestoreInstance(
      Pool& pool, bool by_criu, bool as_template) {
    auto start = Clock::now();
    std::string dir = ImageDir(pool.snapshot_id);
    auto inst = NewInstance(pool.spec);
    inst->tier = call_wire::StartTier::kRestore;
    if (auto s = PrepareRootSkeleton(inst->base_dir + "/root"); !s.ok())
      return s;
    if (bind_dev_tmp) {
      if (auto s = MountTmp(inst->base_dir + "/tmp", 64 << 20); !s.ok())
        return s;
      inst->tmp_mounted = true;
    }
    auto listener = ListenIn(inst->base_dir + "/run", inst->host_id);
    if (!listener.ok()) return listener.status();
    snapshot::RestoreOptions o;
    o.images_dir = dir;
    o.root_dir = inst->base_dir + "/root";
    o.work_dir = inst->base_dir + "/work";
    o.mounts = Mounts(*inst, *pool.bundle);
    std::vector<std::pair<std::string, std::string>> sources;
    for (const auto& m : o.mounts) sources.emplace_back(m.key, m.host_dir);
    auto binds = TraversableBinds::Make(inst->id, sources);
    if (!binds.ok()) {
      close(*listener);
      return binds.status();
    }
    for (auto& m : o.mounts) m.host_dir = (*binds)->PathOf(m.key);
    if (by_criu) inst->tier = call_wire::StartTier::kCriu;
    auto pid = snapshot::Restore(o);
    if (!pid.ok()) {
      close(*listener);
      return pid.status();
    }
    auto cg =
        Cgroup::Create(absl::StrCat("silt/", cgroup_id, "/", inst->id),
                       MemoryLimit(pool.spec), CpuMillis(pool.spec), 1024);
    if (!cg.ok()) {
      kill(*pid, SIGKILL);
      waitpid(*pid, nullptr, 0);
      close(*listener);
      return cg.status();
    }
    auto proc = SandboxedProcess::Adopt(*pid, *std::move(cg));
    if (!proc.ok()) {
      kill(*pid, SIGKILL);
      waitpid(*pid, nullptr, 0);
      close(*listener);
      return proc.status();
    }
    inst->proc = *std::move(proc);
    absl::Status s = LoopbackUp(*pid);
    if (s.ok())
      s = WakeAndResume(pool.spec, *inst, *pid, *listener, as_template);
    close(*listener);
    if (!s.ok()) return s;
    inst->start_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    inst->last_used = Clock::now();
    return inst;
  }

  // Turns a ready instance into `pool`'s fork template.
  absl::StatusOr<std::shared_ptr<Template>> MakeTemplate(
      Pool& pool, std::unique_ptr<Instance> inst) {
    v1::WorkerCall op;
    op.set_op("template");
    v1::WorkerReply ok;
    if (auto s = WriteFrame(inst->channel, op); !s.ok()) return s;
    if (auto s = ReadFrame(inst->channel, &ok, std::chrono::seconds(10));
        !s.ok())
      return s;
    auto t = std::make_shared<Template>();
    t->snapshot_id = pool.snapshot_id;
    t->inst = std::move(inst);
    t->last_used = Clock::now();
    return t;
  }

  // Fork: a clone of the template, in its own cgroup.
  absl::StatusOr<std::unique_ptr<Instance>> ForkInstance(
      Pool& pool, std::shared_ptr<Template> t) {
    auto start = Clock::now();
    auto inst = std::make_unique<Instance>();
    inst->id = absl::StrCat(pool.spec.name(), "-", RandomId(8));
    inst->tier = call_wire::StartTier::kFork;
    int chan[2], out_w, err_w;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) != 0)
      return absl::InternalError("socketpair failed");
    inst->channel = chan[0];
    if (auto s = LogPipes(pool.spec, inst->id, &out_w, &err_w); !s.ok()) {
      close(chan[1]);
      return s;
    }
    auto state = StateSocket(pool.spec);
    if (!state.ok()) {
      close(chan[1]);
      close(out_w);
      close(err_w);
      return state.status();
    }
    v1::WorkerReply reply;
    absl::Status s;
    {
      std::lock_guard<std::mutex> l(t->fork_mu);
      int fds[4] = {chan[1], out_w, err_w, *state};
      s = SendFds(t->inst->channel, fds, 4);
      v1::WorkerCall fork;
      fork.set_op("fork");
      fork.set_instance_id(inst->id);
      fork.set_seed(Seed());
      if (s.ok()) s = WriteFrame(t->inst->channel, fork);
      if (s.ok())
        s = ReadFrame(t->inst->channel, &reply, std::chrono::seconds(10));
      t->last_used = Clock::now();
    }
    close(chan[1]);
    close(out_w);
    close(err_w);
    close(*state);
    if (!s.ok()) return s;
    if (reply.status() != 200)
      return absl::InternalError(absl::StrCat("fork failed: ", reply.body()));
    pid_t host = HostPidOfChild(t->inst->proc->pid(), reply.body());
    if (host <= 0)
      return absl::InternalError("cannot find the forked clone's process");
    auto cg =
        Cgroup::Create(absl::StrCat("silt/", cgroup_id, "/", inst->id),
                       MemoryLimit(pool.spec), CpuMillis(pool.spec), 1024);
    if (!cg.ok()) {
      kill(host, SIGKILL);
      return cg.status();
    }
    auto proc = SandboxedProcess::AdoptClone(host, *std::move(cg));
    if (!proc.ok()) {
      kill(host, SIGKILL);
      return proc.status();
    }
    inst->proc = *std::move(proc);
    inst->tmpl = std::move(t);
    v1::WorkerReady ready;
    if (auto r = ReadFrame(inst->channel, &ready, std::chrono::seconds(30));
        !r.ok() || !ready.ok())
      return absl::UnavailableError(
          absl::StrCat("forked instance ", inst->id, " did not start"));
    inst->start_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    inst->last_used = Clock::now();
    return inst;
  }

  // The host PID of `parent`'s child whose PID in the sandbox is `ns_pid`.
  static pid_t HostPidOfChild(pid_t parent, const std::string& ns_pid) {
    for (pid_t c : ProcessTree(parent)) {
      if (c == parent) continue;
      std::ifstream status(absl::StrCat("/proc/", c, "/status"));
      std::string line;
      while (std::getline(status, line)) {
        if (!absl::StartsWith(line, "NSpid:")) continue;
        std::vector<std::string> parts =
            absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
        if (!parts.empty() && parts.back() == ns_pid) return c;
      }
    }
    return -1;
  }

  // ---- what is held resident ahead of cold starts (resident_budget.h) ----

  // What a pool's restorer or template holds (or would): as last measured,
  // else its image's size (a restorer maps all of it).
  uint64_t HeldBytesLocked(const Pool& pool, ResidentKind kind) {
    if (kind == ResidentKind::kRestorer)
      return RestorerBytesLocked(pool, pool.restorer_populated);
    return pool.template_bytes > 0 ? pool.template_bytes
                                   : ImageBytesLocked(pool);
  }

  uint64_t ImageBytesLocked(const Pool& pool) {
    auto it = images.find(pool.snapshot_id);
    return it != images.end() ? it->second.bytes : 0;
  }

  // A staged restorer of `pool`, populated or only mapped: as last measured,
  // else its image's size or (only mapped) kMappedRestorerBytes.
  static constexpr uint64_t kMappedRestorerBytes = 2 << 20;
  uint64_t RestorerBytesLocked(const Pool& pool, bool populated) {
    uint64_t measured =
        populated ? pool.restorer_bytes : pool.light_restorer_bytes;
    if (measured > 0) return measured;
    return populated ? ImageBytesLocked(pool) : kMappedRestorerBytes;
  }

  // Measures what the restorers and templates hold (PSS: they share their
  // image's pages), off the lock; the tender does it once a second.
  void MeasureResident() {
    struct Probe {
      std::shared_ptr<Pool> pool;
      ResidentKind kind;
      pid_t pid;
      bool populated = false;  // a restorer: as it was when probed
      uint64_t bytes = 0;
    };
    std::vector<Probe> probes;
    {
      std::lock_guard<std::mutex> l(mu);
      for (auto& [key, pool] : pools) {
        if (pool->restorer)
          probes.push_back({pool, ResidentKind::kRestorer,
                            pool->restorer->proc->pid(),
                            pool->restorer_populated});
        if (pool->tmpl)
          probes.push_back(
              {pool, ResidentKind::kTemplate, pool->tmpl->inst->proc->pid()});
      }
    }
    for (auto& p : probes) p.bytes = ProportionalSetBytes(p.pid);
    std::lock_guard<std::mutex> l(mu);
    for (const auto& p : probes) {
      if (p.bytes == 0) continue;  // gone meanwhile
      if (p.kind == ResidentKind::kTemplate) {
        p.pool->template_bytes = p.bytes;
        continue;
      }
      // Replaced, used or demoted meanwhile: not what is there now.
      const Pool& pool = *p.pool;
      if (!pool.restorer || pool.restorer->proc->pid() != p.pid ||
          pool.restorer_populated != p.populated)
        continue;
      (p.populated ? p.pool->restorer_bytes : p.pool->light_restorer_bytes) =
          p.bytes;
    }
  }

  struct Resident {
    std::shared_ptr<Pool> pool;
    ResidentHolder holder;
  };
  std::vector<Resident> ResidentLocked() {
    std::vector<Resident> out;
    for (auto& [key, pool] : pools) {
      if (pool->restorer)
        out.push_back({pool,
                       {ResidentKind::kRestorer,
                        HeldBytesLocked(*pool, ResidentKind::kRestorer),
                        pool->last_start}});
      if (pool->tmpl)
        out.push_back({pool,
                       {ResidentKind::kTemplate,
                        HeldBytesLocked(*pool, ResidentKind::kTemplate),
                        std::max(pool->last_start, pool->tmpl->last_used)}});
    }
    return out;
  }

  // Makes room for `need` more bytes for `pool` (null: brings the node back
  // under its budget) by letting go of the holders of functions started less
  // recently. Restorers go to the reaper; templates end in `dropped`, outside
  // the lock (clones keep theirs alive until they end). False: no room.
  bool MakeRoomLocked(const Pool* pool, uint64_t need,
                      std::vector<std::shared_ptr<Template>>* dropped) {
    std::vector<Resident> resident = ResidentLocked();
    std::vector<ResidentHolder> holders;
    for (const auto& r : resident) holders.push_back(r.holder);
    auto plan = PlanEviction(
        holders, options.resident_memory_bytes, need,
        pool != nullptr ? pool->last_start : Clock::time_point::max());
    if (!plan) return false;
    for (size_t i : *plan) {
      Pool& p = *resident[i].pool;
      const ResidentHolder& h = resident[i].holder;
      logs.Append(
          Key(p.spec.namespace_(), p.spec.name()), "invoker",
          absl::StrCat("silt: ", ResidentKindName(h.kind), " (", h.bytes >> 20,
                       " MiB) let go: the node's resident budget (",
                       options.resident_memory_bytes >> 20,
                       " MiB) went to functions started more "
                       "recently"));
      if (h.kind == ResidentKind::kRestorer) {
        if (p.restorer) graveyard.push_back(std::move(p.restorer));
      } else if (p.tmpl) {
        dropped->push_back(std::move(p.tmpl));
        p.template_retry_after = Clock::now() + std::chrono::minutes(1);
      }
    }
    return true;
  }

  // What the images' holders hold here, by image id (for the reports).
  std::map<std::string, std::pair<uint64_t, bool>> ResidentByImageLocked() {
    std::map<std::string, std::pair<uint64_t, bool>> out;  // bytes, staged
    for (const auto& r : ResidentLocked()) {
      auto& [bytes, staged] = out[r.pool->snapshot_id];
      bytes += r.holder.bytes;
      staged |= r.holder.kind == ResidentKind::kRestorer;
    }
    return out;
  }

  // Starts an instance for a call that found none idle: fork from the
  // template, else restore from the image (fetched from a peer if need be),
  // else boot (and take the snapshot). `force` picks one tier.
  absl::StatusOr<std::unique_ptr<Instance>> StartFresh(
      std::shared_ptr<Pool> pool, ColdStart force = ColdStart::kAny) {
    {
      std::lock_guard<std::mutex> l(mu);
      auto now = Clock::now();
      if (pool->restorer == nullptr &&
          pool->last_start != Clock::time_point() &&
          now - pool->last_start < kBurstGap)
        pool->last_burst = now;
      pool->last_start = now;
    }
    if (force == ColdStart::kBoot || !pool->snapshot_wanted) {
      if (force != ColdStart::kAny && force != ColdStart::kBoot)
        return absl::FailedPreconditionError(absl::StrCat(
            "function ", pool->spec.name(), " does not use snapshots"));
      return StartInstance(pool->spec, *pool->bundle);
    }
    if (force == ColdStart::kCriu) {
      if (auto image = EnsureImage(*pool); !image.ok()) return image.status();
      return RestoreInstance(*pool, /*by_criu=*/true);
    }
    // A staged restorer is the fastest start (README, Benchmarks: restore
    // beats fork at every size); the template serves starts that find none.
    std::shared_ptr<Template> t;
    bool staged = false;
    {
      std::lock_guard<std::mutex> l(mu);
      t = pool->tmpl;
      staged = pool->restorer != nullptr;
    }
    if (t == nullptr && force == ColdStart::kFork) {
      if (!pool->forkable || options.resident_memory_bytes == 0)
        return absl::FailedPreconditionError(absl::StrCat(
            "function ", pool->spec.name(), " has no fork tier here"));
      if (auto s = EnsureTemplate(pool); !s.ok()) return s;
      std::lock_guard<std::mutex> l(mu);
      t = pool->tmpl;
      if (t == nullptr)
        return absl::UnavailableError("the template was dropped; try again");
    }
    if (t != nullptr &&
        (force == ColdStart::kFork || (force == ColdStart::kAny && !staged))) {
      auto inst = ForkInstance(*pool, t);
      if (inst.ok() || force == ColdStart::kFork) return inst;
      logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), "invoker",
                  absl::StrCat("silt: fork failed (", inst.status().message(),
                               "); dropping the template"));
      std::lock_guard<std::mutex> l(mu);
      if (pool->tmpl == t) pool->tmpl.reset();
    }
    auto image = EnsureImage(*pool);
    if (image.ok()) {
      auto inst = RestoreInstance(*pool);
      if (inst.ok()) {
        std::lock_guard<std::mutex> l(mu);
        if (pool->forkable) pool->template_retry_after = Clock::time_point();
        return inst;
      }
      if (force == ColdStart::kRestore) return inst.status();
      // Never the same broken image twice: boot, and snapshot again.
      logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), "invoker",
                  absl::StrCat("silt: restore failed (",
                               inst.status().message(), "); booting"));
      DropImage(pool->snapshot_id, std::string(inst.status().message()));
    } else if (force == ColdStart::kRestore) {
      return image.status();
    }
    return BootAndCheckpoint(pool);
  }

  // Boot; the first boot of a version without a snapshot takes it.
  absl::StatusOr<std::unique_ptr<Instance>> BootAndCheckpoint(
      std::shared_ptr<Pool> pool) {
    bool take = false;
    {
      std::lock_guard<std::mutex> l(mu);
      if (!pool->checkpointing && !images.contains(pool->snapshot_id)) {
        pool->checkpointing = true;
        take = true;
      }
    }
    auto inst =
        StartInstance(pool->spec, *pool->bundle, /*snapshot_ready=*/true);
    if (!take || !inst.ok()) {
      if (take) {
        std::lock_guard<std::mutex> l(mu);
        pool->checkpointing = false;
      }
      return inst;
    }
    auto start = Clock::now();
    absl::Status s = Checkpoint(*pool, **inst);
    {
      std::lock_guard<std::mutex> l(mu);
      pool->checkpointing = false;
    }
    if (!s.ok()) {
      fprintf(stderr, "silt-invoker: snapshot of %s failed: %s\n",
              pool->spec.name().c_str(), std::string(s.message()).c_str());
      logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), "invoker",
                  absl::StrCat("silt: snapshot failed: ", s.message()));
      if ((*inst)->channel < 0) return s;  // it could not be resumed
    }
    (*inst)->start_ms +=
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    return inst;
  }

  // A template for `pool` from its image (restored anew: the instance that
  // serves calls stays separate). Waits for one another thread is starting.
  // NotFound: there is no image (any more).
  absl::Status EnsureTemplate(std::shared_ptr<Pool> pool) {
    {
      std::unique_lock<std::mutex> l(mu);
      if (pool->template_starting) {
        pool->template_cv.wait(l, [&] { return !pool->template_starting; });
        return pool->tmpl ? absl::OkStatus()
                          : absl::UnavailableError(
                                "the template could not be started");
      }
      if (pool->tmpl) return absl::OkStatus();
      pool->template_starting = true;
    }
    absl::StatusOr<std::shared_ptr<Template>> t =
        absl::UnavailableError("no image");
    if (auto image = EnsureImage(*pool); image.ok()) {
      auto inst = RestoreInstance(*pool, /*by_criu=*/false,
                                  /*as_template=*/true);
      if (inst.ok())
        t = MakeTemplate(*pool, *std::move(inst));
      else
        t = inst.status();
    } else {
      t = image.status();
    }
    std::shared_ptr<Template> stale;
    absl::Status result = t.status();
    {
      std::lock_guard<std::mutex> l(mu);
      pool->template_starting = false;
      if (t.ok() && !images.contains(pool->snapshot_id)) {
        // Dropped while it started (damaged, deleted, or the function
        // changed): a template must not outlive its image.
        stale = *std::move(t);
        result = absl::NotFoundError("the image was dropped");
      } else if (!t.ok()) {
        pool->template_retry_after = Clock::now() + std::chrono::seconds(30);
      } else {
        pool->tmpl = *t;
      }
    }
    pool->template_cv.notify_all();
    return result;
  }

  // Keeps templates for functions that have images and recent bursts of cold
  // starts (all recently started ones without silt-restorer),
  // within the memory budget (least recently used go first).
  void TendTemplates() {
    if (!snapshots_on || options.resident_memory_bytes == 0) return;
    std::vector<std::shared_ptr<Pool>> want;
    std::vector<std::shared_ptr<Template>> evicted;
    {
      std::lock_guard<std::mutex> l(mu);
      MakeRoomLocked(nullptr, 0, &evicted);
      uint64_t admitted = 0;  // templates of this round, not resident yet
      auto now = Clock::now();
      for (auto& [key, pool] : pools) {
        if (!pool->snapshot_wanted || !pool->forkable || pool->tmpl ||
            pool->template_starting || !images.contains(pool->snapshot_id) ||
            now < pool->template_retry_after)
          continue;
        // With staged restorers, only functions that had a burst lately: a
        // template for every function started once would cost a restore
        // (and a restorer) each, and evict another's.
        if (fast_restore_on && (pool->last_burst == Clock::time_point() ||
                                now - pool->last_burst > kTemplateAfterBurst))
          continue;
        uint64_t need = HeldBytesLocked(*pool, ResidentKind::kTemplate);
        if (!MakeFullRoomLocked(*pool, admitted + need, &evicted) ||
            !MakeRoomLocked(pool.get(), admitted + need, &evicted))
          continue;
        admitted += need;
        want.push_back(pool);
      }
    }
    evicted.clear();  // (clones keep theirs alive until they end)
    for (auto& pool : want) {
      if (Stopping()) return;
      if (auto s = EnsureTemplate(pool); !s.ok())
        logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), "invoker",
                    absl::StrCat("silt: no fork template: ", s.message()));
    }
  }

  // Drops images no assigned function version uses (updated or deleted
  // functions).
  void CollectImages(const std::set<std::string>& wanted_ids) {
    std::vector<std::string> doomed;
    {
      std::lock_guard<std::mutex> l(mu);
      for (const auto& [id, m] : images)
        if (!wanted_ids.contains(id)) doomed.push_back(id);
    }
    for (const auto& id : doomed) DropImage(id, "");
  }

  // Loads the images a previous invoker left (sizes checked now, checksums
  // at first use) and removes partial ones.
  void LoadImages() {
    std::error_code ec;
    std::filesystem::create_directories(snapshot_dir, ec);
    for (const auto& e :
         std::filesystem::directory_iterator(snapshot_dir, ec)) {
      std::string name = e.path().filename().string();
      if (absl::StartsWith(name, ".")) {
        std::filesystem::remove_all(e.path(), ec);
        continue;
      }
      auto m = snapshot::ReadManifest(e.path().string());
      if (!m.ok() || m->id != name || m->kernel != snapshot::KernelRelease()) {
        std::filesystem::remove_all(e.path(), ec);
        continue;
      }
      images[name] = *m;
    }
    // Working sets of images gone since.
    for (const auto& e :
         std::filesystem::directory_iterator(working_set_dir, ec))
      if (!images.contains(e.path().filename().string()))
        std::filesystem::remove(e.path(), ec);
  }

  std::shared_ptr<Pool> PoolFor(const FunctionSpec& spec,
                                std::shared_ptr<Bundle> bundle) {
    std::lock_guard<std::mutex> l(mu);
    auto& p = pools[Key(spec.namespace_(), spec.name())];
    if (!p || p->spec.generation() != spec.generation()) {
      auto fresh = std::make_shared<Pool>();
      fresh->spec = spec;
      fresh->snapshot_id = SnapshotIdOf(spec);
      fresh->snapshot_wanted = snapshots_on && SnapshotsWanted(spec);
      fresh->forkable =
          !(bundle->manifest.kind == "exec" && bundle->manifest.mode == "http");
      fresh->bundle = std::move(bundle);
      if (p) fresh->min_instances = p->min_instances;
      p = fresh;  // the old pool's instances stop as their calls end
    }
    return p;
  }

  int MaxInstances(const FunctionSpec& spec) {
    int max = options.max_instances_per_function;
    if (auto it = spec.labels().find("com.openfaas.scale.max");
        it != spec.labels().end()) {
      int v = 0;
      if (absl::SimpleAtoi(it->second, &v) && v > 0) max = std::min(max, v);
    }
    return max;
  }

  // Takes an idle instance, or starts one, or waits in the bounded queue.
  // `headroom`: instances it may start beyond the function's maximum (compute
  // proclets, so that the jobs of callers holding every instance still run).
  absl::StatusOr<std::unique_ptr<Instance>> Acquire(
      std::shared_ptr<Pool> pool_ptr, Clock::time_point deadline,
      call_wire::StartTier* tier, int headroom = 0) {
    Pool& pool = *pool_ptr;
    std::unique_lock<std::mutex> l(mu);
    while (true) {
      if (!pool.idle.empty()) {
        auto inst = std::move(pool.idle.back());
        pool.idle.pop_back();
        ++pool.busy;
        *tier = call_wire::StartTier::kWarm;
        return inst;
      }
      int total =
          pool.busy + pool.starting + static_cast<int>(pool.idle.size());
      // Start an instance for this call unless one that the pool is filling in
      // (for its minimum) will be free for it.
      if (total < MaxInstances(pool.spec) + headroom &&
          pool.filling <= pool.waiting) {
        ++pool.starting;
        l.unlock();
        auto inst = StartFresh(pool_ptr);
        l.lock();
        --pool.starting;
        if (!inst.ok()) {
          pool.cv.notify_all();
          return inst.status();
        }
        ++pool.busy;
        *tier = (*inst)->tier;
        return inst;
      }
      if (pool.waiting >= options.max_queue_per_function) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "function ", pool.spec.name(), " is at capacity: ", pool.busy,
            " calls running and ", pool.waiting, " queued"));
      }
      ++pool.waiting;
      bool ok = pool.cv.wait_until(l, deadline, [&] {
        return !pool.idle.empty() ||
               (pool.busy + pool.starting + static_cast<int>(pool.idle.size()) <
                    MaxInstances(pool.spec) + headroom &&
                pool.filling < pool.waiting);
      });
      --pool.waiting;
      if (!ok)
        return absl::DeadlineExceededError(
            "timed out waiting for a free instance");
    }
  }

  // Gives an instance back (null: it is gone); `count`, when given, gets the
  // pool's instances after that.
  void Release(Pool& pool, std::unique_ptr<Instance> inst,
               v1::InstanceCount* count = nullptr) {
    std::lock_guard<std::mutex> l(mu);
    --pool.busy;
    if (inst) {
      inst->last_used = Clock::now();
      pool.idle.push_back(std::move(inst));
    }
    if (count) *count = CountLocked(pool);
    pool.cv.notify_one();
  }

  std::chrono::milliseconds Timeout(const FunctionSpec& spec,
                                    uint64_t requested_ms) {
    std::chrono::milliseconds t = requested_ms > 0
                                      ? std::chrono::milliseconds(requested_ms)
                                      : std::chrono::milliseconds(60000);
    if (auto it = spec.env().find("exec_timeout"); it != spec.env().end()) {
      if (auto d = ParseDuration(it->second); d && d->count() > 0)
        t = std::min(t, *d);
    }
    return t;
  }

  // Takes each part of a streamed reply (WorkerReply.more) as it arrives;
  // false when the caller is gone.
  using Parts = std::function<bool(v1::WorkerReply& part)>;

  // Sends `call` to an acquired instance (its timeout: what is left until
  // `deadline`) and reads the reply: the parts of a streamed one go to
  // `parts` as they come (without it, a streamed reply fails the call), and
  // *reply gets the last frame. On failure the instance is released as
  // discarded (the pool's next call gets a fresh one; the caller still
  // holds it, for its id), the line "silt: instance ID <role>WHY" goes to
  // the function's log, and *why says what happened: "timed out"
  // (DeadlineExceeded), the caller left mid-stream (Cancelled) or how the
  // instance died.
  // While a reply streams, `watch` (the caller's connection, which carries
  // nothing else meanwhile) closing ends the call too.
  absl::Status CallInstance(Pool& pool, Instance& inst, v1::WorkerCall& call,
                            Clock::time_point deadline, const char* role,
                            v1::WorkerReply* reply, Death* why,
                            const Parts& parts = {}, int watch = -1) {
    // A cold start may have used up the call's time: the call still goes
    // out, with 1 ms, and the read waits 100 ms more at most (ReadFrame
    // waits forever on a negative timeout: the call would run to its end).
    auto Left = [deadline] {
      return std::max(std::chrono::milliseconds(1),
                      std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - Clock::now()));
    };
    call.set_timeout_ms(static_cast<uint64_t>(Left().count()));
    absl::Status s = WriteFrame(inst.channel, call);
    bool streaming = false;
    while (s.ok()) {
      if (streaming && watch >= 0)
        s = AwaitFrame(inst.channel, watch,
                       Left() + std::chrono::milliseconds(100));
      if (s.ok())
        s = ReadFrame(inst.channel, reply,
                      Left() + std::chrono::milliseconds(100));
      if (!s.ok() || !reply->more()) break;
      streaming = true;
      if (!parts || !parts(*reply))
        s = absl::CancelledError("the caller went away mid-stream");
    }
    if (s.ok()) {
      // The instance lives, but the OOM killer may have ended one of its
      // processes (a classic fprocess): the failed call says why.
      if (reply->status() >= 500 && inst.proc &&
          inst.proc->cgroup().NewOomKills() > 0) {
        std::string oom =
            "a process was killed: out of memory (memory limit reached)";
        reply->set_body(absl::StrCat(reply->body(), "silt: ", oom, "\n"));
        logs.Append(Key(pool.spec.namespace_(), pool.spec.name()), inst.id,
                    absl::StrCat("silt: instance ", inst.id, " ", role, oom));
      }
      return s;
    }
    if (absl::IsDeadlineExceeded(s)) {
      *why = Death{.text = "timed out"};
    } else if (absl::IsCancelled(s)) {
      *why = Death{.kind = call_wire::Failure::kNone,
                   .text = "ended: its caller went away mid-stream"};
    } else {
      *why = DeathReason(inst);
    }
    Release(pool, nullptr);
    logs.Append(Key(pool.spec.namespace_(), pool.spec.name()), inst.id,
                absl::StrCat("silt: instance ", inst.id, " ", role, why->text));
    return s;
  }

  // A call from the gateway (CallPort): runs it in an instance of the
  // function, taking an idle one or starting one. A streamed response goes
  // out on `stream` as the function writes it; *res then ends it.
  void Call(call_wire::Request& req, call_wire::Reply* res,
            ReplyStream& stream) {
    using call_wire::Outcome;
    auto fail = [res](const absl::Status& s) {
      res->outcome = Outcome::kError;
      res->error_code = static_cast<uint8_t>(s.code());
      res->error = std::string(s.message());
    };
    std::shared_ptr<Pool> pool;
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = pools.find(Key(req.ns, req.name));
      if (it != pools.end() && it->second->spec.generation() == req.generation)
        pool = it->second;
    }
    if (!pool) {
      FunctionSpec spec;
      if (req.spec.empty() || !spec.ParseFromString(req.spec) ||
          spec.generation() != req.generation) {
        res->outcome = Outcome::kNeedSpec;
        return;
      }
      auto bundle = EnsureBundle(spec.bundle_digest());
      if (!bundle.ok()) return fail(bundle.status());
      pool = PoolFor(spec, *bundle);
    }
    auto timeout = Timeout(pool->spec, req.timeout_ms);
    auto deadline = Clock::now() + timeout;
    call_wire::StartTier tier;
    const ColdStart force = req.cold_start;
    absl::StatusOr<std::unique_ptr<Instance>> inst;
    if (force != ColdStart::kAny) {
      inst = StartFresh(pool, force);
      if (!inst.ok()) return fail(inst.status());
      tier = (*inst)->tier;
      std::lock_guard<std::mutex> l(mu);
      ++pool->busy;
    } else {
      inst = Acquire(pool, deadline, &tier);
      if (!inst.ok()) return fail(inst.status());
    }

    v1::WorkerCall call;
    call.set_call_id(std::move(req.call_id));
    call.set_method(std::move(req.method));
    call.set_path(std::move(req.path));
    call.set_query(std::move(req.query));
    for (auto& [k, v] : req.headers) {
      auto* h = call.add_headers();
      h->set_name(std::move(k));
      h->set_value(std::move(v));
    }
    call.set_body(std::move(req.body));
    v1::WorkerReply reply;
    Death why;
    res->tier = tier;
    res->instance = (*inst)->id;
    if (tier != call_wire::StartTier::kWarm)
      res->start_us = static_cast<uint32_t>((*inst)->start_ms * 1000);
    auto parts = [&stream, res](v1::WorkerReply& part) {
      if (stream.started()) return stream.Part(part.body());
      call_wire::Reply head;
      head.status = static_cast<uint16_t>(part.status());
      for (auto& h : *part.mutable_headers())
        head.headers.emplace_back(std::move(*h.mutable_name()),
                                  std::move(*h.mutable_value()));
      head.body = std::move(*part.mutable_body());
      head.tier = res->tier;
      head.start_us = res->start_us;
      head.instance = res->instance;
      return stream.Head(head);
    };
    absl::Status s = CallInstance(*pool, **inst, call, deadline, "", &reply,
                                  &why, parts, stream.fd());
    if (s.ok() && stream.started() && !reply.error().empty()) {
      // The handler failed after its head was out: the body breaks off.
      logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), (*inst)->id,
                  absl::StrCat("silt: the streamed response of call ",
                               call.call_id(), " broke off: ", reply.error()));
      fail(absl::InternalError(reply.error()));
      reply.clear_body();
    } else if (!s.ok()) {
      if (absl::IsDeadlineExceeded(s))
        return fail(absl::DeadlineExceededError(
            absl::StrCat("function ", req.name, " timed out after ",
                         timeout.count(), " ms")));
      res->failure = why.kind;
      if (stream.started())  // the body breaks off
        return fail(absl::AbortedError(absl::StrCat(
            "function ", req.name, " instance ", (*inst)->id, " ", why.text)));
      res->status = 502;
      res->body = absl::StrCat("function ", req.name, " instance ", (*inst)->id,
                               " ", why.text, "\n");
      res->headers.emplace_back("Content-Type", "text/plain; charset=utf-8");
      return;
    }
    if (!stream.started()) {
      res->status = static_cast<uint16_t>(reply.status());
      res->headers.reserve(reply.headers_size());
      for (auto& h : *reply.mutable_headers())
        res->headers.emplace_back(std::move(*h.mutable_name()),
                                  std::move(*h.mutable_value()));
    }
    res->body = std::move(*reply.mutable_body());
    (*inst)->fresh = false;
    if (!(*inst)->record_working_set.empty())
      RecordWorkingSet(std::exchange((*inst)->record_working_set, ""),
                       (*inst)->proc->pid());
    v1::InstanceCount count;
    if (force != ColdStart::kAny) {
      // A forced start serves one call; the reaper tears the instance down
      // after the answer is out.
      Release(*pool, nullptr, &count);
      std::lock_guard<std::mutex> l(mu);
      graveyard.push_back(*std::move(inst));
    } else {
      Release(*pool, *std::move(inst), &count);
    }
    res->ready = count.ready();
    res->busy = count.busy();
  }

  // A compute proclet's share of a job (executor.h), in an instance of the
  // function: the task's reply. kRetry when nothing ran (the function is not
  // here, or it is at capacity).
  std::string RunTask(const TaskTarget& t, std::string_view task_call) {
    std::shared_ptr<Pool> pool;
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = pools.find(Key(t.ns, t.function));
      if (it != pools.end() &&
          (t.generation == 0 || it->second->spec.generation() == t.generation))
        pool = it->second;
    }
    if (!pool)
      return Error(wire::StateCode::kRetry,
                   absl::StrCat("function ", t.function, " (version ",
                                t.generation, ") is not on node ", node_name));
    auto timeout = std::chrono::milliseconds(t.timeout_ms);
    auto deadline = Clock::now() + timeout;
    call_wire::StartTier tier;
    int headroom = static_cast<int>(std::max(1u, Cores()));
    auto inst = Acquire(pool, deadline, &tier, headroom);
    if (!inst.ok())
      return Error(absl::IsResourceExhausted(inst.status())
                       ? wire::StateCode::kRetry
                       : CodeOf(inst.status()),
                   inst.status().message());
    v1::WorkerCall call;
    call.set_op("task");
    call.set_call_id(absl::StrCat("task-", RandomId(8)));
    call.set_body(std::string(task_call));
    {
      std::lock_guard<std::mutex> l(mu);
      task_channels.insert((*inst)->channel);
      ++tasks_running;
    }
    v1::WorkerReply reply;
    Death why;
    absl::Status s = CallInstance(*pool, **inst, call, deadline,
                                  "(a compute proclet) ", &reply, &why);
    {
      std::lock_guard<std::mutex> l(mu);
      task_channels.erase((*inst)->channel);
      --tasks_running;
    }
    if (!s.ok()) {
      std::string id = (*inst)->id;
      if (absl::IsDeadlineExceeded(s))
        return Error(wire::StateCode::kTimeout,
                     absl::StrCat("its share took longer than ",
                                  timeout.count(), " ms"));
      return Error(wire::StateCode::kInternal,
                   absl::StrCat("instance ", id, " ", why.text));
    }
    (*inst)->fresh = false;
    Release(*pool, *std::move(inst));
    if (reply.body().empty())
      return Error(wire::StateCode::kInternal, "empty task reply");
    return std::move(*reply.mutable_body());
  }

  // This node's CPU capacity: --cpus, else the machine's.
  uint32_t Cores() const {
    return options.cpus > 0 ? options.cpus
                            : std::thread::hardware_concurrency();
  }

  // What the executor's shares run as: the function's version here, and its
  // timeout.
  TaskTarget TargetOf(const std::string& ns, const std::string& function) {
    TaskTarget t;
    t.ns = ns;
    t.function = function;
    std::lock_guard<std::mutex> l(mu);
    auto it = pools.find(Key(ns, function));
    if (it != pools.end()) {
      t.generation = it->second->spec.generation();
      t.timeout_ms =
          static_cast<uint32_t>(Timeout(it->second->spec, 0).count());
    }
    return t;
  }

  void SetCluster(const v1::ClusterView& v) {
    ClusterView::Nodes nodes;
    for (const auto& n : v.nodes())
      nodes.push_back({n.name(), n.data_address(), n.cores(), n.cpu_used(),
                       n.draining(), n.tasks(), n.hot()});
    cluster.Set(std::move(nodes));
  }

  grpc::Status Logs(grpc::ServerContext* ctx, const v1::LogsRequest* req,
                    grpc::ServerWriter<v1::LogEntry>* writer) override {
    logs.Read(
        Key(req->namespace_(), req->name()), req->since_unix_nanos(),
        req->tail(), req->follow(),
        [&](const LogLine& line) {
          v1::LogEntry e;
          e.set_name(req->name());
          e.set_namespace_(req->namespace_());
          e.set_instance(line.instance);
          e.set_timestamp_unix_nanos(line.ts);
          e.set_text(line.text);
          return writer->Write(e);
        },
        [&] { return ctx->IsCancelled() || Stopping(); });
    return grpc::Status::OK;
  }

  // ---- desired state, reports, reaping ----

  void ApplyAssignment(const v1::Assignment& a) {
    if (!a.data_key().empty() && proclet_host)
      proclet_host->SetDataKey(a.data_key());
    std::vector<std::pair<FunctionSpec, uint32_t>> wanted;
    {
      std::lock_guard<std::mutex> l(mu);
      std::set<std::string> keys;
      for (const auto& spec : a.functions()) {
        std::string key = Key(spec.namespace_(), spec.name());
        keys.insert(key);
        auto it = pools.find(key);
        if (it != pools.end() &&
            it->second->spec.generation() == spec.generation()) {
          if (spec.min_instances() < it->second->min_instances)
            it->second->trim = true;
          it->second->min_instances = spec.min_instances();
        }
        wanted.emplace_back(spec, spec.min_instances());
      }
      // Functions no longer assigned here (deleted or updated): drop their idle
      // instances.
      for (auto it = pools.begin(); it != pools.end();) {
        if (!keys.contains(it->first)) {
          it = pools.erase(it);
        } else {
          ++it;
        }
      }
      have_assignment = true;
    }
    // Snapshots of versions that no longer exist go.
    std::set<std::string> ids;
    for (const auto& spec : a.functions()) ids.insert(SnapshotIdOf(spec));
    CollectImages(ids);
    for (auto& [spec, min] : wanted) {
      auto bundle = EnsureBundle(spec.bundle_digest());
      if (!bundle.ok()) {
        logs.Append(Key(spec.namespace_(), spec.name()), "invoker",
                    absl::StrCat("silt: ", bundle.status().message()));
        continue;
      }
      auto pool = PoolFor(spec, *bundle);
      std::lock_guard<std::mutex> l(mu);
      if (min < pool->min_instances) pool->trim = true;
      pool->min_instances = min;  // the reaper loop starts what is missing
    }
  }

  void DeleteSnapshots(const v1::DeleteSnapshots& d) {
    for (const auto& id : d.ids()) DropImage(id, "");
  }

  // Starts instances until the pool has its minimum.
  void Fill(std::shared_ptr<Pool> pool) {
    while (!Stopping()) {
      {
        std::lock_guard<std::mutex> l(mu);
        int total =
            pool->busy + pool->starting + static_cast<int>(pool->idle.size());
        if (total >= static_cast<int>(pool->min_instances) ||
            total >= MaxInstances(pool->spec))
          return;
        ++pool->starting;
        ++pool->filling;
      }
      auto inst = StartFresh(pool);
      std::lock_guard<std::mutex> l(mu);
      --pool->starting;
      --pool->filling;
      if (!inst.ok()) {
        pool->cv.notify_all();
        logs.Append(Key(pool->spec.namespace_(), pool->spec.name()), "invoker",
                    absl::StrCat("silt: ", inst.status().message()));
        return;
      }
      (*inst)->last_used = Clock::now();
      pool->idle.push_back(*std::move(inst));
      pool->cv.notify_one();
    }
  }

  std::chrono::milliseconds IdleTimeout(const FunctionSpec& spec) {
    if (auto it = spec.labels().find("com.openfaas.scale.zero-duration");
        it != spec.labels().end())
      if (auto d = ParseDuration(it->second)) return *d;
    return options.idle_timeout;
  }

  void ReapLoop() {
    while (true) {
      {
        std::unique_lock<std::mutex> l(stop_mu);
        if (stop_cv.wait_for(l, std::chrono::milliseconds(100),
                             [&] { return stopping; }))
          return;
      }
      std::vector<std::unique_ptr<Instance>> doomed;
      {
        std::lock_guard<std::mutex> l(mu);
        doomed.swap(graveyard);
        auto now = Clock::now();
        for (auto& [key, pool] : pools) {
          auto idle_for = IdleTimeout(pool->spec);
          // Oldest-idle first; keep the pool's minimum.
          std::sort(pool->idle.begin(), pool->idle.end(),
                    [](const auto& a, const auto& b) {
                      return a->last_used > b->last_used;
                    });
          while (
              !pool->idle.empty() &&
              pool->idle.size() + pool->busy > pool->min_instances &&
              (pool->trim || now - pool->idle.back()->last_used > idle_for)) {
            doomed.push_back(std::move(pool->idle.back()));
            pool->idle.pop_back();
          }
          pool->trim = false;
          // Idle instances that died on their own are replaced on demand.
          for (auto it = pool->idle.begin(); it != pool->idle.end();) {
            if ((*it)->proc->Poll()) {
              logs.Append(
                  key, (*it)->id,
                  absl::StrCat("silt: idle instance ", (*it)->id, " ended"));
              doomed.push_back(std::move(*it));
              it = pool->idle.erase(it);
            } else {
              ++it;
            }
          }
        }
      }
      doomed.clear();  // kills outside the lock
      std::vector<std::shared_ptr<Pool>> short_pools;
      {
        std::lock_guard<std::mutex> l(mu);
        for (auto& [key, pool] : pools) {
          int total =
              pool->busy + pool->starting + static_cast<int>(pool->idle.size());
          if (total < static_cast<int>(pool->min_instances))
            short_pools.push_back(pool);
        }
      }
      for (auto& pool : short_pools) Fill(pool);
      TendTemplates();
    }
  }

  LoadPulse::Sample PulseSample() {
    LoadPulse::Sample s;
    s.at = Clock::now();
    s.cores = Cores();
    s.cpu_nanos = node_cgroup->CpuUsageNanos();
    // Which part of it was not Silt's matters only on a busy node: below a
    // quarter of its cores, count it all as the instances' (reading every
    // instance's cgroup each sample is most of a pulse's cost).
    double secs = std::chrono::duration<double>(s.at - last_sample.at).count();
    bool loaded =
        last_sample.at == Clock::time_point() || secs <= 0 ||
        s.cpu_nanos < last_sample.cpu_nanos ||
        (s.cpu_nanos - last_sample.cpu_nanos) / 1e9 / secs > 0.25 * s.cores;
    s.instances_cpu_nanos = loaded ? node_cgroup->InstancesCpuNanos()
                                   : last_sample.instances_cpu_nanos +
                                         (s.cpu_nanos - last_sample.cpu_nanos);
    s.instances_cpu_nanos = std::min(s.instances_cpu_nanos, s.cpu_nanos);
    s.memory = MemoryCapacity();
    s.memory_used = node_cgroup->MemoryUsageBytes() +
                    proclet_host->shard_bytes() + proclet_host->spare_bytes();
    std::lock_guard<std::mutex> l(mu);
    s.tasks = tasks_running;
    for (const auto& [key, pool] : pools)
      s.busy += static_cast<uint32_t>(pool->busy);
    last_sample = s;
    return s;
  }

  uint64_t MemoryCapacity() const {
    struct sysinfo si;
    if (options.memory_bytes > 0) return options.memory_bytes;
    if (sysinfo(&si) == 0)
      return static_cast<uint64_t>(si.totalram) * si.mem_unit;
    return 0;
  }

  v1::InstanceCount CountLocked(const Pool& pool) {
    v1::InstanceCount c;
    c.set_name(pool.spec.name());
    c.set_namespace_(pool.spec.namespace_());
    c.set_generation(pool.spec.generation());
    c.set_ready(static_cast<uint32_t>(pool.idle.size() + pool.busy));
    c.set_busy(static_cast<uint32_t>(pool.busy));
    return c;
  }

  v1::LoadReport Report(uint64_t seq) {
    v1::LoadReport r;
    r.set_seq(seq);
    std::lock_guard<std::mutex> l(mu);
    uint64_t mem = 0;
    for (const auto& [key, pool] : pools) {
      *r.add_instances() = CountLocked(*pool);
      for (const auto& inst : pool->idle)
        mem += inst->proc->cgroup().MemoryUsage();
    }
    for (const auto& [key, pool] : pools)
      if (pool->tmpl) mem += pool->tmpl->inst->proc->cgroup().MemoryUsage();
    uint64_t shard_bytes = 0;
    for (auto& info : proclet_host->Shards()) {
      shard_bytes += info.bytes();
      *r.add_shards() = std::move(info);
    }
    r.set_shard_bytes(shard_bytes);
    r.set_state_ops(proclet_host->ops());
    r.set_tasks(tasks_running);
    {
      uint64_t cpu = node_cgroup->CpuUsageNanos();
      auto now = Clock::now();
      double secs = std::chrono::duration<double>(now - cpu_sampled).count();
      if (cpu_sampled != Clock::time_point() && secs > 0 && cpu >= cpu_nanos)
        r.set_cpu_used((cpu - cpu_nanos) / 1e9 / secs);
      cpu_nanos = cpu;
      cpu_sampled = now;
    }
    // The spare arena counts too: placement must not promise it away.
    r.mutable_used()->set_memory_bytes(mem + shard_bytes +
                                       proclet_host->spare_bytes());
    std::set<std::string> resident;
    for (const auto& [key, pool] : pools)
      if (pool->tmpl) resident.insert(pool->tmpl->snapshot_id);
    auto held = ResidentByImageLocked();
    for (const auto& [id, m] : images) {
      auto* info = r.add_snapshots();
      info->set_id(id);
      info->set_name(m.function);
      info->set_namespace_(m.ns);
      info->set_generation(m.generation);
      info->set_bytes(m.bytes);
      info->set_created_unix(m.created_unix);
      info->set_checkpoint_ms(m.checkpoint_ms);
      info->set_template_resident(resident.contains(id));
      if (auto it = held.find(id); it != held.end()) {
        info->set_resident_bytes(it->second.first);
        info->set_restorer_staged(it->second.second);
      }
    }
    return r;
  }

  // Keeps a Connect stream to the gateway: register, report, apply assignments;
  // reconnects with backoff when the gateway goes away.
  void ConnectLoop() {
    int backoff_ms = 100;
    while (!Stopping()) {
      grpc::ClientContext ctx;
      connect_ctx = &ctx;
      if (Stopping()) break;
      auto stream = control->Connect(&ctx);
      v1::NodeMessage hello;
      auto* reg = hello.mutable_register_();
      reg->set_node_name(node_name);
      reg->set_address(address);
      reg->set_data_address(proclet_host->data_address());
      reg->set_call_address(call_port->address());
      reg->mutable_capacity()->set_cores(Cores());
      reg->mutable_capacity()->set_gpus(gpus);
      reg->mutable_capacity()->set_memory_bytes(MemoryCapacity());
      if (stream->Write(hello)) {
        backoff_ms = 100;
        std::atomic<bool> done{false};
        std::thread reader([&] {
          v1::GatewayMessage msg;
          while (stream->Read(&msg)) {
            if (msg.has_assignment()) ApplyAssignment(msg.assignment());
            if (msg.has_delete_snapshots())
              DeleteSnapshots(msg.delete_snapshots());
            if (msg.has_cluster()) SetCluster(msg.cluster());
          }
          done = true;
          std::lock_guard<std::mutex> l(stop_mu);
          stop_cv.notify_all();
        });
        uint64_t seq = 0;
        // CPU use over a CFS period (100 ms): a node cgroup at its CPU quota
        // is throttled for the rest of each period, and a shorter window can
        // read no use at all there (a hot node then looked cool for a
        // moment: RebalanceTest in CI with 20 ms).
        LoadPulse pulse(options.pulse_change, std::chrono::milliseconds(100));
        auto next_report = Clock::now();
        while (!done && !Stopping()) {
          auto now = Clock::now();
          bool pulses = options.pulse_interval > std::chrono::milliseconds(0);
          bool report = now >= next_report || !pulses;
          if (report) {
            v1::NodeMessage m;
            *m.mutable_report() = Report(++seq);
            next_report = now + options.report_interval;
            if (!stream->Write(m)) break;
          }
          if (pulses) {
            if (auto p = pulse.Next(PulseSample(), /*force=*/report)) {
              v1::NodeMessage m;
              *m.mutable_pulse() = *std::move(p);
              if (!stream->Write(m)) break;
            }
          }
          auto wait = pulses ? std::min<Clock::duration>(options.pulse_interval,
                                                         next_report - now)
                             : Clock::duration(options.report_interval);
          std::unique_lock<std::mutex> l(stop_mu);
          stop_cv.wait_for(l, wait, [&] { return stopping || done.load(); });
        }
        ctx.TryCancel();
        reader.join();
      }
      grpc::Status st = stream->Finish();
      connect_ctx = nullptr;
      if (!Stopping()) {
        fprintf(stderr,
                "silt-invoker: connection to the gateway at %s ended (%s); "
                "retrying in %d ms\n",
                options.gateway.c_str(), st.error_message().c_str(),
                backoff_ms);
      }
      std::unique_lock<std::mutex> l(stop_mu);
      stop_cv.wait_for(l, std::chrono::milliseconds(backoff_ms),
                       [&] { return stopping; });
      backoff_ms = std::min(backoff_ms * 2, 2000);
    }
  }
};

absl::Status PrepareProcess() {
  // A mount namespace of the invoker's own, into which the host's mounts
  // still propagate but from which none of the invoker's (instances' /tmp and
  // /dev, CRIU's binds) leak: they go with the namespace when the invoker dies,
  // even by SIGKILL, on every host.
  if (unshare(CLONE_NEWNS) != 0)
    return absl::FailedPreconditionError(
        absl::StrCat("no private mount namespace (", strerror(errno),
                     "): mounts made for instances outlive a killed invoker"));
  if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make the mount namespace a slave (", strerror(errno),
        "): mounts made for instances outlive a killed invoker"));
  // CRIU keeps its kernel-feature cache in /run: it needs a tmpfs there.
  struct statfs run;
  if (statfs("/run", &run) == 0 && run.f_type == TMPFS_MAGIC)
    return absl::OkStatus();
  if (mount("silt-run", "/run", "tmpfs", MS_NOSUID | MS_NODEV,
            "mode=0755,size=16m") != 0)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot mount a tmpfs on /run (", strerror(errno),
                     "): CRIU's kernel-feature cache is off"));
  return absl::OkStatus();
}

Invoker::Invoker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Invoker::~Invoker() = default;

absl::StatusOr<std::unique_ptr<Invoker>> Invoker::Start(
    const Options& options) {
  if (options.data_dir.empty())
    return absl::InvalidArgumentError("--data-dir is required");
  if (geteuid() != 0)
    return absl::PermissionDeniedError(
        "silt-invoker must run as root: instances run in namespaces and "
        "cgroups");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.worker_binary.empty()) {
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    impl->options.worker_binary = (self.parent_path() / "silt-worker").string();
  }
  if (access(impl->options.worker_binary.c_str(), X_OK) != 0)
    return absl::NotFoundError(
        absl::StrCat("silt-worker not found at ", impl->options.worker_binary));
  if (auto s = PrepareSeccomp(); !s.ok()) return s;
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir + "/bundles", ec);
  // Root's alone: images hold functions' memory, instances their secrets.
  // Sandboxes reach what they need through bind mounts, made as root.
  if (chmod(options.data_dir.c_str(), 0700) != 0)
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot make ", options.data_dir, " owner-only: ", strerror(errno)));
  // Sandboxes see a directory holding only silt-worker (CRIU cannot restore
  // file bind mounts, so the binary is not bound on its own).
  impl->worker_dir = options.data_dir + "/bin";
  std::filesystem::create_directories(impl->worker_dir, ec);
  std::filesystem::copy_file(
      impl->options.worker_binary, impl->worker_dir + "/silt-worker.tmp",
      std::filesystem::copy_options::overwrite_existing, ec);
  if (!ec)
    std::filesystem::rename(impl->worker_dir + "/silt-worker.tmp",
                            impl->worker_dir + "/silt-worker", ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot copy silt-worker into ", impl->worker_dir, ": ", ec.message()));
  }
  chmod(impl->worker_dir.c_str(), 0755);
  // silt-restorer (installed next to silt-worker) restores most images
  // without CRIU; without it every restore is CRIU's.
  std::string restorer =
      (std::filesystem::path(impl->options.worker_binary).parent_path() /
       "silt-restorer")
          .string();
  if (options.fast_restore && access(restorer.c_str(), X_OK) == 0) {
    std::filesystem::copy_file(
        restorer, impl->worker_dir + "/silt-restorer.tmp",
        std::filesystem::copy_options::overwrite_existing, ec);
    if (!ec)
      std::filesystem::rename(impl->worker_dir + "/silt-restorer.tmp",
                              impl->worker_dir + "/silt-restorer", ec);
    impl->fast_restore_on = !ec;
  }
  std::filesystem::remove_all(options.data_dir + "/instances",
                              ec);  // from a dead invoker
  std::filesystem::create_directories(options.data_dir + "/instances", ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat("data dir: ", ec.message()));

  {
    ProcletHostOptions po;
    po.data_listen = options.listen.substr(0, options.listen.rfind(':')) + ":0";
    Impl* p = impl.get();
    po.resolve =
        [p](const std::string& ns, const std::string& name, pv1::Kind kind,
            uint32_t initial_shards, uint64_t max_shard_bytes, bool create,
            const std::string& function) -> absl::StatusOr<pv1::Layout> {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
      pv1::Layout layout;
      grpc::Status st;
      if (create) {
        v1::OpenStructureRequest req;
        req.set_namespace_(ns);
        req.set_name(name);
        req.set_kind(kind);
        req.set_initial_shards(initial_shards);
        req.set_max_shard_bytes(max_shard_bytes);
        req.set_function(function);
        st = p->control->OpenStructure(&ctx, req, &layout);
      } else {
        v1::GetLayoutRequest req;
        req.set_namespace_(ns);
        req.set_name(name);
        st = p->control->GetLayout(&ctx, req, &layout);
      }
      if (!st.ok())
        return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                            st.error_message());
      return layout;
    };
    po.run_task = [p](const TaskTarget& t, std::string_view call) {
      return p->RunTask(t, call);
    };
    po.jobs = [p](const std::string& ns, const std::string& function,
                  std::string_view req) {
      if (!p->executor)
        return Error(wire::StateCode::kUnavailable, "the node is starting");
      return p->executor->Handle(ns, function, req);
    };
    auto host = ProcletHost::Start(std::move(po));
    if (!host.ok()) return host.status();
    impl->proclet_host = *std::move(host);
    impl->proclet_service =
        std::make_unique<ProcletService>(impl->proclet_host.get());
  }
  {
    Impl* p = impl.get();
    auto port = CallPort::Listen(
        options.listen.substr(0, options.listen.rfind(':')) + ":0",
        impl->proclet_host->data_key(),
        [p](call_wire::Request& req, call_wire::Reply* reply,
            ReplyStream& stream) { p->Call(req, reply, stream); });
    if (!port.ok()) return port.status();
    impl->call_port = *std::move(port);
  }

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(),
                           &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // see nodes.cc
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  // Invoke handlers block while their instance works: keep the handler threads
  // instead of letting gRPC's sync server create and destroy one per burst
  // (measured: thread churn was the invoker's largest cost under concurrent
  // load).
  builder.SetSyncServerOption(
      grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(
      grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 256);
  builder.RegisterService(impl.get());
  builder.RegisterService(impl->proclet_service.get());
  impl->server = builder.BuildAndStart();
  if (!impl->server || port == 0)
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen));
  impl->address = options.listen.substr(0, options.listen.rfind(':')) + ":" +
                  std::to_string(port);
  impl->node_name = options.node_name;
  if (impl->node_name.empty()) {
    char host[64] = {0};
    gethostname(host, sizeof(host) - 1);
    impl->node_name = absl::StrCat(absl::AsciiStrToLower(host), "-", port);
  }
  // Cgroups are named after this data dir's stable id, not the node name: a
  // restarted invoker finds (and cleans up) exactly what its predecessor left,
  // and two invokers on one machine never touch each other's instances.
  {
    std::string id_file = options.data_dir + "/node-id";
    std::ifstream in(id_file);
    std::getline(in, impl->cgroup_id);
    if (impl->cgroup_id.empty()) {
      impl->cgroup_id = RandomId(12);
      std::ofstream(id_file) << impl->cgroup_id << "\n";
    }
  }
  CleanupStaleCgroups("silt/" + impl->cgroup_id);
  {
    auto cg =
        NodeCgroup::Create("silt/" + impl->cgroup_id, options.memory_bytes,
                           uint64_t{options.cpus} * 1000);
    if (!cg.ok())
      return absl::Status(
          cg.status().code(),
          absl::StrCat("cannot enforce the node's capacity (--cpus, --memory) "
                       "on its instances: ",
                       cg.status().message()));
    impl->node_cgroup = *std::move(cg);
    if (options.cpus > 0 || options.memory_bytes > 0)
      fprintf(stderr,
              "silt-invoker: instances limited together to %s CPU(s) and %s "
              "MiB of memory (cgroup %s)\n",
              options.cpus > 0 ? std::to_string(options.cpus).c_str() : "all",
              options.memory_bytes > 0
                  ? std::to_string(options.memory_bytes >> 20).c_str()
                  : "all",
              impl->node_cgroup->memory_dir().c_str());
  }
  if (auto favored = FavorCgroupMoves(); favored.ok())
    fprintf(stderr, "silt-invoker: fast cgroup moves (favordynmods) on %s\n",
            favored->c_str());
  else
    fprintf(stderr,
            "silt-invoker: cgroup moves may wait for RCU (each instance start "
            "can take milliseconds longer): %s\n",
            std::string(favored.status().message()).c_str());
  impl->snapshot_dir = options.data_dir + "/snapshots";
  impl->working_set_dir = options.data_dir + "/working-sets";
  impl->root_skeleton = options.data_dir + "/root";
  if (auto s = PrepareRootSkeleton(impl->root_skeleton); !s.ok()) return s;
  impl->dev_dir = options.data_dir + "/dev";
  if (auto s = PrepareDevDir(impl->dev_dir); s.ok()) {
    impl->bind_dev_tmp = true;
  } else {
    fprintf(stderr, "silt-invoker: no instance can start: %s\n",
            std::string(s.message()).c_str());
  }
  if (options.snapshots) {
    auto v = snapshot::CriuVersion();
    if (v.ok()) {
      impl->criu_version = *v;
      impl->snapshots_on = true;
      impl->LoadImages();
    } else {
      fprintf(stderr,
              "silt-invoker: snapshots off (instances always boot): %s\n",
              std::string(v.status().message()).c_str());
    }
  }
  impl->collector = std::make_unique<LogCollector>(&impl->logs);
  if (auto sl = SeccompLog::Start(); sl.ok())
    impl->seccomp_log = *std::move(sl);
  else
    fprintf(stderr,
            "silt-invoker: instances killed by seccomp after a restore or "
            "fork are reported as killed: %s\n",
            std::string(sl.status().message()).c_str());
  if (auto devices = gpu::ListDevices(); devices.ok())
    impl->gpus = static_cast<uint32_t>(devices->size());

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  impl->gateway_channel = grpc::CreateCustomChannel(
      options.gateway, grpc::InsecureChannelCredentials(), args);
  impl->control = v1::Control::NewStub(impl->gateway_channel);
  Impl* p = impl.get();
  {
    ExecutorOptions eo;
    eo.node_name = impl->node_name;
    eo.data_address = impl->proclet_host->data_address();
    eo.run_local = [p](const TaskTarget& t, std::string_view call) {
      return p->RunTask(t, call);
    };
    eo.state = [p](const std::string& ns, const std::string& function,
                   std::string_view req) {
      return p->proclet_host->Serve(ns, function, req);
    };
    eo.layout = [p](const std::string& ns,
                    const std::string& name) -> absl::StatusOr<pv1::Layout> {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
      v1::GetLayoutRequest req;
      req.set_namespace_(ns);
      req.set_name(name);
      pv1::Layout layout;
      grpc::Status st = p->control->GetLayout(&ctx, req, &layout);
      if (!st.ok())
        return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                            st.error_message());
      return layout;
    };
    eo.hello = [p] { return p->proclet_host->Hello(); };
    eo.target = [p](const std::string& ns, const std::string& function) {
      return p->TargetOf(ns, function);
    };
    eo.view = &impl->cluster;
    impl->executor = std::make_unique<Executor>(std::move(eo));
  }
  impl->connector = std::thread([p] { p->ConnectLoop(); });
  impl->reaper = std::thread([p] { p->ReapLoop(); });
  impl->tender = std::thread([p] { p->TendLoop(); });
  return std::unique_ptr<Invoker>(new Invoker(std::move(impl)));
}

std::string Invoker::listen_address() const { return impl_->address; }
std::string Invoker::node_name() const { return impl_->node_name; }

absl::Status Invoker::Drain(std::chrono::milliseconds timeout) {
  Impl& im = *impl_;
  uint64_t n = 0, bytes = 0;  // proclets held here
  auto count_held = [&] {
    n = bytes = 0;
    for (const auto& s : im.proclet_host->Shards()) {
      ++n;
      bytes += s.bytes();
    }
  };
  count_held();
  fprintf(stderr,
          "silt-invoker: draining: asking the gateway to move the %llu "
          "proclet(s) held here (%llu bytes) to other nodes (at most %lld "
          "ms)\n",
          static_cast<unsigned long long>(n),
          static_cast<unsigned long long>(bytes),
          static_cast<long long>(timeout.count()));
  auto start = Clock::now();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  {
    std::lock_guard<std::mutex> l(im.stop_mu);
    if (im.stopping) return absl::CancelledError("the invoker is stopping");
    im.drain_ctx = &ctx;
  }
  v1::DrainRequest req;
  req.set_node_name(im.node_name);
  v1::DrainReply res;
  grpc::Status st = im.control->Drain(&ctx, req, &res);
  {
    std::lock_guard<std::mutex> l(im.stop_mu);
    im.drain_ctx = nullptr;
  }
  double ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  // What is still here is what the node takes with it.
  count_held();
  absl::Status out;
  if (!st.ok()) {
    out = absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                       absl::StrCat("the gateway did not drain this node: ",
                                    st.error_message()));
  } else if (n > 0) {
    out = res.reason_code() != 0
              ? absl::Status(static_cast<absl::StatusCode>(res.reason_code()),
                             res.reason())
              : absl::UnavailableError("proclets are still held here");
  }
  if (out.ok()) {
    fprintf(stderr,
            "silt-invoker: drained: %u proclet(s) (%llu bytes) moved to other "
            "nodes in %.0f ms; none left here\n",
            res.moved(), static_cast<unsigned long long>(res.moved_bytes()),
            ms);
  } else if (n == 0) {
    fprintf(stderr, "silt-invoker: drain: %s (no proclets held here)\n",
            std::string(out.message()).c_str());
    out = absl::OkStatus();  // nothing to lose
  } else {
    fprintf(stderr,
            "silt-invoker: drain incomplete after %.0f ms: %u proclet(s) "
            "moved; %llu proclet(s) (%llu bytes) are still here and WILL BE "
            "LOST when this node stops: %s\n",
            ms, res.moved(), static_cast<unsigned long long>(n),
            static_cast<unsigned long long>(bytes),
            std::string(out.message()).c_str());
  }
  return out;
}

void Invoker::Wait() {
  std::unique_lock<std::mutex> l(impl_->stop_mu);
  impl_->stop_cv.wait(l, [this] { return impl_->stopping; });
}

void Invoker::Shutdown() {
  {
    std::lock_guard<std::mutex> l(impl_->stop_mu);
    impl_->stopping = true;
    if (impl_->drain_ctx) impl_->drain_ctx->TryCancel();
  }
  if (impl_->proclet_host) impl_->proclet_host->StopMoves();
  impl_->stop_cv.notify_all();
}

}  // namespace silt::invoker
