// The CUDA backend: the driver API, loaded from libcuda.so.1 at run time (no
// link-time dependency: nodes without a GPU run the same binaries). Each
// backend is its own context on its device; modules are loaded from PTX with
// the driver's JIT, so one build runs on any GPU model.
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "gpu/backend.h"

namespace silt::gpu {
namespace {

using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUdeviceptr = unsigned long long;
constexpr CUresult kCudaSuccess = 0;

// The driver's entry points Silt uses.
struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
  CUresult (*cuCtxCreate)(CUcontext*, unsigned, CUdevice);
  CUresult (*cuCtxDestroy)(CUcontext);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, unsigned, CUstream, void**,
                             void**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
};

// The driver, loaded once; an error when this node has none.
const absl::StatusOr<Driver>& LoadDriver() {
  static const absl::StatusOr<Driver>* driver = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
      return new absl::StatusOr<Driver>(absl::FailedPreconditionError(
          absl::StrCat("no CUDA driver on this node (", dlerror(), ")")));
    Driver d{};
    std::string missing;
    auto get = [&](auto* fn, const char* name) {
      void* sym = dlsym(lib, name);
      if (sym == nullptr) missing += absl::StrCat(" ", name);
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(sym);
    };
    get(&d.cuInit, "cuInit");
    get(&d.cuDeviceGetCount, "cuDeviceGetCount");
    get(&d.cuDeviceGet, "cuDeviceGet");
    get(&d.cuDeviceGetName, "cuDeviceGetName");
    get(&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2");
    get(&d.cuCtxCreate, "cuCtxCreate_v2");
    get(&d.cuCtxDestroy, "cuCtxDestroy_v2");
    get(&d.cuCtxSetCurrent, "cuCtxSetCurrent");
    get(&d.cuCtxSynchronize, "cuCtxSynchronize");
    get(&d.cuMemAlloc, "cuMemAlloc_v2");
    get(&d.cuMemFree, "cuMemFree_v2");
    get(&d.cuMemsetD8, "cuMemsetD8_v2");
    get(&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    get(&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    get(&d.cuModuleLoadData, "cuModuleLoadData");
    get(&d.cuModuleUnload, "cuModuleUnload");
    get(&d.cuModuleGetFunction, "cuModuleGetFunction");
    get(&d.cuLaunchKernel, "cuLaunchKernel");
    get(&d.cuGetErrorString, "cuGetErrorString");
    if (!missing.empty())
      return new absl::StatusOr<Driver>(absl::FailedPreconditionError(
          absl::StrCat("the CUDA driver lacks:", missing)));
    if (CUresult r = d.cuInit(0); r != kCudaSuccess)
      return new absl::StatusOr<Driver>(absl::FailedPreconditionError(
          absl::StrCat("cuInit failed (CUDA error ", r,
                       "): no usable GPU on this node")));
    return new absl::StatusOr<Driver>(d);
  }();
  return *driver;
}

absl::Status Check(const Driver& d, CUresult r, absl::string_view what) {
  if (r == kCudaSuccess) return absl::OkStatus();
  const char* s = nullptr;
  d.cuGetErrorString(r, &s);
  std::string msg = s != nullptr ? absl::StrCat(what, ": ", s)
                                 : absl::StrCat(what, ": CUDA error ", int{r});
  // 2: out of memory
  if (r == 2) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

class CudaModule : public Module {
 public:
  CudaModule(const Driver& d, CUcontext ctx, CUmodule m)
      : d_(d), ctx_(ctx), module_(m) {}
  ~CudaModule() override {
    d_.cuCtxSetCurrent(ctx_);
    d_.cuModuleUnload(module_);
  }
  absl::Status Launch(std::string_view kernel, Dim3 grid, Dim3 block,
                      uint32_t shared_bytes, void** args) override {
    d_.cuCtxSetCurrent(ctx_);
    std::string name(kernel);
    auto it = functions_.find(name);
    if (it == functions_.end()) {
      CUfunction f = nullptr;
      if (d_.cuModuleGetFunction(&f, module_, name.c_str()) != kCudaSuccess)
        return absl::NotFoundError(absl::StrCat(
            "the module has no kernel ", name, " (is it extern \"C\"?)"));
      it = functions_.emplace(name, f).first;
    }
    return Check(
        d_,
        d_.cuLaunchKernel(it->second, grid.x, grid.y, grid.z, block.x, block.y,
                          block.z, shared_bytes, nullptr, args, nullptr),
        absl::StrCat("launching ", name));
  }

 private:
  const Driver& d_;
  CUcontext ctx_;
  CUmodule module_;
  std::map<std::string, CUfunction, std::less<>> functions_;
};

class CudaBackend : public Backend {
 public:
  CudaBackend(const Driver& d, CUcontext ctx, std::string name, uint64_t memory)
      : d_(d), ctx_(ctx), name_(std::move(name)), memory_(memory) {}
  ~CudaBackend() override { d_.cuCtxDestroy(ctx_); }

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string device_name() const override { return name_; }
  uint64_t device_memory() const override { return memory_; }

  absl::StatusOr<DevicePtr> Alloc(uint64_t bytes) override {
    d_.cuCtxSetCurrent(ctx_);
    CUdeviceptr p = 0;
    if (auto s = Check(d_, d_.cuMemAlloc(&p, std::max<uint64_t>(bytes, 1)),
                       "allocating device memory");
        !s.ok())
      return s;
    if (auto s = Check(d_, d_.cuMemsetD8(p, 0, bytes), "zeroing"); !s.ok()) {
      d_.cuMemFree(p);
      return s;
    }
    return DevicePtr{p};
  }
  void Free(DevicePtr p, uint64_t) override {
    d_.cuCtxSetCurrent(ctx_);
    d_.cuMemFree(p);
  }
  absl::Status CopyIn(DevicePtr dst, const void* src, uint64_t n) override {
    d_.cuCtxSetCurrent(ctx_);
    return Check(d_, d_.cuMemcpyHtoD(dst, src, n), "copying to the device");
  }
  absl::Status CopyOut(void* dst, DevicePtr src, uint64_t n) override {
    d_.cuCtxSetCurrent(ctx_);
    return Check(d_, d_.cuMemcpyDtoH(dst, src, n), "copying from the device");
  }
  absl::StatusOr<std::unique_ptr<Module>> Load(
      const ModuleImage& image) override {
    if (image.ptx.empty())
      return absl::FailedPreconditionError(
          "the module has no PTX (kernels/<module>.ptx): build the function "
          "where nvcc is installed");
    d_.cuCtxSetCurrent(ctx_);
    std::string ptx = image.ptx;  // the driver wants it NUL-terminated
    CUmodule m = nullptr;
    if (auto s = Check(d_, d_.cuModuleLoadData(&m, ptx.c_str()),
                       "loading the module's PTX");
        !s.ok())
      return s;
    return std::make_unique<CudaModule>(d_, ctx_, m);
  }
  absl::Status Synchronize() override {
    d_.cuCtxSetCurrent(ctx_);
    return Check(d_, d_.cuCtxSynchronize(), "a launch failed");
  }

 private:
  const Driver& d_;
  CUcontext ctx_;
  std::string name_;
  uint64_t memory_;
};

}  // namespace

int CudaDeviceCount() {
  const auto& d = LoadDriver();
  if (!d.ok()) return 0;
  int n = 0;
  if (d->cuDeviceGetCount(&n) != kCudaSuccess) return 0;
  return n;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  const auto& d = LoadDriver();
  if (!d.ok()) return d.status();
  CUdevice dev = 0;
  if (d->cuDeviceGet(&dev, device) != kCudaSuccess)
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device ", device, " on this node"));
  char name[256] = {};
  d->cuDeviceGetName(name, sizeof(name) - 1, dev);
  size_t memory = 0;
  d->cuDeviceTotalMem(&memory, dev);
  CUcontext ctx = nullptr;
  if (auto s = Check(*d, d->cuCtxCreate(&ctx, 0, dev), "creating a context");
      !s.ok())
    return s;
  return std::unique_ptr<Backend>(
      new CudaBackend(*d, ctx, name, static_cast<uint64_t>(memory)));
}

}  // namespace silt::gpu
