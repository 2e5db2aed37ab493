// A function's GPU piece: a GPU proclet, reached from a handler through its
// Context. It holds named device buffers and loaded kernels, outlives
// instances, and is shared by every instance of the function that names it:
//
//   auto gpu = ctx.Gpu();                              // the proclet "default"
//   auto x = gpu.Alloc("x", n * sizeof(float));        // silt::Result<Buffer>
//   gpu.Write(*x, input);                              // std::vector<float>
//   auto mod = gpu.Load("saxpy");                      // kernels/saxpy.cu
//   gpu.Launch(*mod, "saxpy", {(n + 255) / 256}, {256}, 2.0f, x->In(), *y, n);
//   auto out = gpu.Read<float>(*y);                    // Result<vector<float>>
//
// Kernels are written once in CUDA C++ against silt/gpu_kernel.h; `silt
// build` compiles each <module>.cu of the handler directory to PTX (loaded by
// the driver's JIT on whatever GPU the proclet lands on) and to a host
// library (run on CPU cores where the proclet lives on a node without a GPU).
// A launch's arguments are values (trivially copyable) or buffers (passed as
// device pointers; Buffer::At(offset) passes an offset into one, In() one
// the kernel only reads). Errors are
// values; nothing here throws.
//
// Reconfiguration: a proclet's allocation (memory_limit) and device change
// when it is moved (to another GPU model, or to CPU cores) or resized (an
// operator's `silt gpu resize`, or the gateway downgrading it toward the
// function's com.silt.gpu.min-memory rather than evicting it). A function
// that adapts registers a callback, run in the instance before its next
// call to the proclet goes on:
//
//   gpu.OnReconfigure([&](silt::Gpu& g, const silt::GpuInfo& now) {
//     if (now.pending_limit) ...  // asked to shrink: Free down to it
//     batch = now.memory_limit / bytes_per_item;  // moved or resized
//   });
//
// It runs once with the proclet's current state (the first call after it
// is registered), then after every change, and before some: when the
// proclet is asked to shrink (pending_limit is the allocation to come; a
// resize waits a few seconds for the Frees, and fails if they do not come)
// and while it is being moved (moving_to says where; the callback runs
// again once it is there).
#ifndef SILT_GPU_H_
#define SILT_GPU_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "silt/gpu_wire.h"
#include "silt/state.h"

namespace silt {

struct GpuDim {
  GpuDim(uint32_t x = 1, uint32_t y = 1, uint32_t z = 1) : x(x), y(y), z(z) {}
  uint32_t x, y, z;
};

struct GpuInfo {
  std::string backend;                         // "cuda" or "host"
  std::string device;                          // the GPU's model, or the CPU's
  uint64_t memory_limit = 0, memory_used = 0;  // its allocation, in use
  uint64_t launches = 0;                       // completed so far
  uint64_t generation = 0;                     // bumped by moves and resizes
  // Non-zero: it is asked to shrink to this allocation; until Frees bring it
  // there, new Allocs count against it.
  uint64_t pending_limit = 0;
  // Non-empty while a move is under way: the backend ("cuda", "host") and
  // device it is moving to, and its allocation there. The callback hears of
  // it before the move ends (it may Free what need not go along, or get
  // ready for the device to come), and again after, on the new device.
  std::string moving_to, moving_to_device;
  uint64_t moving_to_limit = 0;
};

class Gpu;
// A function's reaction to its GPU proclet's reconfiguration (see above).
using GpuReconfigure = std::function<void(Gpu& gpu, const GpuInfo& now)>;

// A device buffer of the proclet (by name: it stays where the proclet is).
struct GpuBuffer {
  struct Ref {
    std::string_view name;
    uint64_t offset;
    bool in = false;
  };
  std::string name;
  uint64_t bytes = 0;
  // As a launch argument: the device address `offset` bytes in.
  Ref At(uint64_t offset) const { return {name, offset}; }
  // As an argument the kernel only reads (`const T*`): a move of the proclet
  // then need not copy it again after the launch. A kernel that writes it
  // anyway may lose those writes when its proclet moves.
  Ref In(uint64_t offset = 0) const { return {name, offset, true}; }
};

struct GpuModule {
  std::string name;
};

class Gpu {
 public:
  Gpu(const silt_state_api* api, std::string name)
      : h_(api, std::move(name), wire::StateKind::kGpu, {}) {}

