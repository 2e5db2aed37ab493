#include "gpu/proclet.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "silt/gpu_wire.h"

namespace silt::gpu {
namespace {

using wire::GpuOp;
using wire::StateCode;

// Abseil's string_view is its own type here.
absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

StateCode CodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      return StateCode::kNotFound;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
      return StateCode::kInvalid;
    case absl::StatusCode::kResourceExhausted:
      return StateCode::kTooLarge;
    case absl::StatusCode::kUnavailable:
      return StateCode::kRetry;
    default:
      return StateCode::kInternal;
  }
}

std::string Reply(StateCode code, std::string_view body = {}) {
  std::string r(1, static_cast<char>(code));
  r.append(body);
  return r;
}

std::string Reply(const absl::Status& s) {
  return Reply(CodeOf(s),
               std::string_view(s.message().data(), s.message().size()));
}

absl::Status Malformed(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed ", Sv(what)));
}

absl::Status CheckBufferName(std::string_view name) {
  if (wire::ValidStructureName(name)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "buffer name \"", Sv(name),
      "\" is not 1-63 characters of [a-z0-9._-] starting with a letter or "
      "digit"));
}

}  // namespace

Proclet::Proclet(std::unique_ptr<Backend> backend, ProcletOptions options)
    : backend_(std::move(backend)), options_(std::move(options)) {
  if (options_.memory_limit == 0)
    options_.memory_limit = backend_->device_memory();
}

Proclet::~Proclet() { Clear(); }

void Proclet::Clear() {
  (void)backend_->Synchronize();
  modules_.clear();
  for (auto& [name, b] : buffers_) backend_->Free(b.ptr, b.bytes);
  buffers_.clear();
  used_ = 0;
}

