// How invokers talk to each other's data ports: the frames (each a
// frames.h length-prefixed payload that starts with a PeerOp), dialing a
// peer, and the cluster's key that opens every connection.
//
// Peers prove they belong to the cluster with a key the gateway hands out, so
// that arenas received in a migration can be taken without an O(entries)
// check inside its pause.
#ifndef SILT_INVOKER_PEER_WIRE_H_
#define SILT_INVOKER_PEER_WIRE_H_

#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "frames.h"
#include "silt/state_wire.h"

namespace silt::invoker {

// Frames on the data port.
enum class PeerOp : uint8_t {
  kShardOp = 1,       // u64 id, u64 hint, then a StateOp and its arguments
  kMigrateBegin = 2,  // str ShardInfo, u64 bytes the arena has; no reply
  // 3 was a chunk with its bytes inside the frame (before kMigrateBytes).
  kMigrateCommit = 4,  // u64 new_used -> code
  kMigrateSync = 5,    // -> code, once every earlier chunk is applied
  kHello = 6,          // str key: the first frame of every connection
  // u64 offset, u64 new_used, u64 length; then `length` bytes of the arena
  // follow the frame, unframed (the target reads them straight into its
  // arena). No reply.
  kMigrateBytes = 7,
  // A compute proclet's share of a job, run here by an instance of the
  // function: str namespace, str function, u64 generation (0: the current
  // one), u32 timeout_ms, str task call (silt/state_wire.h TaskCall) -> the
  // task's reply (a StateCode byte, then its result or error; kRetry when
  // nothing ran here: the function is not here, or no instance is free).
  kRunTask = 8,
  // A GPU proclet's request (gpu_proclets.h): str namespace, str function,
  // str name, u64 memory_limit, str request (a GpuOp and its arguments), u8
  // placed (1: the directory just placed it here: start it if absent), str
  // backend (where it placed it: "cuda", "host", "" = the node's) ->
  // its reply, or kMoved (str address, u64 0) when it moved away (address
  // "": not here; ask the directory).
  kGpu = 9,
  // A GPU proclet moving here, a conversation on this connection: str
  // namespace, str function, str name, u64 memory_limit, str backend ("" =
  // this node's) -> code (its process is started, not yet serving). Then
  // frames u8 GpuAdoptStep, u64 n, each followed by n bytes of its state (a
  // GpuState part, silt/gpu_wire.h), unframed: kPart (no reply: the
  // pre-copy, the proclet still running at the source), kFlush (n = 0) ->
  // code once every part so far is applied (the first failure of any), then
  // kCommit (the pause's delta) -> code (likewise), str backend, str device,
  // u64 inject_us; from then on it serves here. The connection ending before
  // kCommit's reply leaves nothing here.
  kGpuAdopt = 10,
};

enum class GpuAdoptStep : uint8_t { kPart = 1, kCommit = 2, kFlush = 3 };

// Which function's instance runs a task (PeerOp::kRunTask), and for how long
// at most.
struct TaskTarget {
  std::string ns, function;
  uint64_t generation = 0;  // 0: the version this node has
  uint32_t timeout_ms = 60000;
};

// Runs a task call in an instance of target's function on this node; returns
// the task's reply (see PeerOp::kRunTask). Blocks until it is done.
using TaskRunner =
    std::function<std::string(const TaskTarget& target, std::string_view call)>;

// The rest of a conversation on a data connection, for a handler that reads
// and answers more than one frame (kGpuAdopt).
struct PeerStream {
  std::function<absl::Status(std::string* frame)> next;
  // Bytes that follow a frame, unframed.
  std::function<absl::Status(char* dst, size_t n)> read_raw;
  std::function<absl::Status(std::string_view reply)> reply;
};

// Serves the GPU proclet frames of peers (gpu_proclets.h): kGpu (after its
// op byte; the reply), and kGpuAdopt (after its op byte; the conversation's
// last reply, empty to drop the connection).
struct GpuPeerHandlers {
  std::function<std::string(wire::Reader& frame)> serve;
  std::function<std::string(wire::Reader& frame, PeerStream& stream)> adopt;
};

// A kRunTask frame, and reading one (after its op byte); false when malformed.
std::string RunTaskFrame(const TaskTarget& target, std::string_view call);
bool ReadRunTask(wire::Reader& r, TaskTarget* target, std::string_view* call);

// "host:port" split in two. InvalidArgument when it is not one.
absl::StatusOr<std::pair<std::string, uint16_t>> SplitHostPort(
    const std::string& addr);

// A TCP connection (TCP_NODELAY, close-on-exec) to an IPv4 host:port.
// InvalidArgument for a bad address, Unavailable when it cannot be reached.
absl::StatusOr<int> Dial(const std::string& addr);

// A connection to a peer's data port; closes its fd. Not thread-safe: one
// user at a time.
struct PeerConn {
  int fd = -1;
  std::unique_ptr<FrameReader> reader;
  ~PeerConn() {
    if (fd >= 0) close(fd);
  }
};

// Idle connections to peers' data ports, by address, for reuse. Take() hands
// out a pooled connection whose peer is still there, or dials a new one and
// sends the hello frame first. Thread-safe.
class PeerPool {
 public:
  // `hello`: the first frame of a new connection (empty: none can be made
  // yet). `max_idle`: connections kept per address.
  PeerPool(std::function<std::string()> hello, size_t max_idle)
      : hello_(std::move(hello)), max_idle_(max_idle) {}
  // Null when the peer cannot be reached (or no hello is known yet).
  std::unique_ptr<PeerConn> Take(const std::string& addr);
  // A connection that answered its last request in full.
  void Give(const std::string& addr, std::unique_ptr<PeerConn> c);

