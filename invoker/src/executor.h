// Compute jobs of this node's instances (silt/function.h ParallelFor, Map,
// Spawn). A job's work is cut into compute proclets, shares of its input's
// elements, that run in instances of the same function (each in its own
// sandbox) on the nodes with CPU to spare, this one included, preferring the
// node that holds a share's data. Shares are sized to about kShareTarget of
// work at each node's measured pace and handed out as that node's slots free
// up, so a node that slows down (a hog, its capacity lowered) takes less and
// the rest of the range goes to the others; nothing is pinned to a node.
// When a node is lost mid-share, the share runs again elsewhere if the job
// allows it (a Map always does), else the job fails saying so.
//
// Thread safety: thread-safe. The job table has its own lock; each job owns
// its state under its own, and runs on a thread of its own (plus one per
// share in flight).
#ifndef SILT_INVOKER_EXECUTOR_H_
#define SILT_INVOKER_EXECUTOR_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cluster_view.h"
#include "invoker/proto/proclets.pb.h"
#include "peer_wire.h"

namespace silt::invoker {

struct ExecutorOptions {
  std::string node_name;
  std::string data_address;  // this node's: its shares run here directly
  // Runs a share in an instance here (the data port's kRunTask does the same
  // for peers).
  TaskRunner run_local;
  // Serves a state request as an instance of the function would (sizes of
  // inputs, growing outputs).
  std::function<std::string(const std::string& ns, const std::string& function,
                            std::string_view request)>
      state;
  // A structure's layout, without creating it: NotFound when absent.
  std::function<absl::StatusOr<proclets::v1::Layout>(const std::string& ns,
                                                     const std::string& name)>
      layout;
  // The first frame of a connection to a peer (empty: no peer can be used).
  std::function<std::string()> hello;
  // The function's current version here and how long one share may take.
  std::function<TaskTarget(const std::string& ns, const std::string& function)>
      target;
  const ClusterView* view = nullptr;  // must outlive the executor
  // Work per share at a node's measured pace.
  std::chrono::milliseconds share_target{20};
};

class Executor {
 public:
  explicit Executor(ExecutorOptions options);
  ~Executor();  // fails the jobs still running and waits for their threads
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Serves kJobStart and kJobWait for an instance of `function`; the reply
  // (silt/state_wire.h). Blocks only in kJobWait, at most its timeout.
  std::string Handle(const std::string& ns, const std::string& function,
                     std::string_view request);

  // Jobs started here that have not ended.
  size_t running() const;

 private:
  struct Job;
  std::string Start(const std::string& ns, const std::string& function,
                    std::string_view request);
  std::string Wait(const std::string& ns, std::string_view request);
  struct Piece;
  // A job's input cut into pieces, and its total size in their units; or
  // the error reply.
  std::string VectorPieces(Job& job, uint64_t first, uint64_t count,
                           std::deque<Piece>* pieces, uint64_t* total);
  std::string MapPieces(Job& job, uint64_t first, uint64_t count,
                        std::deque<Piece>* pieces, uint64_t* total);
  // How a share went: its reply, or that it never reached the node, or that
  // the node was lost after it was sent (it may have run in part).
  struct Outcome {
    enum How { kReplied, kNotSent, kBroken } how = kReplied;
    std::string reply;
  };
  void Run(std::shared_ptr<Job> job);
  void RunShares(std::shared_ptr<Job> job, std::string node);
  Outcome RunShare(Job& job, const std::string& node, std::string_view call);
  // Under the job's lock.
  Piece Take(Job& job, const std::string& node);
  void Account(Job& job, const std::string& node, const Piece& share,
               const Outcome& out, double secs);

  const ExecutorOptions options_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  // Each job's thread, by job id, and those that have ended (to join).
  std::map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> ended_threads_ ABSL_GUARDED_BY(mu_);

  PeerPool peers_;  // to the nodes that run shares
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_EXECUTOR_H_