std::string Proclet::Serve(std::string_view request) {
  wire::Reader r(request);
  uint8_t op_byte;
  if (!r.U8(&op_byte)) return Reply(Malformed("GPU request"));
  const auto op = static_cast<GpuOp>(op_byte);
  if (paused_ && op != GpuOp::kInject && op != GpuOp::kResume &&
      op != GpuOp::kExtract)
    return Reply(StateCode::kRetry, "the GPU proclet is moving");
  switch (op) {
    case GpuOp::kInfo:
      return Reply(StateCode::kOk, Info());
    case GpuOp::kSince: {
      uint64_t seen;
      if (!r.U64(&seen) || r.rest().empty() ||
          r.rest()[0] == static_cast<char>(GpuOp::kSince))
        return Reply(Malformed("Since"));
      if (seen != generation_) return Reply(StateCode::kReconfigured, Info());
      return Serve(r.rest());
    }
    case GpuOp::kList: {
      std::string out;
      wire::Writer w(&out);
      w.U32(static_cast<uint32_t>(buffers_.size()));
      for (const auto& [name, b] : buffers_) {
        w.Str(name);
        w.U64(b.bytes);
      }
      return Reply(StateCode::kOk, out);
    }
    case GpuOp::kSetLimit: {
      uint64_t limit;
      if (!r.U64(&limit) || limit == 0) return Reply(Malformed("SetLimit"));
      auto info = SetLimit(limit);
      return info.ok() ? Reply(StateCode::kOk, *info) : Reply(info.status());
    }
    case GpuOp::kAlloc: {
      std::string_view name;
      uint64_t bytes;
      if (!r.Str(&name) || !r.U64(&bytes)) return Reply(Malformed("Alloc"));
      auto out = Alloc(name, bytes);
      return out.ok() ? Reply(StateCode::kOk, *out) : Reply(out.status());
    }
    case GpuOp::kFree: {
      std::string_view name;
      if (!r.Str(&name)) return Reply(Malformed("Free"));
      auto it = buffers_.find(name);
      const bool existed = it != buffers_.end();
      if (existed) {
        if (auto s = Sync(); !s.ok()) return Reply(s);
        backend_->Free(it->second.ptr, it->second.bytes);
        used_ -= it->second.bytes;
        if (moving_) dropped_.insert(it->first);  // the target drops it too
        buffers_.erase(it);
        ApplyPendingLimit();
      }
      return Reply(StateCode::kOk, std::string(1, existed ? 1 : 0));
    }
    case GpuOp::kWrite:
    case GpuOp::kRead: {
      std::string_view name, data;
      uint64_t offset, length = 0;
      if (!r.Str(&name) || !r.U64(&offset) ||
          !(op == GpuOp::kWrite ? r.Str(&data) : r.U64(&length)))
        return Reply(Malformed("Write or Read"));
      if (op == GpuOp::kWrite) length = data.size();
      auto it = buffers_.find(name);
      if (it == buffers_.end())
        return Reply(StateCode::kNotFound,
                     absl::StrCat("no buffer ", Sv(name), ": Alloc it first"));
      if (offset > it->second.bytes || length > it->second.bytes - offset)
        return Reply(StateCode::kInvalid,
                     absl::StrCat("bytes [", offset, ", ", offset + length,
                                  ") lie outside buffer ", Sv(name), " of ",
                                  it->second.bytes, " bytes"));
      if (length > wire::kGpuChunkBytes)
        return Reply(StateCode::kTooLarge,
                     absl::StrCat("at most ", wire::kGpuChunkBytes,
                                  " bytes per request"));
      if (op == GpuOp::kWrite) {
        it->second.written = true;
        auto s = backend_->CopyIn(it->second.ptr + offset, data.data(), length);
        return s.ok() ? Reply(StateCode::kOk) : Reply(s);
      }
      std::string out;
      wire::Writer(&out).U32(static_cast<uint32_t>(length));
      size_t at = out.size();
      out.resize(at + length);
      auto s =
          backend_->CopyOut(out.data() + at, it->second.ptr + offset, length);
      Settled();  // a read waits for the launches before it
      return s.ok() ? Reply(StateCode::kOk, out) : Reply(s);
    }
    case GpuOp::kLoad: {
      std::string_view name;
      if (!r.Str(&name)) return Reply(Malformed("Load"));
      auto s = Load(name);
      return s.ok() ? Reply(StateCode::kOk) : Reply(s);
    }
    case GpuOp::kLoadImage: {
      std::string_view name, ptx, host;
      if (!r.Str(&name) || !r.Str(&ptx) || !r.Str(&host))
        return Reply(Malformed("LoadImage"));
      ModuleImage image;
      image.ptx = ptx;
      image.host_library = host;
      auto s = LoadImage(name, std::move(image));
      return s.ok() ? Reply(StateCode::kOk) : Reply(s);
    }
    case GpuOp::kLaunch: {
      auto out = Launch(r.rest());
      return out.ok() ? Reply(StateCode::kOk, *out) : Reply(out.status());
    }
    case GpuOp::kSynchronize: {
      if (auto s = Sync(); !s.ok()) return Reply(s);
      std::string out;
      wire::Writer(&out).U64(launches_);
      return Reply(StateCode::kOk, out);
    }
    case GpuOp::kExtract: {
      uint8_t delta = 0;
      (void)r.U8(&delta);  // absent: the whole state
      auto state = Extract(delta != 0);
      if (!state.ok()) return Reply(state.status());
      paused_ = true;
      return std::move(*state);
    }
    case GpuOp::kPrecopy: {
      uint8_t restart;
      uint64_t max_bytes;
      if (!r.U8(&restart) || !r.U64(&max_bytes))
        return Reply(Malformed("Precopy"));
      auto part = Precopy(restart != 0, max_bytes);
      return part.ok() ? std::move(*part) : Reply(part.status());
    }
    case GpuOp::kInject: {
      auto s = Inject(r.rest());
      if (s.ok()) paused_ = false;
      return s.ok() ? Reply(StateCode::kOk) : Reply(s);
    }
    case GpuOp::kResume:
      paused_ = false;
      MarkAllWritten();           // the next move copies everything again
      if (!moving_to_.empty()) {  // called off: callers are told
        moving_to_.clear();
        moving_to_device_.clear();
        moving_to_limit_ = 0;
        ++generation_;
      }
      return Reply(StateCode::kOk);
    case GpuOp::kMoving: {
      std::string_view backend, device;
      uint64_t limit;
      if (!r.Str(&backend) || !r.Str(&device) || !r.U64(&limit))
        return Reply(Malformed("Moving"));
      if (backend.empty() && moving_to_.empty())
        return Reply(StateCode::kOk);  // nothing to call off
      moving_to_ = backend;
      moving_to_device_ = backend.empty() ? std::string_view() : device;
      moving_to_limit_ = backend.empty() ? 0 : limit;
      ++generation_;
      return Reply(StateCode::kOk);
    }
  }
  return Reply(StateCode::kInvalid,
               absl::StrCat("unknown GPU operation ", op_byte));
}

