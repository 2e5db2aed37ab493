// A read-only view of a map shard that another process owns and changes: how
// an instance answers gets on the shards its own node holds without a round
// trip to its invoker. The invoker hands over the shard arena's memory file
// (Arena::memory_fd, sealed so that nobody but its owner can write it); the
// view maps it read-only and reads under the arena's sequence lock, so that
// it sees the shard as it was before a change or after it, never a mix, and
// answers only while the owner keeps the arena's window open (it closes it
// before a migration's freeze, a split or a merge, and retires the arena when
// it drops or rebuilds it).
//
// The bytes are the owner's and may change mid-read: every offset is checked
// against the mapping and every probe loop is bounded, so that a torn read
// costs a retry, never a fault.
#ifndef SILT_PROCLETS_SHARED_MAP_H_
#define SILT_PROCLETS_SHARED_MAP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace silt::proclets {

class SharedMapShard {
 public:
  // Maps the memory file read-only (takes `fd`). InvalidArgument when it is
  // not a shard arena's file.
  static absl::StatusOr<std::unique_ptr<SharedMapShard>> Open(int fd);
  ~SharedMapShard();
  SharedMapShard(const SharedMapShard&) = delete;
  SharedMapShard& operator=(const SharedMapShard&) = delete;

  enum class Read {
    kFound,    // the key is there (Get: *value holds its value)
    kAbsent,   // the key is not in the map
    kNotHere,  // the window is closed, does not cover `hash`, or changes
               // kept coming: ask the owner
    kRetired,  // the owner dropped or rebuilt the arena: drop this view
  };
  // `hash` is KeyHash(key). Get's *value means something only with kFound.
  Read Get(std::string_view key, uint64_t hash, std::string* value);
  Read Contains(std::string_view key, uint64_t hash);

 private:
  SharedMapShard() = default;
  Read Lookup(std::string_view key, uint64_t hash, std::string* value);
  bool Remap(size_t size);
  int fd_ = -1;
  const char* map_ = nullptr;  // the control page, then the arena
  size_t mapped_ = 0;          // arena bytes mapped (after the control page)
};

}  // namespace silt::proclets

#endif  // SILT_PROCLETS_SHARED_MAP_H_
