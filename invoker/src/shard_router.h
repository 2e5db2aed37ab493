// How an instance's state request reaches its shards: the request names a
// structure (ns/name) and a key or index; the router finds the shard covering
// it in a cached layout (from the gateway's directory through the resolver
// callback) and runs the operation on the shard here, or sends it over a
// pooled connection to the data port of the node holding it. A MOVED reply
// from a shard's old home patches the cached layout; an unreachable node or a
// layout gone stale sends it back to the directory. Operations on many
// shards (sizes, multi-get/put, ranges) are split and their answers joined.
//
// Thread safety: thread-safe. The router owns the layout cache and the pool
// of idle peer connections, each under its own mutex (neither held while
// sending); the shards held here stay in the ShardTable it was given.
#ifndef SILT_INVOKER_SHARD_ROUTER_H_
#define SILT_INVOKER_SHARD_ROUTER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "invoker/proto/proclets.pb.h"
#include "peer_wire.h"
#include "proclet_host.h"
#include "shard_table.h"
#include "silt/state_wire.h"
#include "state_loop.h"

namespace silt::invoker {

class ShardRouter {
 public:
  // The directory (see ProcletHostOptions::resolve).
  using Resolver = decltype(ProcletHostOptions::resolve);

  // `self` is this node's data address: shards located there are run on
  // `shards` without a network hop. `shards` and `key` must outlive the
  // router.
  ShardRouter(Resolver resolve, std::string self, ShardTable& shards,
              const DataKey& key);
  ShardRouter(const ShardRouter&) = delete;
  ShardRouter& operator=(const ShardRouter&) = delete;

  // The state loop's fast path: an operation on one shard whose location is
  // cached, answered here if the shard is here (without waiting), else
  // forwarded to its node. Everything else: kSlow (HandleInstance).
  StateLoopBackend::Fast Fast(const std::string& ns, std::string_view req);
  // kShareMap: the memory files of ns/name's map shards held here, for the
  // instance to read them in place. Their windows say what it may answer.
  StateLoopBackend::Shared Share(const std::string& ns, std::string_view req);
  // Serves one request of an instance of `function` (namespace ns) fully,
  // asking the directory and following moves as needed (blocks). Returns the
  // reply.
  std::string HandleInstance(const std::string& ns, const std::string& function,
                             std::string_view req);
  // An answer the instance can have as it is (not MOVED, not a node that
  // could not be reached: those go the slow way, which follows them).
  static bool IsFinal(std::string_view reply);

  // Forget the cached layout of one structure (it was deleted or changed).
  void ForgetLayout(const std::string& ns, const std::string& name);

 private:
  static std::string LayoutKey(std::string_view ns, std::string_view name);
  absl::StatusOr<std::shared_ptr<const pv1::Layout>> GetLayout(
      const std::string& ns, const std::string& name, wire::StateKind kind,
      bool refresh);
  // After MOVED(to, epoch): patch the cached location without asking the
  // gateway.
  void Relocate(const std::string& ns, const std::string& name, uint64_t id,
                const std::string& to, uint64_t epoch);

  // Sends one shard request (already built) to loc. Sets *ambiguous when the
  // request left but no answer came: it may have been applied, so the caller
  // must not send it again.
  std::string Send(const pv1::ShardLocation& loc, const std::string& req,
                   bool* ambiguous);
  static std::string ShardRequest(uint64_t id, uint64_t hint, wire::StateOp op,
                                  std::string_view args);
  static const pv1::ShardLocation* Covering(const pv1::Layout& l,
                                            uint64_t hint);

  // Routes a request for the shard covering `hint`, following MOVED and
  // refreshing the layout as needed.
  std::string Route(const std::string& ns, const std::string& name,
                    wire::StateKind kind, uint64_t hint, wire::StateOp op,
                    std::string_view args);
  // Sums a count over every shard of the structure (kMapSize, kQueueSize).
  std::string SumOverShards(const std::string& ns, const std::string& name,
                            wire::StateKind kind, wire::StateOp op);
  // Multi-get/put: one request per shard holding some of the keys.
  std::string MultiOp(const std::string& ns, const std::string& name,
                      wire::StateOp op, std::string_view args);
  std::string RangeOp(const std::string& ns, const std::string& name,
                      std::string_view args);
  // kMapScan over the shards covering its hash range, each asked for its
  // part of the batch; joined in position order up to where every shard's
  // answer is complete.
  std::string ScanOp(const std::string& ns, const std::string& name,
                     std::string_view args);
  // Sets consecutive elements: one request per shard they fall in.
  std::string SetRangeOp(const std::string& ns, const std::string& name,
                         std::string_view args);

  const Resolver resolve_;
  const std::string self_;
  ShardTable& shards_;

  absl::Mutex layouts_mu_;
  std::map<std::string, std::shared_ptr<const pv1::Layout>> layouts_
      ABSL_GUARDED_BY(layouts_mu_);

  PeerPool peers_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_SHARD_ROUTER_H_