absl::Status Proclet::Sync() {
  absl::Status s = backend_->Synchronize();
  if (s.ok()) Settled();
  return s;
}

void Proclet::Settled() {
  if (in_flight_since_ns_ == 0) return;
  busy_ns_ += NowNs() - in_flight_since_ns_;
  in_flight_since_ns_ = 0;
}

std::string Proclet::Info() {
  std::string out;
  wire::Writer w(&out);
  w.Str(BackendName(backend_->kind()));
  w.Str(backend_->device_name());
  w.U64(options_.memory_limit);
  w.U64(used_);
  w.U64(launches_);
  w.U64(generation_);
  w.U64(pending_limit_);
  w.U64(busy_ns_);
  w.Str(moving_to_);
  w.Str(moving_to_device_);
  w.U64(moving_to_limit_);
  return out;
}

absl::StatusOr<std::string> Proclet::SetLimit(uint64_t limit) {
  if (limit > backend_->device_memory())
    return absl::InvalidArgumentError(
        absl::StrCat(limit, " bytes is more than the device has (",
                     backend_->device_memory(), ")"));
  ++generation_;
  pending_limit_ = limit;
  if (used_ <= limit) ApplyPendingLimit();
  return Info();
}

void Proclet::ApplyPendingLimit() {
  if (pending_limit_ == 0 || used_ > pending_limit_) return;
  options_.memory_limit = pending_limit_;
  pending_limit_ = 0;
  ++generation_;
}

absl::StatusOr<std::string> Proclet::Alloc(std::string_view name,
                                           uint64_t bytes) {
  if (auto s = CheckBufferName(name); !s.ok()) return s;
  std::string out;
  auto it = buffers_.find(name);
  if (it != buffers_.end()) {
    if (it->second.bytes != bytes)
      return absl::InvalidArgumentError(
          absl::StrCat("buffer ", Sv(name), " exists with ", it->second.bytes,
                       " bytes, not ", bytes, ": Free it first"));
    wire::Writer(&out).U64(bytes);
    return out;
  }
  // While it is asked to shrink, what it allocates counts against that.
  const uint64_t limit = pending_limit_ > 0
                             ? std::min(pending_limit_, options_.memory_limit)
                             : options_.memory_limit;
  if (used_ > limit || bytes > limit - used_)
    return absl::ResourceExhaustedError(absl::StrCat(
        "allocating ", bytes,
        " bytes would pass the GPU proclet's memory limit (its allocation) "
        "of ",
        limit, " bytes (", used_,
        " in use; the function's com.silt.gpu.*-memory labels and its node's "
        "GPU set it)"));
  auto ptr = backend_->Alloc(bytes);
  if (!ptr.ok()) return ptr.status();
  // Re-made under a dropped name: its 'B' records replace the old copy.
  if (auto d = dropped_.find(name); d != dropped_.end()) dropped_.erase(d);
  buffers_.emplace(std::string(name), Buffer{*ptr, bytes});
  used_ += bytes;
  wire::Writer(&out).U64(bytes);
  return out;
}

absl::Status Proclet::Load(std::string_view name) {
  if (!wire::ValidStructureName(name))
    return absl::InvalidArgumentError(
        absl::StrCat("module name \"", Sv(name), "\" is not a valid name"));
  if (modules_.count(name)) return absl::OkStatus();
  if (!options_.find_module)
    return absl::NotFoundError(
        absl::StrCat("module ", Sv(name), " is not loaded here"));
  auto image = options_.find_module(name);
  if (!image.ok()) return image.status();
  return LoadImage(name, *std::move(image));
}

