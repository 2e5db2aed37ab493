// A GPU proclet's requests (silt/gpu_wire.h) as silt-gpu-host serves them,
// from arbitrary bytes: a sequence of requests, each a u16 length and its
// bytes, served in order by one proclet on the host backend (device memory
// capped at 64 MiB). Modules are never loaded: the backend's Load is a test
// double that refuses (the holder dlopens only what the function's build
// made, inside its sandbox); every parser around it runs, state injection
// included.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "gpu/backend.h"
#include "gpu/proclet.h"

namespace {

using namespace silt::gpu;

class NoModules : public Backend {
 public:
  NoModules() : host_(MakeHostBackend(1)) {}
  BackendKind kind() const override { return host_->kind(); }
  std::string device_name() const override { return host_->device_name(); }
  uint64_t device_memory() const override { return host_->device_memory(); }
  absl::StatusOr<DevicePtr> Alloc(uint64_t bytes) override {
    return host_->Alloc(bytes);
  }
  void Free(DevicePtr p, uint64_t bytes) override { host_->Free(p, bytes); }
  absl::Status CopyIn(DevicePtr dst, const void* src, uint64_t n) override {
    return host_->CopyIn(dst, src, n);
  }
  absl::Status CopyOut(void* dst, DevicePtr src, uint64_t n) override {
    return host_->CopyOut(dst, src, n);
  }
  absl::StatusOr<std::unique_ptr<Module>> Load(const ModuleImage&) override {
    return absl::InvalidArgumentError("no modules in the fuzzer");
  }
  absl::Status Synchronize() override { return host_->Synchronize(); }

 private:
  std::unique_ptr<Backend> host_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ProcletOptions options;
  options.memory_limit = 64 << 20;
  Proclet proclet(std::make_unique<NoModules>(), options);
  size_t at = 0;
  while (at + 2 <= size) {
    uint16_t n;
    memcpy(&n, data + at, 2);
    at += 2;
    if (n > size - at) n = static_cast<uint16_t>(size - at);
    std::string reply = proclet.Serve(
        std::string_view(reinterpret_cast<const char*>(data + at), n));
    if (reply.empty()) __builtin_trap();  // every request has an answer
    at += n;
  }
  return 0;
}
