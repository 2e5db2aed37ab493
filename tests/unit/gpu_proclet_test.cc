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

// A move's pre-copy: parts of the buffers go while the proclet runs on;
// what is written, freed or re-made meanwhile reaches the target through
// the pause's delta, which carries only that.
TEST_P(GpuProcletTest, PrecopyThenDeltaIsByteExactAndSmall) {
  Gpu gpu = Sdk();
  const int n = 1 << 20;  // 4 MiB each
  auto kernels = gpu.Load("kernels");
  ASSERT_TRUE(kernels.ok());
  std::vector<GpuBuffer> bufs;
  std::vector<std::vector<unsigned>> want;
  for (const char* name : {"a", "b", "c", "gone"}) {
    auto b = gpu.Alloc(name, n * sizeof(unsigned));
    ASSERT_TRUE(b.ok());
    std::vector<unsigned> v(n);
    for (int i = 0; i < n; ++i) v[i] = unsigned(i * 2654435761u + name[0]);
    ASSERT_TRUE(gpu.Write(*b, v).ok());
    bufs.push_back(*b);
    want.push_back(v);
  }
  auto precopy = [&](bool restart, bool* done) {
    std::string req(1, char(wire::GpuOp::kPrecopy));
    wire::Writer w(&req);
    w.U8(restart ? 1 : 0);
    w.U64(3 << 20);  // parts end inside buffers
    std::string part = proclet_->Serve(req);
    EXPECT_EQ(part[0], 0) << part.substr(1);
    *done = part[1] != 0;
    std::string inject(1, char(wire::GpuOp::kInject));
    inject.append(part, 2);
    return inject;
  };
  Proclet to(MakeHostBackend(1), Options());
  bool done = false;
  std::string first = precopy(true, &done);
  EXPECT_FALSE(done);
  ASSERT_EQ(to.Serve(first)[0], 0);
  // Between parts: "a" (copied already) is launched on, "c" (not reached)
  // written, "gone" freed, "b" re-made at another size.
  ASSERT_TRUE(
      gpu.Launch(*kernels, "increment", {n / 256}, {256}, bufs[0], n).ok());
  for (auto& v : want[0]) v += 1;
  want[2][7] = 77;
  ASSERT_TRUE(gpu.Write(bufs[2], 7 * sizeof(unsigned),
                        std::string(reinterpret_cast<char*>(&want[2][7]), 4))
                  .ok());
  ASSERT_TRUE(gpu.Free(bufs[3].name).ok());
  ASSERT_TRUE(gpu.Free(bufs[1].name).ok());
  auto b2 = gpu.Alloc("b", 4096);
  ASSERT_TRUE(b2.ok());
  while (!done) ASSERT_EQ(to.Serve(precopy(false, &done))[0], 0);
  // A second pass copies what was written during the first: "a" (launched
  // on after its copy began), not "c" (written before it was reached).
  size_t second = 0;
  do {
    std::string part = precopy(false, &done);
    second += part.size();
    ASSERT_EQ(to.Serve(part)[0], 0);
  } while (!done);
  EXPECT_GE(second, n * sizeof(unsigned));
  EXPECT_LT(second, 2 * n * sizeof(unsigned));
  // Launched on again: the pause carries "a" alone.
  ASSERT_TRUE(
      gpu.Launch(*kernels, "increment", {n / 256}, {256}, bufs[0], n).ok());
  for (auto& v : want[0]) v += 1;
  std::string delta =
      proclet_->Serve(std::string{char(wire::GpuOp::kExtract), char{1}});
  ASSERT_EQ(delta[0], 0) << delta.substr(1);
  EXPECT_GE(delta.size(), n * sizeof(unsigned));
  EXPECT_LT(delta.size(), 2 * n * sizeof(unsigned));
  std::string inject(1, char(wire::GpuOp::kInject));
  inject.append(delta, 1);
  ASSERT_EQ(to.Serve(inject)[0], 0);

  Host h{&to};
  Gpu moved(&h.api, "default");
  for (int i : {0, 2}) {
    auto got = moved.Read<unsigned>(bufs[i]);
    ASSERT_TRUE(got.ok()) << got.message();
    EXPECT_TRUE(*got == want[i]) << "buffer " << i;
  }
  auto b = moved.Read<unsigned>(*b2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->size(), 1024u);
  EXPECT_EQ((*b)[0], 0u);
  EXPECT_EQ(moved.Read<unsigned>(bufs[3]).code(), StateCode::kNotFound);
  auto info = moved.Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->launches, 2u);
  EXPECT_EQ(info->memory_used, 2 * n * sizeof(unsigned) + 4096);
}