absl::Status Proclet::LoadImage(std::string_view name, ModuleImage image) {
  if (!wire::ValidStructureName(name))
    return absl::InvalidArgumentError(
        absl::StrCat("module name \"", Sv(name), "\" is not a valid name"));
  if (modules_.count(name)) return absl::OkStatus();
  auto module = backend_->Load(image);
  if (!module.ok()) return module.status();
  modules_.emplace(std::string(name),
                   LoadedModule{std::move(image), *std::move(module)});
  return absl::OkStatus();
}

absl::StatusOr<std::string> Proclet::Launch(std::string_view request) {
  wire::Reader r(request);
  std::string_view module, kernel;
  Dim3 grid, block;
  uint32_t shared = 0, n = 0;
  if (!r.Str(&module) || !r.Str(&kernel) || !r.U32(&grid.x) ||
      !r.U32(&grid.y) || !r.U32(&grid.z) || !r.U32(&block.x) ||
      !r.U32(&block.y) || !r.U32(&block.z) || !r.U32(&shared) || !r.U32(&n))
    return Malformed("Launch");
  if (!wire::ValidKernelName(kernel))
    return absl::InvalidArgumentError(
        absl::StrCat("kernel name \"", Sv(kernel), "\" is not a C identifier"));
  if (n > wire::kMaxLaunchArgs)
    return absl::InvalidArgumentError(absl::StrCat(
        "a launch takes at most ", wire::kMaxLaunchArgs, " arguments"));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 ||
      block.y == 0 || block.z == 0)
    return absl::InvalidArgumentError(
        "a launch's grid and block dimensions are each at least 1");
  if (uint64_t{block.x} * block.y * block.z > 1024)
    return absl::InvalidArgumentError(
        "a block has at most 1024 threads (CUDA's limit on every GPU)");
  auto m = modules_.find(module);
  if (m == modules_.end())
    return absl::NotFoundError(
        absl::StrCat("module ", Sv(module), " is not loaded: Load it first"));
  // Each argument's value, 8-byte aligned, and a pointer to it.
  std::vector<std::vector<uint64_t>> values(n);
  std::vector<void*> args(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t kind;
    if (!r.U8(&kind)) return Malformed("launch argument");
    if (kind == static_cast<uint8_t>(wire::ArgKind::kValue)) {
      std::string_view bytes;
      if (!r.Str(&bytes) || bytes.empty() || bytes.size() > 256)
        return Malformed("launch argument value");
      values[i].resize((bytes.size() + 7) / 8);
      memcpy(values[i].data(), bytes.data(), bytes.size());
    } else if (kind == static_cast<uint8_t>(wire::ArgKind::kBuffer) ||
               kind == static_cast<uint8_t>(wire::ArgKind::kBufferIn)) {
      std::string_view name;
      uint64_t offset;
      if (!r.Str(&name) || !r.U64(&offset))
        return Malformed("launch argument buffer");
      auto b = buffers_.find(name);
      if (b == buffers_.end())
        return absl::NotFoundError(absl::StrCat("argument ", i,
                                                " names buffer ", Sv(name),
                                                ", which does not exist"));
      if (offset > b->second.bytes)
        return absl::InvalidArgumentError(
            absl::StrCat("argument ", i, ": offset ", offset,
                         " lies past the end of buffer ", Sv(name)));
      values[i].assign(1, b->second.ptr + offset);
      if (kind == static_cast<uint8_t>(wire::ArgKind::kBuffer))
        b->second.written = true;
    } else {
      return Malformed("launch argument kind");
    }
    args[i] = values[i].data();
  }
  if (!r.done()) return Malformed("Launch (bytes after its arguments)");
  const int64_t start = NowNs();
  if (auto s =
          m->second.module->Launch(kernel, grid, block, shared, args.data());
      !s.ok())
    return s;
  if (backend_->kind() == BackendKind::kHost)
    busy_ns_ += NowNs() - start;  // it ran in the call
  else if (in_flight_since_ns_ == 0)
    in_flight_since_ns_ = start;
  std::string out;
  wire::Writer(&out).U64(++launches_);
  return out;
}

