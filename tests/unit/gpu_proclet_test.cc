// GPU proclets driven through the function SDK (silt/gpu.h), its requests
// served by a gpu::Proclet directly (what silt-gpu-host does behind the
// invoker): the host backend always, the CUDA backend where a GPU is.
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/backend.h"
#include "gpu/proclet.h"
#include "gtest/gtest.h"
#include "silt/gpu.h"

namespace silt::gpu {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ModuleImage TestKernels() {
  ModuleImage m;
  m.host_library = ReadAll(TEST_KERNELS_HOST);
  if (std::string(TEST_KERNELS_PTX).size() > 0)
    m.ptx = ReadAll(TEST_KERNELS_PTX);
  return m;
}

ProcletOptions Options(uint64_t limit = 0) {
  ProcletOptions o;
  o.memory_limit = limit;
  o.find_module = [](std::string_view name) -> absl::StatusOr<ModuleImage> {
    if (name != "kernels")
      return absl::NotFoundError("the function has no such module");
    return TestKernels();
  };
  return o;
}

// The SDK's state connection, answered by one proclet (the header the
// invoker strips is stripped here).
struct Host {
  Proclet* proclet;
  silt_state_api api{this, &Call};
  static int Call(void* host, const char* request, size_t len, void* out,
                  void (*append)(void*, const char*, size_t)) {
    wire::Reader r(std::string_view(request, len));
    wire::StateOp op;
    wire::StateKind kind;
    std::string_view name;
    if (!wire::ReadRequestHeader(&r, &op, &kind, &name) ||
        op != wire::StateOp::kGpu || kind != wire::StateKind::kGpu)
      return -1;
    std::string reply = static_cast<Host*>(host)->proclet->Serve(r.rest());
    append(out, reply.data(), reply.size());
    return 0;
  }
};

std::unique_ptr<Backend> Cuda() {
  auto b = MakeCudaBackend(0);
  return b.ok() ? *std::move(b) : nullptr;
}

class GpuProcletTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  std::unique_ptr<Backend> Make() {
    if (GetParam() == BackendKind::kHost) return MakeHostBackend();
    if (CudaDeviceCount() == 0) return nullptr;
    if (std::string(TEST_KERNELS_PTX).empty()) return nullptr;
    return Cuda();
  }
  void SetUp() override {
    auto b = Make();
    if (b == nullptr)
      GTEST_SKIP() << "no GPU here (no CUDA driver or device, or built "
                      "without nvcc): the CUDA backend's tests need one";
    proclet_ = std::make_unique<Proclet>(std::move(b), Options());
    host_.proclet = proclet_.get();
  }
  Gpu Sdk() { return Gpu(&host_.api, "default"); }

  std::unique_ptr<Proclet> proclet_;
  Host host_;
};

TEST_P(GpuProcletTest, SaxpyFromTheSdk) {
  Gpu gpu = Sdk();
  auto info = gpu.Info();
  ASSERT_TRUE(info.ok()) << info.message();
  EXPECT_EQ(info->backend, BackendName(GetParam()));
  EXPECT_FALSE(info->device.empty());
  const int n = 100000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = float(i), y[i] = float(2 * i);
  auto bx = gpu.Alloc("x", n * sizeof(float));
  auto by = gpu.Alloc("y", n * sizeof(float));
  ASSERT_TRUE(bx.ok() && by.ok()) << bx.message() << by.message();
  ASSERT_TRUE(gpu.Write(*bx, x).ok());
  ASSERT_TRUE(gpu.Write(*by, y).ok());
  auto m = gpu.Load("kernels");
  ASSERT_TRUE(m.ok()) << m.message();
  auto launch =
      gpu.Launch(*m, "saxpy", {(n + 255) / 256}, {256}, 3.0f, *bx, *by, n);
  ASSERT_TRUE(launch.ok()) << launch.message();
  EXPECT_EQ(*launch, 1u);
  auto out = gpu.Read<float>(*by);
  ASSERT_TRUE(out.ok()) << out.message();
  ASSERT_EQ(out->size(), size_t(n));
  for (int i = 0; i < n; ++i) ASSERT_EQ((*out)[i], 3.0f * i + 2 * i) << i;
  auto done = gpu.Synchronize();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(*done, 1u);
  EXPECT_EQ(proclet_->memory_used(), 2u * n * sizeof(float));
}

TEST_P(GpuProcletTest, BlocksSynchroniseThroughSharedMemory) {
  Gpu gpu = Sdk();
  const unsigned n = 1000003;  // not a multiple of the block
  std::vector<unsigned> in(n);
  std::iota(in.begin(), in.end(), 1u);
  auto bin = gpu.Alloc("in", n * sizeof(unsigned));
  auto total = gpu.Alloc("total", sizeof(unsigned long long));
  ASSERT_TRUE(bin.ok() && total.ok());
  ASSERT_TRUE(gpu.Write(*bin, in).ok());
  auto m = gpu.Load("kernels");
  ASSERT_TRUE(m.ok()) << m.message();
  ASSERT_TRUE(
      gpu.Launch(*m, "block_sum", {(n + 255) / 256}, {256}, *bin, n, *total)
          .ok());
  auto sum = gpu.Read<unsigned long long>(*total);
  ASSERT_TRUE(sum.ok()) << sum.message();
  EXPECT_EQ((*sum)[0], uint64_t{n} * (n + 1) / 2);
}

