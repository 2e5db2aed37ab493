// The proclet directory: every function namespace's sharded structures, which
// shards they have, which node holds each shard and at which epoch. It places
// new shards on the node with the most free memory, splits shards that grow
// past their structure's size limit, moves shards between nodes (live
// migration, driven here and carried out by the invokers), and marks the shards
// of a node that died without handing them over as lost. Persisted in the
// store's proclets table, so it survives a gateway restart.
#ifndef SILT_GATEWAY_DIRECTORY_H_
#define SILT_GATEWAY_DIRECTORY_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/store.h"

namespace grpc {
class Channel;
}

namespace silt::gateway {

class Metrics;

enum class StructureKind { kMap = 1, kVector = 2, kQueue = 3 };
enum class ShardState { kActive = 1, kMigrating = 2, kLost = 3 };
std::string KindName(StructureKind k);
const char* ShardStateName(ShardState s);

struct ShardView {
  uint64_t id = 0;
  std::string ns, structure;
  StructureKind kind = StructureKind::kMap;
  uint64_t lo = 0, hi = 0;
  std::string node, data_address;
  uint64_t epoch = 0;
  uint64_t bytes = 0, count = 0;
  ShardState state = ShardState::kActive;
};

struct StructureView {
  std::string ns, name;
  StructureKind kind = StructureKind::kMap;
  uint64_t max_shard_bytes = 0;
  uint64_t version = 0;
  std::vector<std::string> functions;  // that have used it
  std::vector<ShardView> shards;
  uint64_t bytes() const;
  uint64_t count() const;
};

// A live node as the directory needs it.
struct DirectoryNode {
  std::string name;
  std::string data_address;
  uint64_t memory = 0;       // capacity
  uint64_t memory_used = 0;  // instances + shards, as last reported
  std::shared_ptr<grpc::Channel> channel;
  bool leaving = false;  // asked to be drained before it stops: place nothing
};

struct MigrationResult {
  uint64_t id = 0;
  std::string from, to;
  uint64_t epoch = 0, bytes = 0;
  double total_ms = 0, pause_ms = 0;
  uint32_t rounds = 0;
};

struct DrainOptions {
  // No migration starts after this, and none runs past it.
  std::chrono::system_clock::time_point deadline =
      std::chrono::system_clock::time_point::max();
  // Checked between migrations: true stops the drain (the caller gave up).
  std::function<bool()> cancelled;
};

struct DrainResult {
  std::vector<MigrationResult> moved;
  // Proclets still on the node, their bytes, and why the first of them did
  // not move (OK when none is left).
  std::vector<uint64_t> left;
  uint64_t left_bytes = 0;
  absl::Status reason;
};

struct DirectoryOptions {
  // A shard splits once its arena passes this (a migration of this much takes
  // a few milliseconds here; see README). Per structure: StateOptions.
  uint64_t default_max_shard_bytes = 16ull << 20;
  uint32_t max_initial_shards = 64;
};

class Directory {
 public:
  using NodeSource = std::function<std::vector<DirectoryNode>()>;
  // `metrics` (may be null; outlives the directory) counts migrations.
  static absl::StatusOr<std::unique_ptr<Directory>> Open(
      store::Store* store, DirectoryOptions options, NodeSource nodes,
      Metrics* metrics = nullptr);
  ~Directory();

  // The structure, created (shards placed by free memory) when absent.
  // InvalidArgument: bad name/options; FailedPrecondition: another kind;
  // Unavailable: no node.
  absl::StatusOr<StructureView> OpenStructure(const std::string& ns,
                                              const std::string& name,
                                              StructureKind kind,
                                              uint32_t initial_shards,
                                              uint64_t max_shard_bytes,
                                              const std::string& function);
  // NotFound when absent.
  absl::StatusOr<StructureView> Get(const std::string& ns,
                                    const std::string& name);
  // Every structure of `ns` ("" = all namespaces).
  std::vector<StructureView> List(const std::string& ns);
  // Drops the structure's shards on their nodes and forgets it. NotFound.
  absl::Status Delete(const std::string& ns, const std::string& name);
  // Deletes every structure of a namespace.
  void DeleteNamespace(const std::string& ns);

  // Moves one shard to `node` (live). NotFound: no such shard or node;
  // FailedPrecondition: lost or already moving, or `node` is leaving;
  // InvalidArgument: already there.
  absl::StatusOr<MigrationResult> Migrate(uint64_t id, const std::string& node);
  // Moves every shard off `node` to the others: each to the node with the
  // most free memory, if it fits there. Nothing new is placed on `node` while
  // this runs (nor afterwards if the node is `leaving`). A shard that cannot
  // move (no other node, no room, a failed copy, the deadline) stays and the
  // drain goes on with the next; the result lists what stayed. NotFound: no
  // connected node of that name.
  absl::StatusOr<DrainResult> Drain(const std::string& node,
                                    const DrainOptions& options = {});

  // From a node's load report: the shards it holds (id, bytes, count).
  struct Held {
    uint64_t id, bytes, count, epoch;
    uint64_t lo, hi;  // the range the node serves with it
    std::string ns, structure;
  };
  // A node's load report: the shards it holds. What the directory missed is
  // recorded as the node has it: a shard the directory places elsewhere but
  // the node holds at a newer epoch (a move whose answer was lost), a shard
  // whose range the node split or merged (a split or merge whose answer was
  // lost: the upper half is added, the absorbed shard dropped).
  void Report(const std::string& node, const std::string& data_address,
              const std::vector<Held>& held);
  // The node is gone (stopped reporting): its shards are lost.
  void NodeGone(const std::string& node);

 private:
  struct Impl;
  explicit Directory(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_DIRECTORY_H_