void Proclet::MarkAllWritten() {
  for (auto& [name, b] : buffers_) b.written = true;
  for (auto& [name, m] : modules_) m.sent = false;
  precopy_buffer_.clear();
  precopy_offset_ = 0;
  dropped_.clear();
  moving_ = false;
}

void Proclet::AppendDropped(std::string* out) {
  wire::Writer w(out);
  for (const std::string& name : dropped_) {
    w.U8('D');
    w.Str(name);
  }
  dropped_.clear();
}

absl::Status Proclet::AppendBuffer(std::string* out, const std::string& name,
                                   const Buffer& b, uint64_t offset,
                                   uint64_t n) {
  wire::Writer w(out);
  w.U8('B');
  w.Str(name);
  w.U64(b.bytes);
  w.U64(offset);
  w.U64(n);
  size_t at = out->size();
  out->resize(at + n);
  return n == 0 ? absl::OkStatus()
                : backend_->CopyOut(out->data() + at, b.ptr + offset, n);
}

void Proclet::AppendModule(std::string* out, const std::string& name,
                           LoadedModule& m) {
  wire::Writer w(out);
  w.U8('M');
  w.Str(name);
  w.Str(m.image.ptx);
  w.Str(m.image.host_library);
  m.sent = true;
}

// The reply: kOk, then the GpuState.
absl::StatusOr<std::string> Proclet::Extract(bool delta) {
  if (auto s = Sync(); !s.ok()) return s;
  size_t size = 64 + precopy_buffer_.size();  // one allocation: growing
                                              // would copy what is in
  if (auto it = buffers_.find(precopy_buffer_);
      precopy_offset_ > 0 && it != buffers_.end())
    size += it->second.bytes;
  for (const auto& [name, b] : buffers_)
    if (!delta || b.written) size += 48 + name.size() + b.bytes;
  for (const auto& [name, m] : modules_)
    if (!delta || !m.sent)
      size +=
          16 + name.size() + m.image.ptx.size() + m.image.host_library.size();
  // A pass that stopped inside a buffer: the rest of it goes now.
  if (auto it = buffers_.find(precopy_buffer_);
      precopy_offset_ > 0 && it != buffers_.end())
    it->second.written = true;
  precopy_buffer_.clear();
  precopy_offset_ = 0;
  std::string out(1, static_cast<char>(StateCode::kOk));
  out.reserve(size);
  wire::Writer w(&out);
  w.U32(wire::kGpuStateMagic);
  AppendDropped(&out);
  moving_ = false;
  for (auto& [name, m] : modules_)
    if (!delta || !m.sent) AppendModule(&out, name, m);
  for (auto& [name, b] : buffers_)
    if (!delta || b.written) {
      if (auto s = AppendBuffer(&out, name, b, 0, b.bytes); !s.ok()) return s;
      b.written = false;
    }
  w.U8('E');
  w.U64(launches_);
  w.U64(generation_);
  w.U32(static_cast<uint32_t>(buffers_.size()));
  for (const auto& [name, b] : buffers_) w.Str(name);
  return out;
}

// The reply: kOk, u8 pass_done, then the GpuState part.
absl::StatusOr<std::string> Proclet::Precopy(bool restart, uint64_t max_bytes) {
  if (auto s = Sync(); !s.ok()) return s;
  if (restart) {
    MarkAllWritten();
    moving_ = true;
  }
  std::string out(2, '\0');
  out[0] = static_cast<char>(StateCode::kOk);
  out.reserve(2 + 64 + std::min<uint64_t>(max_bytes, 64u << 20));
  wire::Writer(&out).U32(wire::kGpuStateMagic);
  AppendDropped(&out);
  for (auto& [name, m] : modules_)
    if (!m.sent) AppendModule(&out, name, m);
  // Where the pass stopped: inside a buffer not written since, go on from
  // there; a buffer written again (or re-made) meanwhile is copied whole
  // later (it is marked written).
  auto it = buffers_.lower_bound(precopy_buffer_);
  uint64_t offset = 0;
  if (precopy_offset_ > 0 && it != buffers_.end() &&
      it->first == precopy_buffer_) {
    if (!it->second.written && precopy_offset_ < it->second.bytes)
      offset = precopy_offset_;
    else
      ++it;
  }
  uint64_t budget = std::max<uint64_t>(max_bytes, 1);
  for (; it != buffers_.end(); ++it, offset = 0) {
    Buffer& b = it->second;
    if (offset == 0 && !b.written) continue;
    if (budget == 0) {  // this part is full: the next one begins here
      precopy_buffer_ = it->first;
      precopy_offset_ = offset;
      return out;
    }
    if (offset == 0) b.written = false;  // copied from now on
    do {
      const uint64_t n = std::min(b.bytes - offset, budget);
      if (auto s = AppendBuffer(&out, it->first, b, offset, n); !s.ok())
        return s;
      offset += n;
      budget -= n;
    } while (offset < b.bytes && budget > 0);
    if (offset < b.bytes) {  // the next part goes on inside it
      precopy_buffer_ = it->first;
      precopy_offset_ = offset;
      return out;
    }
  }
  precopy_buffer_.clear();
  precopy_offset_ = 0;
  out[1] = 1;  // the pass is done
  return out;
}