  const std::string& name() const { return h_.name(); }

  Result<GpuInfo> Info() {
    std::string body;
    if (auto s = Run(Begin(wire::GpuOp::kInfo), &body); !s.ok())
      return Result<GpuInfo>(s.code(), s.message());
    GpuInfo i;
    if (!ParseInfo(body, &i))
      return Result<GpuInfo>(StateCode::kInternal, "bad reply");
    return i;
  }

  // Registers (replaces; empty: removes) this instance's reconfiguration
  // callback for the proclet of this name.
  void OnReconfigure(GpuReconfigure callback) {
    std::lock_guard<std::mutex> lock(Hooks().mu);
    if (callback)
      Hooks().by_name[name()] = Hook{std::move(callback), ~uint64_t{0}};
    else
      Hooks().by_name.erase(name());
  }

  // The buffer `buffer` of `bytes` bytes: created zeroed, or the existing one
  // (kInvalid if it has another size: Free it first).
  Result<GpuBuffer> Alloc(std::string buffer, uint64_t bytes) {
    std::string req = Begin(wire::GpuOp::kAlloc), body;
    wire::Writer w(&req);
    w.Str(buffer);
    w.U64(bytes);
    if (auto s = Run(req, &body); !s.ok())
      return Result<GpuBuffer>(s.code(), s.message());
    return GpuBuffer{std::move(buffer), bytes};
  }
  // Every buffer it holds, by name (whichever instance made it).
  Result<std::vector<GpuBuffer>> Buffers() {
    std::string body;
    if (auto s = Run(Begin(wire::GpuOp::kList), &body); !s.ok())
      return Result<std::vector<GpuBuffer>>(s.code(), s.message());
    wire::Reader r(body);
    uint32_t n;
    std::vector<GpuBuffer> out;
    if (!r.U32(&n))
      return Result<std::vector<GpuBuffer>>(StateCode::kInternal, "bad reply");
    for (uint32_t i = 0; i < n; ++i) {
      std::string_view name;
      GpuBuffer b;
      if (!r.Str(&name) || !r.U64(&b.bytes))
        return Result<std::vector<GpuBuffer>>(StateCode::kInternal,
                                              "bad reply");
      b.name = name;
      out.push_back(std::move(b));
    }
    return out;
  }
  // Whether it existed.
  Result<bool> Free(std::string_view buffer) {
    std::string req = Begin(wire::GpuOp::kFree), body;
    wire::Writer(&req).Str(buffer);
    if (auto s = Run(req, &body); !s.ok())
      return Result<bool>(s.code(), s.message());
    return !body.empty() && body[0] != 0;
  }

  Status Write(const GpuBuffer& b, uint64_t offset, std::string_view bytes) {
    do {
      std::string_view part = bytes.substr(
          0, std::min<uint64_t>(bytes.size(), wire::kGpuChunkBytes));
      std::string req = Begin(wire::GpuOp::kWrite), body;
      wire::Writer w(&req);
      w.Str(b.name);
      w.U64(offset);
      w.Str(part);
      if (auto s = Run(req, &body); !s.ok()) return s;
      offset += part.size();
      bytes.remove_prefix(part.size());
    } while (!bytes.empty());
    return Done{};
  }
  template <typename T>
  Status Write(const GpuBuffer& b, const std::vector<T>& values,
               uint64_t offset = 0) {
    static_assert(std::is_trivially_copyable_v<T>);
    return Write(b, offset,
                 std::string_view(reinterpret_cast<const char*>(values.data()),
                                  values.size() * sizeof(T)));
  }

