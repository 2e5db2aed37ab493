// The host backend: device memory is this process's memory, a module is the
// host build of the kernels' source (silt/gpu_kernel.h), loaded from memory,
// and a launch runs its blocks on the node's cores before it returns.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/backend.h"
#include "silt/gpu_kernel_abi.h"

namespace silt::gpu {
namespace {

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string m = line.substr(colon + 1);
        m.erase(0, m.find_first_not_of(' '));
        return m;
      }
    }
  }
  return "CPU";
}

class HostModule : public Module {
 public:
  HostModule(void* handle, unsigned threads)
      : handle_(handle), threads_(threads) {}
  ~HostModule() override { dlclose(handle_); }

  absl::Status Launch(std::string_view kernel, Dim3 grid, Dim3 block,
                      uint32_t shared_bytes, void** args) override {
    if (shared_bytes != 0)
      return absl::UnimplementedError(
          "dynamic shared memory is not supported by the host backend: "
          "declare the kernel's __shared__ arrays with a fixed size");
    auto fn = Find(kernel);
    if (!fn.ok()) return fn.status();
    const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
    if (blocks == 0 || uint64_t{block.x} * block.y * block.z == 0)
      return absl::InvalidArgumentError("a launch's grid and block are >= 1");
    silt_kernel_launch l{};
    l.grid[0] = grid.x, l.grid[1] = grid.y, l.grid[2] = grid.z;
    l.block[0] = block.x, l.block[1] = block.y, l.block[2] = block.z;
    const unsigned n =
        static_cast<unsigned>(std::min<uint64_t>(threads_, blocks));
    std::vector<int> rc(n, 0);
    auto run = [&](unsigned i) {
      silt_kernel_launch part = l;
      part.block_begin = blocks * i / n;
      part.block_end = blocks * (i + 1) / n;
      rc[i] = (*fn)(&part, args);
    };
    std::vector<std::thread> helpers;
    helpers.reserve(n - 1);
    for (unsigned i = 1; i < n; ++i) helpers.emplace_back(run, i);
    run(0);
    for (auto& t : helpers) t.join();
    for (int r : rc)
      if (r != 0)
        return absl::ResourceExhaustedError(
            "the host backend could not map a stack for a block's threads");
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<silt_kernel_launch_fn> Find(std::string_view kernel) {
    std::string name(kernel);
    auto it = kernels_.find(name);
    if (it != kernels_.end()) return it->second;
    void* sym = dlsym(handle_, absl::StrCat(kSiltKernelPrefix, name).c_str());
    if (sym == nullptr)
      return absl::NotFoundError(absl::StrCat(
          "the module has no kernel ", name,
          " (is it extern \"C\" and exported with SILT_EXPORT_KERNEL?)"));
    auto fn = reinterpret_cast<silt_kernel_launch_fn>(sym);
    kernels_.emplace(name, fn);
    return fn;
  }

  void* handle_;
  unsigned threads_;
  std::map<std::string, silt_kernel_launch_fn, std::less<>> kernels_;
};

// dlopen from bytes: a memory file (no trace on disk), else a temporary one.
absl::StatusOr<void*> OpenLibrary(const std::string& bytes) {
  if (bytes.empty())
    return absl::FailedPreconditionError(
        "the module has no host build (kernels/<module>.host.so): rebuild the "
        "function with silt build");
  int fd = memfd_create("silt-kernels", MFD_CLOEXEC);
  std::string path;
  char tmp_path[] = "/tmp/silt-kernels-XXXXXX";
  bool temporary = false;
  if (fd >= 0) {
    path = absl::StrCat("/proc/self/fd/", fd);
    if (access(path.c_str(), R_OK) != 0) {  // no /proc here
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    fd = mkstemp(tmp_path);
    if (fd < 0)
      return absl::InternalError(
          absl::StrCat("making a file for the module: ", strerror(errno)));
    path = tmp_path;
    temporary = true;
  }
  size_t at = 0;
  while (at < bytes.size()) {
    ssize_t w = write(fd, bytes.data() + at, bytes.size() - at);
    if (w <= 0) {
      int e = errno;
      close(fd);
      if (temporary) unlink(tmp_path);
      return absl::InternalError(
          absl::StrCat("writing the module: ", strerror(e)));
    }
    at += static_cast<size_t>(w);
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string why = handle == nullptr ? dlerror() : "";
  close(fd);
  if (temporary) unlink(tmp_path);
  if (handle == nullptr)
    return absl::InvalidArgumentError(
        absl::StrCat("loading the module's host build: ", why));
  return handle;
}

class HostBackend : public Backend {
 public:
  explicit HostBackend(unsigned threads)
      : threads_(threads ? threads
                         : std::max(1u, std::thread::hardware_concurrency())),
        name_(absl::StrCat(CpuModel(), " (host backend, ", threads_,
                           " threads)")) {}

  BackendKind kind() const override { return BackendKind::kHost; }
  std::string device_name() const override { return name_; }
  uint64_t device_memory() const override {
    return uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  }

  absl::StatusOr<DevicePtr> Alloc(uint64_t bytes) override {
    // Anonymous pages: zeroed, and given back whole on Free.
    void* p = mmap(nullptr, std::max<uint64_t>(bytes, 1),
                   PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return absl::ResourceExhaustedError(
          absl::StrCat("allocating ", bytes, " bytes: ", strerror(errno)));
    return reinterpret_cast<DevicePtr>(p);
  }
  void Free(DevicePtr p, uint64_t bytes) override {
    munmap(reinterpret_cast<void*>(p), std::max<uint64_t>(bytes, 1));
  }
  absl::Status CopyIn(DevicePtr dst, const void* src, uint64_t n) override {
    memcpy(reinterpret_cast<void*>(dst), src, n);
    return absl::OkStatus();
  }
  absl::Status CopyOut(void* dst, DevicePtr src, uint64_t n) override {
    memcpy(dst, reinterpret_cast<const void*>(src), n);
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Module>> Load(
      const ModuleImage& image) override {
    auto handle = OpenLibrary(image.host_library);
    if (!handle.ok()) return handle.status();
    return std::make_unique<HostModule>(*handle, threads_);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  unsigned threads_;
  std::string name_;
};

}  // namespace

std::string_view BackendName(BackendKind kind) {
  return kind == BackendKind::kCuda ? "cuda" : "host";
}

std::unique_ptr<Backend> MakeHostBackend(unsigned threads) {
  return std::make_unique<HostBackend>(threads);
}

}  // namespace silt::gpu
