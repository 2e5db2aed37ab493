// bench_gpu's function.
//   ?op=launch&n=N&k=K: saxpy over N floats, K launches then a synchronize,
//     on buffers made on first use; answers the microseconds from the first
//     launch to the synchronize's answer.
//   ?op=fill&mib=M: a buffer "state-M" of M MiB, written with a pattern
//     (what a move carries); answers the sum of its first byte of every MiB.
//   ?op=check: that sum again (after moves).
#include <silt/function.h>

#include <chrono>
#include <string>
#include <vector>

namespace {

uint64_t Param(const silt::Request& req, std::string_view key, uint64_t dflt) {
  std::string_view q = req.query;
  while (!q.empty()) {
    auto amp = q.find('&');
    std::string_view kv = q.substr(0, amp);
    if (kv.size() > key.size() && kv.substr(0, key.size()) == key &&
        kv[key.size()] == '=')
      return std::strtoull(std::string(kv.substr(key.size() + 1)).c_str(),
                           nullptr, 10);
    if (amp == std::string_view::npos) break;
    q.remove_prefix(amp + 1);
  }
  return dflt;
}

std::string_view Op(const silt::Request& req) {
  auto at = req.query.find("op=");
  if (at == std::string_view::npos) return {};
  auto op = req.query.substr(at + 3);
  return op.substr(0, op.find('&'));
}

silt::Response Fail(const std::string& why) {
  return silt::Response::Text(500, why + "\n");
}

uint64_t Sample(silt::Gpu& gpu, const silt::GpuBuffer& b, std::string* err) {
  uint64_t sum = 0;
  for (uint64_t at = 0; at < b.bytes; at += 1 << 20) {
    auto byte = gpu.Read(b, at, 1);
    if (!byte.ok()) {
      *err = byte.message();
      return 0;
    }
    sum += static_cast<unsigned char>((*byte)[0]);
  }
  return sum;
}

}  // namespace

silt::Response Handle(const silt::Request& req, silt::Context& ctx) {
  auto gpu = ctx.Gpu();
  const std::string_view op = Op(req);
  if (op == "launch") {
    const uint64_t n = Param(req, "n", 1 << 22), k = Param(req, "k", 10);
    auto x = gpu.Alloc("x", n * sizeof(float));
    auto y = gpu.Alloc("y", n * sizeof(float));
    auto mod = gpu.Load("kernels");
    if (!x.ok() || !y.ok() || !mod.ok())
      return Fail(x.message() + y.message() + mod.message());
    const unsigned blocks = unsigned((n + 255) / 256);
    auto start = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < k; ++i)
      if (auto l = gpu.Launch(*mod, "saxpy", {blocks}, {256}, 1.0001f, x->In(),
                              *y, int(n));
          !l.ok())
        return Fail(l.message());
    if (auto s = gpu.Synchronize(); !s.ok()) return Fail(s.message());
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    return silt::Response::Text(200, std::to_string(us));
  }
  if (op == "fill" || op == "check") {
    const uint64_t bytes = Param(req, "mib", 64) << 20;
    auto b = gpu.Alloc("state-" + std::to_string(bytes >> 20), bytes);
    if (!b.ok()) return Fail(b.message());
    if (op == "fill") {
      std::string chunk(16 << 20, '\0');
      for (uint64_t at = 0; at < bytes; at += chunk.size()) {
        for (size_t i = 0; i < chunk.size(); i += 4096)
          chunk[i] = char((at + i) / 4096 * 7 + 1);
        if (auto s = gpu.Write(*b, at, chunk); !s.ok())
          return Fail(s.message());
      }
    }
    std::string err;
    uint64_t sum = Sample(gpu, *b, &err);
    if (!err.empty()) return Fail(err);
    return silt::Response::Text(200, std::to_string(sum));
  }
  return silt::Response::Text(400, "op=launch|fill|check\n");
}

SILT_HANDLER(Handle)
