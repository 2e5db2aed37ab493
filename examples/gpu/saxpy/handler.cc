// y = a*x + y on the function's GPU proclet, with x[i] = i and y[i] = 2i,
// checked against the host's answer; a counter in device memory counts the
// calls the proclet has served (it outlives instances and moves with it).
// Its x-N and y-N buffers are scratch (rewritten by every call): asked to
// shrink (silt gpu resize, or a downgrade toward com.silt.gpu.min-memory),
// or told that its proclet is being moved (less to copy), its
// reconfiguration callback frees those of other sizes than its call's (a
// call of another instance using them at that moment fails and may be
// retried), and calls make them again within the new allocation, which the
// answer shows (limit=).
#include <silt/function.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

// The size this thread's call works on (the callback runs inside one of
// its requests to the proclet, so it keeps those buffers).
thread_local std::string in_use;

void Reconfigure(silt::Gpu& gpu, const silt::GpuInfo& now) {
  // Resized or moved already: nothing to adapt.
  if (now.pending_limit == 0 && now.moving_to.empty()) return;
  auto held = gpu.Buffers();  // whichever instance made them
  if (!held.ok()) return;
  for (const silt::GpuBuffer& b : *held)
    if ((b.name.rfind("x-", 0) == 0 || b.name.rfind("y-", 0) == 0) &&
        b.name.substr(2) != in_use)
      gpu.Free(b.name);
}

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

silt::Response Fail(std::string_view what, const std::string& why) {
  return silt::Response::Text(500, std::string(what) + ": " + why + "\n");
}

}  // namespace

silt::Response Handle(const silt::Request& req, silt::Context& ctx) {
  const uint64_t n = Param(req, "n", 1 << 20);
  const float a = float(Param(req, "a", 2));
  if (n == 0 || n > (64u << 20))
    return silt::Response::Text(400, "n must be from 1 to 67108864\n");
  auto gpu = ctx.Gpu();
  static const bool registered = [&gpu] {
    gpu.OnReconfigure(Reconfigure);
    return true;
  }();
  (void)registered;
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) x[i] = float(i), y[i] = float(2 * i);
  const std::string size = std::to_string(n);
  in_use = size;
  auto bx = gpu.Alloc("x-" + size, n * sizeof(float));
  auto by = gpu.Alloc("y-" + size, n * sizeof(float));
  auto calls = gpu.Alloc("calls", sizeof(unsigned long long));
  if (!bx.ok()) return Fail("alloc", bx.message());
  if (!by.ok()) return Fail("alloc", by.message());
  if (!calls.ok()) return Fail("alloc", calls.message());
  if (auto s = gpu.Write(*bx, x); !s.ok()) return Fail("write", s.message());
  if (auto s = gpu.Write(*by, y); !s.ok()) return Fail("write", s.message());
  auto mod = gpu.Load("saxpy");
  if (!mod.ok()) return Fail("load", mod.message());
  const unsigned blocks = unsigned((n + 255) / 256);
  if (auto l =
          gpu.Launch(*mod, "saxpy", {blocks}, {256}, a, bx->In(), *by, int(n));
      !l.ok())
    return Fail("launch", l.message());
  if (auto l = gpu.Launch(*mod, "count_call", {1}, {32}, *calls); !l.ok())
    return Fail("launch", l.message());
  auto out = gpu.Read<float>(*by);
  if (!out.ok()) return Fail("read", out.message());
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < n; ++i)
    if ((*out)[i] != a * float(i) + float(2 * i)) ++wrong;
  auto count = gpu.Read<unsigned long long>(*calls);
  auto info = gpu.Info();
  if (!count.ok()) return Fail("read", count.message());
  if (!info.ok()) return Fail("info", info.message());
  std::string body = (wrong == 0 ? "ok" : "WRONG") + std::string(" n=") + size +
                     " wrong=" + std::to_string(wrong) +
                     " calls=" + std::to_string((*count)[0]) +
                     " limit=" + std::to_string(info->memory_limit) +
                     " backend=" + info->backend + " device=" + info->device +
                     "\n";
  return silt::Response::Text(wrong == 0 ? 200 : 500, body);
}

SILT_HANDLER(Handle)
