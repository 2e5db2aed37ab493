// One GPU proclet: a function's named device buffers and loaded modules on
// one backend, serving silt/gpu_wire.h requests, and its device-independent
// state (buffers' bytes, modules in both forms, the launch count) taken out
// and put back in on another backend, which may be another GPU model or the
// host backend. Requests are served one at a time, so a kExtract always falls
// between two launches. It knows which buffers were written since a move's
// pre-copy (kPrecopy) copied them, so the pause (kExtract's delta) carries
// only those.
#ifndef SILT_GPU_PROCLET_H_
#define SILT_GPU_PROCLET_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "gpu/backend.h"

namespace silt::gpu {

struct ProcletOptions {
  // Bytes of device memory its buffers may hold; 0: the device's.
  uint64_t memory_limit = 0;
  // The function's module `name` (its kernels/<name>.ptx and .host.so).
  // NotFound when the function has none of that name. Unset: a kLoad of a
  // module not loaded yet answers kNotFound, and the module comes as bytes
  // (kLoadImage).
  std::function<absl::StatusOr<ModuleImage>(std::string_view name)> find_module;
};

class Proclet {
 public:
  Proclet(std::unique_ptr<Backend> backend, ProcletOptions options);
  ~Proclet();

  // One request (GpuOp, its arguments); the reply (StateCode, results).
  std::string Serve(std::string_view request);

  const Backend& backend() const { return *backend_; }
  uint64_t memory_used() const { return used_; }
  uint64_t launches() const { return launches_; }
  uint64_t generation() const { return generation_; }

 private:
  struct Buffer {
    DevicePtr ptr = 0;
    uint64_t bytes = 0;
    bool written = true;  // since a pre-copy last began copying it
  };
  struct LoadedModule {
    ModuleImage image;
    std::unique_ptr<Module> module;
    bool sent = false;  // in a pre-copy's part since the move began
  };

  std::string Info();
  absl::StatusOr<std::string> SetLimit(uint64_t limit);
  // Applies a pending limit once what it holds fits.
  void ApplyPendingLimit();
  // At a point where every launch so far has completed: the time they kept
  // the device busy is counted (launches on a GPU are asynchronous: from the
  // first launch after the device was idle until then).
  void Settled();
  // backend_->Synchronize(), then Settled().
  absl::Status Sync();
  // Appends a 'D' record for each buffer freed since the move began.
  void AppendDropped(std::string* out);
  absl::StatusOr<std::string> Alloc(std::string_view name, uint64_t bytes);
  absl::Status Load(std::string_view name);
  absl::Status LoadImage(std::string_view name, ModuleImage image);
  absl::StatusOr<std::string> Launch(std::string_view args);
  absl::StatusOr<std::string> Extract(bool delta);
  absl::StatusOr<std::string> Precopy(bool restart, uint64_t max_bytes);
  absl::Status Inject(std::string_view state);
  // Appends a 'B' record of `b`'s bytes [offset, offset + n).
  absl::Status AppendBuffer(std::string* out, const std::string& name,
                            const Buffer& b, uint64_t offset, uint64_t n);
  void AppendModule(std::string* out, const std::string& name, LoadedModule& m);
  void MarkAllWritten();
  void Clear();

  std::unique_ptr<Backend> backend_;
  ProcletOptions options_;
  std::map<std::string, Buffer, std::less<>> buffers_;
  std::map<std::string, LoadedModule, std::less<>> modules_;
  uint64_t used_ = 0;
  uint64_t launches_ = 0;
  uint64_t generation_ = 0;  // bumped by every move and resize
  uint64_t busy_ns_ = 0;     // the device ran its launches this long
  // A launch on a GPU (asynchronous) is in flight since then (0: none).
  int64_t in_flight_since_ns_ = 0;
  uint64_t pending_limit_ = 0;  // asked to shrink to this (0: not)
  // A move under way (kMoving): where to ("": none).
  std::string moving_to_, moving_to_device_;
  uint64_t moving_to_limit_ = 0;
  bool paused_ = false;  // after kExtract, until kInject or kResume
  // A pre-copy pass: the buffer it copies next, and from where ("" and 0:
  // the pass is done; the next kPrecopy begins another).
  std::string precopy_buffer_;
  uint64_t precopy_offset_ = 0;
  // A move's pre-copy began (until kExtract or kResume): buffers freed
  // since go to the target as 'D' records (it holds their copies).
  bool moving_ = false;
  std::set<std::string, std::less<>> dropped_;
};

}  // namespace silt::gpu

#endif  // SILT_GPU_PROCLET_H_