  Result<std::string> Read(const GpuBuffer& b, uint64_t offset,
                           uint64_t length) {
    std::string out;
    while (length > 0) {
      uint64_t n = std::min(length, wire::kGpuChunkBytes);
      std::string req = Begin(wire::GpuOp::kRead), body;
      wire::Writer w(&req);
      w.Str(b.name);
      w.U64(offset);
      w.U64(n);
      if (auto s = Run(req, &body); !s.ok())
        return Result<std::string>(s.code(), s.message());
      wire::Reader r(body);
      std::string_view part;
      if (!r.Str(&part) || part.size() != n)
        return Result<std::string>(StateCode::kInternal, "bad reply");
      out.append(part);
      offset += n;
      length -= n;
    }
    return out;
  }
  // The whole buffer as values of T.
  template <typename T>
  Result<std::vector<T>> Read(const GpuBuffer& b) {
    static_assert(std::is_trivially_copyable_v<T>);
    auto bytes = Read(b, 0, b.bytes / sizeof(T) * sizeof(T));
    if (!bytes.ok())
      return Result<std::vector<T>>(bytes.code(), bytes.message());
    std::vector<T> v(bytes->size() / sizeof(T));
    memcpy(static_cast<void*>(v.data()), bytes->data(), bytes->size());
    return v;
  }

  // The kernels of the function's <module>.cu.
  Result<GpuModule> Load(std::string module) {
    std::string req = Begin(wire::GpuOp::kLoad), body;
    wire::Writer(&req).Str(module);
    if (auto s = Run(req, &body); !s.ok())
      return Result<GpuModule>(s.code(), s.message());
    return GpuModule{std::move(module)};
  }

  // Queues kernel<<<grid, block>>>(args...); returns its launch number.
  template <typename... Args>
  Result<uint64_t> Launch(const GpuModule& m, std::string_view kernel,
                          GpuDim grid, GpuDim block, const Args&... args) {
    return LaunchShared(m, kernel, grid, block, 0, args...);
  }
  // With `shared_bytes` of dynamic shared memory.
  template <typename... Args>
  Result<uint64_t> LaunchShared(const GpuModule& m, std::string_view kernel,
                                GpuDim grid, GpuDim block,
                                uint32_t shared_bytes, const Args&... args) {
    static_assert(sizeof...(Args) <= wire::kMaxLaunchArgs);
    std::string req = Begin(wire::GpuOp::kLaunch), body;
    wire::Writer w(&req);
    w.Str(m.name);
    w.Str(kernel);
    for (const GpuDim& d : {grid, block}) {
      w.U32(d.x);
      w.U32(d.y);
      w.U32(d.z);
    }
    w.U32(shared_bytes);
    w.U32(static_cast<uint32_t>(sizeof...(Args)));
    (AppendArg(&w, args), ...);
    if (auto s = Run(req, &body); !s.ok())
      return Result<uint64_t>(s.code(), s.message());
    return internal::DecodeU64(body);
  }

  // Waits for every launch so far; returns how many have completed.
  Result<uint64_t> Synchronize() {
    std::string body;
    if (auto s = Run(Begin(wire::GpuOp::kSynchronize), &body); !s.ok())
      return Result<uint64_t>(s.code(), s.message());
    return internal::DecodeU64(body);
  }

 private:
  struct Hook {
    GpuReconfigure callback;
    uint64_t seen;  // the generation it last ran for
  };
  struct HookTable {
    std::mutex mu;
    std::map<std::string, Hook, std::less<>> by_name;
  };
  // This instance's callbacks, by proclet name (they outlive Gpu handles).
  static HookTable& Hooks() {
    static HookTable* table = new HookTable;
    return *table;
  }