 private:
  const std::function<std::string()> hello_;
  const size_t max_idle_;
  absl::Mutex mu_;
  std::map<std::string, std::vector<std::unique_ptr<PeerConn>>> idle_
      ABSL_GUARDED_BY(mu_);
};

// Raises the calling thread's CPU priority (nice -10) until destroyed, then
// puts it back: for the threads that move a shard, at both ends, so that the
// copy keeps its pace on cores the shard's own writers keep busy (a slower
// copy gives them more to dirty, and every round resends that; measured on
// 2 cores with 4 writers: 10 MiB moves 2.3-3.3x -> 1.4-1.9x the plain copy,
// writers' p99.9 2-3 -> 4-7 ms during the moves). Best effort: unchanged
// without the privilege.
class MigrationPriority {
 public:
  MigrationPriority();
  ~MigrationPriority();
  MigrationPriority(const MigrationPriority&) = delete;
  MigrationPriority& operator=(const MigrationPriority&) = delete;

 private:
  int tid_;
  int old_ = 0;
  bool changed_ = false;
};

// Runs the calling thread at real-time priority (SCHED_FIFO) until
// destroyed, then as before: for the final round of a migration, at both
// ends, where writes are held. That round is short and mostly waits on the
// other end; what would stretch it is the wait to be scheduled again on
// cores the shard's writers keep busy (up to a scheduler slice, ms). Best
// effort: unchanged without the privilege.
class RealtimeSection {
 public:
  RealtimeSection();
  ~RealtimeSection();
  RealtimeSection(const RealtimeSection&) = delete;
  RealtimeSection& operator=(const RealtimeSection&) = delete;

 private:
  int policy_;
  sched_param param_{};
  bool changed_ = false;
};

// The cluster's data-port key (from the gateway). Thread-safe.
class DataKey {
 public:
  void Set(const std::string& key);
  // The first frame of a connection to a peer; empty until the key is known.
  std::string Hello() const;
  // Whether `key` is the cluster's key (compared in constant time). Until
  // the key is known it waits for it, up to kKeyWait, then says false.
  bool Matches(std::string_view key) const;
  static constexpr absl::Duration kKeyWait = absl::Seconds(5);

 private:
  mutable absl::Mutex mu_;
  std::string key_ ABSL_GUARDED_BY(mu_);
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_PEER_WIRE_H_