TEST_P(GpuProcletTest, BadRequestsAreClearErrors) {
  Gpu gpu = Sdk();
  auto b = gpu.Alloc("b", 64);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(gpu.Alloc("b", 128).code(), StateCode::kInvalid);
  EXPECT_EQ(gpu.Alloc("B!", 8).code(), StateCode::kInvalid);
  EXPECT_EQ(gpu.Read(*b, 60, 8).code(), StateCode::kInvalid);
  EXPECT_EQ(gpu.Read(GpuBuffer{"none", 8}, 0, 8).code(), StateCode::kNotFound);
  EXPECT_EQ(gpu.Load("other").code(), StateCode::kNotFound);
  GpuModule unloaded{"kernels"};
  EXPECT_EQ(gpu.Launch(unloaded, "saxpy", {1}, {1}, 1.0f, *b, *b, 0).code(),
            StateCode::kNotFound);
  auto m = gpu.Load("kernels");
  ASSERT_TRUE(m.ok());
  auto missing = gpu.Launch(*m, "no_such_kernel", {1}, {1}, 1);
  EXPECT_EQ(missing.code(), StateCode::kNotFound) << missing.message();
  EXPECT_EQ(gpu.Launch(*m, "saxpy", {1}, {2048}, 1.0f, *b, *b, 0).code(),
            StateCode::kInvalid);
  EXPECT_EQ(gpu.Launch(*m, "saxpy", {1}, {1}, 1.0f, GpuBuffer{"gone", 8}, *b, 0)
                .code(),
            StateCode::kNotFound);
  auto freed = gpu.Free("b");
  ASSERT_TRUE(freed.ok());
  EXPECT_TRUE(*freed);
  EXPECT_EQ(proclet_->memory_used(), 0u);
  // Garbage is an error, not a crash.
  for (std::string garbage :
       {std::string(), std::string("\x07"),
        std::string("\x07\xff\xff\xff\xff", 5), std::string("\x15\x01\x02", 3),
        std::string("\x63")})
    EXPECT_NE(proclet_->Serve(garbage)[0], 0) << garbage.size();
}

TEST_P(GpuProcletTest, TheMemoryLimitHolds) {
  auto b = Make();
  Proclet small(std::move(b), Options(1 << 20));
  host_.proclet = &small;
  Gpu gpu = Sdk();
  EXPECT_TRUE(gpu.Alloc("a", 768 << 10).ok());
  auto over = gpu.Alloc("b", 512 << 10);
  EXPECT_EQ(over.code(), StateCode::kTooLarge);
  EXPECT_NE(over.message().find("limit"), std::string::npos);
  EXPECT_TRUE(gpu.Alloc("c", 256 << 10).ok());
}

// Its state out of one backend and into another (the same kind here; the
// CUDA case below crosses kinds): buffers byte for byte, modules reloaded,
// the launch count kept, nothing launched in between.
void MoveAndCheck(Proclet& from, Proclet& to, const std::string& expect_y) {
  std::string state = from.Serve(std::string(1, char(wire::GpuOp::kExtract)));
  ASSERT_EQ(state[0], 0) << state.substr(1);
  // Paused: launches wait (kRetry) until the move ends.
  std::string launch = from.Serve(std::string(1, char(wire::GpuOp::kInfo)));
  EXPECT_EQ(launch[0], char(StateCode::kRetry));
  std::string inject(1, char(wire::GpuOp::kInject));
  inject.append(state, 1);
  std::string r = to.Serve(inject);
  ASSERT_EQ(r[0], 0) << r.substr(1);
  Host h{&to};
  Gpu gpu(&h.api, "default");
  auto y = gpu.Read(GpuBuffer{"y", expect_y.size()}, 0, expect_y.size());
  ASSERT_TRUE(y.ok()) << y.message();
  EXPECT_TRUE(*y == expect_y);
  auto info = gpu.Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->launches, from.launches());
}

TEST_P(GpuProcletTest, MovesToAnotherBackendByteForByte) {
  Gpu gpu = Sdk();
  const int n = 1 << 20;
  auto y = gpu.Alloc("y", n * sizeof(unsigned));
  ASSERT_TRUE(y.ok());
  std::vector<unsigned> start(n);
  for (int i = 0; i < n; ++i) start[i] = unsigned(i * 2654435761u);
  ASSERT_TRUE(gpu.Write(*y, start).ok());
  auto m = gpu.Load("kernels");
  ASSERT_TRUE(m.ok());
  for (int k = 0; k < 3; ++k)
    ASSERT_TRUE(gpu.Launch(*m, "increment", {n / 256}, {256}, *y, n).ok());
  for (auto& v : start) v += 3;
  std::string expect(reinterpret_cast<const char*>(start.data()),
                     start.size() * sizeof(unsigned));

  std::vector<std::unique_ptr<Backend>> targets;
  targets.push_back(MakeHostBackend(1));
  if (GetParam() == BackendKind::kCuda) targets.push_back(Cuda());
  for (auto& target : targets) {
    Proclet to(std::move(target), Options());
    MoveAndCheck(*proclet_, to, expect);
    // The moved proclet goes on where it stopped.
    Host h{&to};
    Gpu moved(&h.api, "default");
    GpuModule kernels{"kernels"};
    auto l = moved.Launch(kernels, "increment", {n / 256}, {256},
                          GpuBuffer{"y", n * sizeof(unsigned)}, n);
    ASSERT_TRUE(l.ok()) << l.message();
    EXPECT_EQ(*l, 4u);
    auto after = moved.Read<unsigned>(GpuBuffer{"y", n * sizeof(unsigned)});
    ASSERT_TRUE(after.ok());
    EXPECT_EQ((*after)[12345], start[12345] + 1);
    // The source, resumed (a move that failed), serves again.
    std::string resumed =
        proclet_->Serve(std::string(1, char(wire::GpuOp::kResume)));
    EXPECT_EQ(resumed[0], 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuProcletTest,
                         ::testing::Values(BackendKind::kHost,
                                           BackendKind::kCuda),
                         [](const auto& info) {
                           return std::string(BackendName(info.param));
                         });

}  // namespace
}  // namespace silt::gpu