  static bool ParseInfo(std::string_view body, GpuInfo* i) {
    wire::Reader r(body);
    std::string_view backend, device;
    if (!r.Str(&backend) || !r.Str(&device) || !r.U64(&i->memory_limit) ||
        !r.U64(&i->memory_used) || !r.U64(&i->launches) ||
        !r.U64(&i->generation) || !r.U64(&i->pending_limit))
      return false;
    i->backend = backend;
    i->device = device;
    uint64_t busy_ns;
    std::string_view moving_to, moving_to_device;
    if (r.U64(&busy_ns) && r.Str(&moving_to) && r.Str(&moving_to_device) &&
        r.U64(&i->moving_to_limit)) {
      i->moving_to = moving_to;
      i->moving_to_device = moving_to_device;
    }
    return true;
  }

  std::string Begin(wire::GpuOp op) {
    std::string req = h_.Begin(wire::StateOp::kGpu);
    header_bytes_ = req.size();
    wire::Writer(&req).U8(static_cast<uint8_t>(op));
    return req;
  }
  // With a callback registered, the request runs only if the proclet is as
  // the callback last saw it; else the callback runs first (its own calls
  // go through as they are: it has seen the change).
  Status Run(const std::string& req, std::string* body) {
    std::string msg;
    for (int attempt = 0;; ++attempt) {
      uint64_t seen = 0;
      bool hooked = false;
      {
        std::lock_guard<std::mutex> lock(Hooks().mu);
        if (auto it = Hooks().by_name.find(name());
            it != Hooks().by_name.end()) {
          hooked = true;
          seen = it->second.seen;
        }
      }
      if (!hooked || InCallback() || attempt == 8) {
        StateCode c = h_.Run(req, body, &msg);
        if (c != StateCode::kOk) return Status(c, std::move(msg));
        return Done{};
      }
      std::string since = req.substr(0, header_bytes_);
      wire::Writer w(&since);
      w.U8(static_cast<uint8_t>(wire::GpuOp::kSince));
      w.U64(seen);
      since.append(req, header_bytes_);
      StateCode c = h_.Run(since, body, &msg);
      if (c == StateCode::kOk) return Done{};
      if (c != StateCode::kReconfigured) return Status(c, std::move(msg));
      GpuInfo now;  // the body of a kReconfigured reply comes as its message
      if (!ParseInfo(msg, &now))
        return Status(StateCode::kInternal, "bad reply");
      GpuReconfigure callback;
      {
        std::lock_guard<std::mutex> lock(Hooks().mu);
        auto it = Hooks().by_name.find(name());
        if (it == Hooks().by_name.end()) continue;
        it->second.seen = now.generation;
        callback = it->second.callback;
      }
      struct InCallbackScope {
        InCallbackScope() { InCallback() = true; }
        ~InCallbackScope() { InCallback() = false; }
      } scope;
      callback(*this, now);
    }
  }
  // A callback's own calls run as they are (no nested callbacks).
  static bool& InCallback() {
    thread_local bool in = false;
    return in;
  }
  static void AppendArg(wire::Writer* w, const GpuBuffer& b) {
    AppendArg(w, b.At(0));
  }
  static void AppendArg(wire::Writer* w, const GpuBuffer::Ref& r) {
    w->U8(static_cast<uint8_t>(r.in ? wire::ArgKind::kBufferIn
                                    : wire::ArgKind::kBuffer));
    w->Str(r.name);
    w->U64(r.offset);
  }
  template <typename T>
  static void AppendArg(wire::Writer* w, const T& v) {
    static_assert(std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>,
                  "a launch argument is a value or a GpuBuffer: device "
                  "pointers are made from buffers");
    w->U8(static_cast<uint8_t>(wire::ArgKind::kValue));
    w->Str(std::string_view(reinterpret_cast<const char*>(&v), sizeof(T)));
  }

  internal::StructureHandle h_;
  size_t header_bytes_ = 0;  // the state request header's, before the GpuOp
};

}  // namespace silt

#endif  // SILT_GPU_H_
