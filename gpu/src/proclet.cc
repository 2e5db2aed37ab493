#include "gpu/proclet.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "silt/gpu_wire.h"

namespace silt::gpu {
namespace {

using wire::GpuOp;
using wire::StateCode;

// Abseil's string_view is its own type here.
absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }

constexpr uint32_t kStateMagic = 0x31504753;  // "SGP1"

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
    case GpuOp::kInfo: {
      auto info = Info();
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
        if (auto s = backend_->Synchronize(); !s.ok()) return Reply(s);
        backend_->Free(it->second.ptr, it->second.bytes);
        used_ -= it->second.bytes;
        buffers_.erase(it);
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
        auto s = backend_->CopyIn(it->second.ptr + offset, data.data(), length);
        return s.ok() ? Reply(StateCode::kOk) : Reply(s);
      }
      std::string out;
      wire::Writer(&out).U32(static_cast<uint32_t>(length));
      size_t at = out.size();
      out.resize(at + length);
      auto s =
          backend_->CopyOut(out.data() + at, it->second.ptr + offset, length);
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
      if (auto s = backend_->Synchronize(); !s.ok()) return Reply(s);
      std::string out;
      wire::Writer(&out).U64(launches_);
      return Reply(StateCode::kOk, out);
    }
    case GpuOp::kExtract: {
      auto state = Extract();
      if (!state.ok()) return Reply(state.status());
      paused_ = true;
      std::string out(1, static_cast<char>(StateCode::kOk));
      out += *state;
      return out;
    }
    case GpuOp::kInject: {
      auto s = Inject(r.rest());
      if (s.ok()) paused_ = false;
      return s.ok() ? Reply(StateCode::kOk) : Reply(s);
    }
    case GpuOp::kResume:
      paused_ = false;
      return Reply(StateCode::kOk);
  }
  return Reply(StateCode::kInvalid,
               absl::StrCat("unknown GPU operation ", op_byte));
}

absl::StatusOr<std::string> Proclet::Info() {
  std::string out;
  wire::Writer w(&out);
  w.Str(BackendName(backend_->kind()));
  w.Str(backend_->device_name());
  w.U64(options_.memory_limit);
  w.U64(used_);
  w.U64(launches_);
  return out;
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
  if (bytes > options_.memory_limit - used_)
    return absl::ResourceExhaustedError(absl::StrCat(
        "allocating ", bytes, " bytes would pass the GPU proclet's limit of ",
        options_.memory_limit, " bytes (", used_,
        " in use; the function's com.silt.gpu.max-memory label sets it)"));
  auto ptr = backend_->Alloc(bytes);
  if (!ptr.ok()) return ptr.status();
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
    } else if (kind == static_cast<uint8_t>(wire::ArgKind::kBuffer)) {
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
    } else {
      return Malformed("launch argument kind");
    }
    args[i] = values[i].data();
  }
  if (!r.done()) return Malformed("Launch (bytes after its arguments)");
  if (auto s =
          m->second.module->Launch(kernel, grid, block, shared, args.data());
      !s.ok())
    return s;
  std::string out;
  wire::Writer(&out).U64(++launches_);
  return out;
}

absl::StatusOr<std::string> Proclet::Extract() {
  if (auto s = backend_->Synchronize(); !s.ok()) return s;
  std::string out;
  size_t size = 64;  // one allocation: growing would copy what is in
  for (const auto& [name, b] : buffers_) size += 16 + name.size() + b.bytes;
  for (const auto& [name, m] : modules_)
    size += 16 + name.size() + m.image.ptx.size() + m.image.host_library.size();
  out.reserve(size);
  wire::Writer w(&out);
  w.U32(kStateMagic);
  w.U64(launches_);
  w.U32(static_cast<uint32_t>(buffers_.size()));
  for (const auto& [name, b] : buffers_) {
    w.Str(name);
    w.U64(b.bytes);
    size_t at = out.size();
    out.resize(at + b.bytes);
    if (auto s = backend_->CopyOut(out.data() + at, b.ptr, b.bytes); !s.ok())
      return s;
  }
  w.U32(static_cast<uint32_t>(modules_.size()));
  for (const auto& [name, m] : modules_) {
    w.Str(name);
    w.Str(m.image.ptx);
    w.Str(m.image.host_library);
  }
  return out;
}

absl::Status Proclet::Inject(std::string_view state) {
  Clear();
  launches_ = 0;
  wire::Reader r(state);
  uint32_t magic, buffers, modules;
  uint64_t launches;
  if (!r.U32(&magic) || magic != kStateMagic || !r.U64(&launches) ||
      !r.U32(&buffers))
    return Malformed("GPU proclet state");
  for (uint32_t i = 0; i < buffers; ++i) {
    std::string_view name;
    uint64_t bytes;
    if (!r.Str(&name) || !r.U64(&bytes) || r.rest().size() < bytes) {
      Clear();
      return Malformed("GPU proclet state (a buffer)");
    }
    auto out = Alloc(name, bytes);
    if (!out.ok()) {
      Clear();
      return out.status();
    }
    if (auto s = backend_->CopyIn(buffers_.find(name)->second.ptr,
                                  r.rest().data(), bytes);
        !s.ok()) {
      Clear();
      return s;
    }
    r = wire::Reader(r.rest().substr(bytes));
  }
  if (!r.U32(&modules)) {
    Clear();
    return Malformed("GPU proclet state (modules)");
  }
  for (uint32_t i = 0; i < modules; ++i) {
    std::string_view name;
    ModuleImage image;
    std::string_view ptx, host;
    if (!r.Str(&name) || !r.Str(&ptx) || !r.Str(&host)) {
      Clear();
      return Malformed("GPU proclet state (a module)");
    }
    image.ptx = ptx;
    image.host_library = host;
    auto module = backend_->Load(image);
    if (!module.ok()) {
      Clear();
      return module.status();
    }
    modules_.emplace(std::string(name),
                     LoadedModule{std::move(image), *std::move(module)});
  }
  launches_ = launches;
  return absl::OkStatus();
}

}  // namespace silt::gpu