// Parts that end exactly where a buffer ends lose none of the next ones; a
// buffer a launch only reads (In()) is not copied again.
TEST_P(GpuProcletTest, PrecopyPartsEndingOnABufferBoundaryLoseNothing) {
  Gpu gpu = Sdk();
  auto kernels = gpu.Load("kernels");
  ASSERT_TRUE(kernels.ok());
  for (const char* name : {"a", "b", "c"}) {
    auto b = gpu.Alloc(name, 1 << 20);
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE(gpu.Write(*b, 0, std::string(1 << 20, name[0])).ok());
  }
  const GpuBuffer a{"a", 1 << 20}, b{"b", 1 << 20};
  Proclet to(MakeHostBackend(1), Options());
  bool done = false;
  for (bool restart = true; !done; restart = false) {
    std::string req(1, char(wire::GpuOp::kPrecopy));
    wire::Writer w(&req);
    w.U8(restart ? 1 : 0);
    w.U64(1 << 20);
    std::string part = proclet_->Serve(req);
    ASSERT_EQ(part[0], 0);
    done = part[1] != 0;
    std::string inject(1, char(wire::GpuOp::kInject));
    inject.append(part, 2);
    ASSERT_EQ(to.Serve(inject)[0], 0);
  }
  // b = a + b: the pause carries b, not a.
  ASSERT_TRUE(gpu.Launch(*kernels, "saxpy", {1 << 10}, {256}, 1.0f, a.In(), b,
                         int(1 << 18))
                  .ok());
  auto want_b = gpu.Read(b, 0, 1 << 20);
  ASSERT_TRUE(want_b.ok());
  std::string delta =
      proclet_->Serve(std::string{char(wire::GpuOp::kExtract), char{1}});
  ASSERT_EQ(delta[0], 0);
  EXPECT_GE(delta.size(), 1u << 20);
  EXPECT_LT(delta.size(), (1u << 20) + 4096);
  std::string inject(1, char(wire::GpuOp::kInject));
  inject.append(delta, 1);
  ASSERT_EQ(to.Serve(inject)[0], 0);
  Host h{&to};
  Gpu moved(&h.api, "default");
  for (const char* name : {"a", "b", "c"}) {
    auto got = moved.Read(GpuBuffer{name, 1 << 20}, 0, 1 << 20);
    ASSERT_TRUE(got.ok()) << name << ": " << got.message();
    EXPECT_TRUE(*got ==
                (name[0] == 'b' ? *want_b : std::string(1 << 20, name[0])))
        << name;
  }
}

// A buffer freed after its copy went is dropped at the target before what
// replaced it arrives: the target never holds both (its limit is the
// source's).
TEST_P(GpuProcletTest, BuffersFreedDuringAMoveAreDroppedAtTheTarget) {
  auto b = Make();
  Proclet small(std::move(b), Options(6 << 20));
  host_.proclet = &small;
  Gpu gpu = Sdk();
  ASSERT_TRUE(gpu.Alloc("a", 4 << 20).ok());
  Proclet to(MakeHostBackend(1), Options(6 << 20));
  auto pass = [&](bool restart) {
    bool done = false;
    for (bool first = true; !done; first = false) {
      std::string req(1, char(wire::GpuOp::kPrecopy));
      wire::Writer w(&req);
      w.U8(restart && first ? 1 : 0);
      w.U64(1 << 20);
      std::string part = small.Serve(req);
      ASSERT_EQ(part[0], 0);
      done = part[1] != 0;
      std::string inject(1, char(wire::GpuOp::kInject));
      inject.append(part, 2);
      std::string r = to.Serve(inject);
      ASSERT_EQ(r[0], 0) << r.substr(1);
    }
  };
  pass(true);
  ASSERT_TRUE(gpu.Free("a").ok());
  auto bb = gpu.Alloc("b", 4 << 20);
  ASSERT_TRUE(bb.ok());
  ASSERT_TRUE(gpu.Write(*bb, 0, std::string(4 << 20, 'b')).ok());
  pass(false);
  std::string delta =
      small.Serve(std::string{char(wire::GpuOp::kExtract), char{1}});
  ASSERT_EQ(delta[0], 0);
  std::string inject(1, char(wire::GpuOp::kInject));
  inject.append(delta, 1);
  ASSERT_EQ(to.Serve(inject)[0], 0);
  Host h{&to};
  Gpu moved(&h.api, "default");
  EXPECT_EQ(moved.Read(GpuBuffer{"a", 4 << 20}, 0, 1).code(),
            StateCode::kNotFound);
  auto got = moved.Read(*bb, 0, 4 << 20);
  ASSERT_TRUE(got.ok()) << got.message();
  EXPECT_TRUE(*got == std::string(4 << 20, 'b'));
  // A limit past the device's memory is refused, not taken.
  std::string req(1, char(wire::GpuOp::kSetLimit));
  wire::Writer(&req).U64(~uint64_t{0});
  EXPECT_EQ(to.Serve(req)[0], char(StateCode::kInvalid));
  host_.proclet = proclet_.get();
}