absl::Status Proclet::Inject(std::string_view state) {
  wire::Reader r(state);
  uint32_t magic;
  if (!r.U32(&magic) || magic != wire::kGpuStateMagic)
    return Malformed("GPU proclet state");
  while (!r.done()) {
    uint8_t tag;
    if (!r.U8(&tag)) return Malformed("GPU proclet state");
    if (tag == 'B') {
      std::string_view name;
      uint64_t bytes, offset, n;
      if (!r.Str(&name) || !r.U64(&bytes) || !r.U64(&offset) || !r.U64(&n) ||
          r.rest().size() < n || offset > bytes || n > bytes - offset)
        return Malformed("GPU proclet state (a buffer)");
      auto it = buffers_.find(name);
      if (it != buffers_.end() && it->second.bytes != bytes) {
        if (auto s = Sync(); !s.ok()) return s;
        backend_->Free(it->second.ptr, it->second.bytes);
        used_ -= it->second.bytes;
        buffers_.erase(it);
        it = buffers_.end();
      }
      if (it == buffers_.end()) {
        if (auto made = Alloc(name, bytes); !made.ok()) return made.status();
        it = buffers_.find(name);
      }
      if (n > 0)
        if (auto s =
                backend_->CopyIn(it->second.ptr + offset, r.rest().data(), n);
            !s.ok())
          return s;
      r = wire::Reader(r.rest().substr(n));
    } else if (tag == 'D') {
      std::string_view name;
      if (!r.Str(&name)) return Malformed("GPU proclet state (a drop)");
      if (auto it = buffers_.find(name); it != buffers_.end()) {
        if (auto s = Sync(); !s.ok()) return s;
        backend_->Free(it->second.ptr, it->second.bytes);
        used_ -= it->second.bytes;
        buffers_.erase(it);
      }
    } else if (tag == 'M') {
      std::string_view name, ptx, host;
      if (!r.Str(&name) || !r.Str(&ptx) || !r.Str(&host))
        return Malformed("GPU proclet state (a module)");
      ModuleImage image;
      image.ptx = ptx;
      image.host_library = host;
      if (auto s = LoadImage(name, std::move(image)); !s.ok()) return s;
    } else if (tag == 'E') {
      uint64_t launches, generation;
      uint32_t n;
      if (!r.U64(&launches) || !r.U64(&generation) || !r.U32(&n))
        return Malformed("GPU proclet state (its end)");
      std::set<std::string_view> keep;
      for (uint32_t i = 0; i < n; ++i) {
        std::string_view name;
        if (!r.Str(&name)) return Malformed("GPU proclet state (its end)");
        keep.insert(name);
      }
      if (auto s = Sync(); !s.ok()) return s;
      for (auto it = buffers_.begin(); it != buffers_.end();) {
        if (keep.count(it->first)) {
          ++it;
          continue;
        }
        backend_->Free(it->second.ptr, it->second.bytes);
        used_ -= it->second.bytes;
        it = buffers_.erase(it);
      }
      launches_ = launches;
      generation_ = generation + 1;  // moved: callers are told
    } else {
      return Malformed("GPU proclet state (a record)");
    }
  }
  return absl::OkStatus();
}

}  // namespace silt::gpu
