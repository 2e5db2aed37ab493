// silt-worker's in-place reads: map gets and contains on the shards its own
// node holds are answered from the shards' arenas, mapped read-only into the
// instance (proclets/shared_map.h), with no round trip to the invoker. That is
// what makes a local shard several times faster than a store across a socket:
// a get costs a hash, a probe and a copy, not two system calls and two
// context switches.
//
// The invoker hands over the arenas on a kShareMap request (their memory
// files ride with the reply). A view answers only while the invoker keeps its
// window open; everything else (writes, other nodes' shards, a shard that is
// moving or was rebuilt) goes to the invoker as before, and the views are
// refreshed now and then: after an arena was retired (a compaction, a split,
// a move) and, at most once a second, when reads keep going to the invoker
// (a shard may have moved here).
#ifndef SILT_INVOKER_LOCAL_MAPS_H_
#define SILT_INVOKER_LOCAL_MAPS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "proclets/shared_map.h"

namespace silt::invoker {

class LocalMaps {
 public:
  // Sends a kShareMap request to the invoker and returns the memory files
  // that came back (none when it failed).
  using ShareFn = std::function<std::vector<int>(std::string_view request)>;
  explicit LocalMaps(ShareFn share) : share_(std::move(share)) {}

  // When `request` (as the SDK built it) is a map get or contains that a
  // shard of this node answers, writes the reply and returns true; false:
  // send the request to the invoker. Not thread-safe.
  bool TryAnswer(std::string_view request, std::string* reply);
  // Unmaps everything (the state connection is going away: a checkpoint must
  // not hold the invoker's memory).
  void Clear() { maps_.clear(); }

 private:
  struct Map {
    std::vector<std::unique_ptr<proclets::SharedMapShard>> views;
    uint64_t shared_ms = 0;  // when the views were last refreshed
    bool stale = true;       // refresh before the next read
  };
  void Refresh(const std::string& name, Map& m, uint64_t now_ms);

  ShareFn share_;
  std::map<std::string, Map, std::less<>> maps_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_LOCAL_MAPS_H_