// The reconfiguration API: an instance's callback runs once with the
// proclet as it is, then on its first call after each change; asked to
// shrink below what it holds (pending_limit), it frees, the allocation
// applies, and it hears of that too.
TEST_P(GpuProcletTest, ReconfigurationCallbacksSeeResizes) {
  Gpu gpu = Sdk();
  std::vector<GpuInfo> seen;
  gpu.OnReconfigure([&seen](Gpu& g, const GpuInfo& now) {
    seen.push_back(now);
    if (now.pending_limit > 0) {
      EXPECT_TRUE(g.Free("big").ok());
    }
  });
  struct Unregister {  // the callbacks are the process's
    Gpu& gpu;
    ~Unregister() { gpu.OnReconfigure(nullptr); }
  } unregister{gpu};
  auto big = gpu.Alloc("big", 8 << 20);
  ASSERT_TRUE(big.ok()) << big.message();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].pending_limit, 0u);
  ASSERT_TRUE(gpu.Alloc("small", 1 << 20).ok());
  EXPECT_EQ(seen.size(), 1u);  // nothing changed
  auto listed = gpu.Buffers();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].name, "big");
  EXPECT_EQ((*listed)[1].bytes, 1u << 20);

  // The invoker asks for 4 MiB: it holds 9.
  std::string req(1, char(wire::GpuOp::kSetLimit));
  wire::Writer(&req).U64(4 << 20);
  ASSERT_EQ(proclet_->Serve(req)[0], 0);
  auto info = gpu.Info();  // the callback frees first
  ASSERT_TRUE(info.ok()) << info.message();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].pending_limit, 4u << 20);
  EXPECT_EQ(seen[2].pending_limit, 0u);
  EXPECT_EQ(seen[2].memory_limit, 4u << 20);
  EXPECT_EQ(info->memory_limit, 4u << 20);
  EXPECT_EQ(info->memory_used, 1u << 20);
  EXPECT_EQ(gpu.Alloc("again", 8 << 20).code(), StateCode::kTooLarge);
  // A move is a change too: the callback hears of it while it is under way
  // (the invoker's kMoving, before the pre-copy)...
  auto moving = [](std::string_view backend, uint64_t limit) {
    std::string req(1, char(wire::GpuOp::kMoving));
    wire::Writer w(&req);
    w.Str(backend);
    w.Str(backend.empty() ? "" : "the target's CPU");
    w.U64(limit);
    return req;
  };
  ASSERT_EQ(proclet_->Serve(moving("host", 4 << 20))[0], 0);
  ASSERT_TRUE(gpu.Info().ok());
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[3].moving_to, "host");
  EXPECT_EQ(seen[3].moving_to_device, "the target's CPU");
  EXPECT_EQ(seen[3].moving_to_limit, 4u << 20);
  // ... and once it is done, on the target.
  std::string state =
      proclet_->Serve(std::string(1, char(wire::GpuOp::kExtract)));
  ASSERT_EQ(state[0], 0);
  Proclet to(MakeHostBackend(1), Options(4 << 20));
  std::string inject(1, char(wire::GpuOp::kInject));
  inject.append(state, 1);
  ASSERT_EQ(to.Serve(inject)[0], 0);
  host_.proclet = &to;
  ASSERT_TRUE(gpu.Info().ok());
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[4].backend, "host");
  EXPECT_TRUE(seen[4].moving_to.empty());
  EXPECT_GT(seen[4].generation, seen[3].generation);
  // A kSince inside a kSince is malformed.
  std::string wrapped(1, char(wire::GpuOp::kSince));
  wire::Writer(&wrapped).U64(seen[4].generation);
  wrapped.push_back(char(wire::GpuOp::kSince));
  EXPECT_EQ(to.Serve(wrapped)[0], char(StateCode::kInvalid));
  // A move called off (kResume after the pause, as here, or kMoving with
  // no backend before it) is a change back.
  ASSERT_EQ(to.Serve(moving("cuda", 4 << 20))[0], 0);
  ASSERT_TRUE(gpu.Info().ok());
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen[5].moving_to, "cuda");
  ASSERT_EQ(to.Serve(std::string(1, char(wire::GpuOp::kExtract)))[0], 0);
  ASSERT_EQ(to.Serve(std::string(1, char(wire::GpuOp::kResume)))[0], 0);
  ASSERT_TRUE(gpu.Info().ok());
  ASSERT_EQ(seen.size(), 7u);
  EXPECT_TRUE(seen[6].moving_to.empty());
  ASSERT_EQ(to.Serve(moving("host", 4 << 20))[0], 0);
  ASSERT_EQ(to.Serve(moving("", 0))[0], 0);
  ASSERT_TRUE(gpu.Info().ok());
  ASSERT_EQ(seen.size(), 8u);
  EXPECT_TRUE(seen[7].moving_to.empty());
  // Calling off what is not under way changes nothing.
  ASSERT_EQ(to.Serve(moving("", 0))[0], 0);
  ASSERT_TRUE(gpu.Info().ok());
  EXPECT_EQ(seen.size(), 8u);
  host_.proclet = proclet_.get();
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuProcletTest,
                         ::testing::Values(BackendKind::kHost,
                                           BackendKind::kCuda),
                         [](const auto& info) {
                           return std::string(BackendName(info.param));
                         });

}  // namespace
}  // namespace silt::gpu
