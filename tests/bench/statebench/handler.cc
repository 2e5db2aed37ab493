// The function bench_state deploys: it drives a shared map from inside its
// sandbox, the way a handler uses state, and reports what it measured.
//
//   /fill?keys=N&vsize=B             puts keys k0..k(N-1) with B-byte values
//   (all routes take &name=MAP, default "bench"; &shards=N&max_mib=M set the
//   map's options when the call creates it)
//   /run?op=get|put&keys=N&vsize=B&start=NS&end=NS
//        waits until CLOCK_REALTIME `start`, then does one operation after
//        another on random keys until `end`; the body is the latency of each
//        operation in nanoseconds (little-endian u32s).
#include <silt/function.h>
#include <time.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

std::string Param(std::string_view query, std::string_view key) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    std::string_view kv =
        query.substr(pos, amp == query.npos ? query.npos : amp - pos);
    size_t eq = kv.find('=');
    if (kv.substr(0, eq) == key)
      return std::string(eq == kv.npos ? "" : kv.substr(eq + 1));
    if (amp == query.npos) break;
    pos = amp + 1;
  }
  return "";
}

uint64_t Num(std::string_view query, std::string_view key, uint64_t def) {
  std::string v = Param(query, key);
  return v.empty() ? def : std::stoull(v);
}

uint64_t Now(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

silt::Response Handle(const silt::Request& req, silt::Context& ctx) {
  std::string name = Param(req.query, "name");
  silt::StateOptions options;
  options.initial_shards = static_cast<uint32_t>(Num(req.query, "shards", 0));
  options.max_shard_bytes = Num(req.query, "max_mib", 0) << 20;
  auto map =
      ctx.Map<std::string, std::string>(name.empty() ? "bench" : name, options);
  uint64_t keys = Num(req.query, "keys", 10000);
  std::string value(Num(req.query, "vsize", 64), 'v');
  if (req.path == "/fill") {
    std::vector<std::pair<std::string, std::string>> batch;
    for (uint64_t i = 0; i < keys; ++i) {
      batch.emplace_back("k" + std::to_string(i), value);
      if (batch.size() == 500 || i + 1 == keys) {
        auto r = map.MultiPut(batch);
        if (!r.ok()) return silt::Response::Text(503, r.message());
        batch.clear();
      }
    }
    return silt::Response::Text(200, "filled");
  }
  if (req.path != "/run") return silt::Response::Text(404, "no such route");
  bool put = Param(req.query, "op") == "put";
  uint64_t start = Num(req.query, "start", 0), end = Num(req.query, "end", 0);
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint32_t> lat;
  lat.reserve(1 << 20);
  timespec at{static_cast<time_t>(start / 1000000000),
              static_cast<long>(start % 1000000000)};
  while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &at, nullptr) != 0) {
  }
  uint64_t errors = 0;
  while (Now(CLOCK_REALTIME) < end) {
    std::string key = "k" + std::to_string(rng() % keys);
    uint64_t t0 = Now(CLOCK_MONOTONIC);
    bool ok = put ? map.Put(key, value).ok() : map.Get(key).ok();
    lat.push_back(static_cast<uint32_t>(Now(CLOCK_MONOTONIC) - t0));
    errors += !ok;
  }
  if (errors)
    return silt::Response::Text(500,
                                std::to_string(errors) + " operations failed");
  silt::Response res;
  res.status = 200;
  res.body.assign(reinterpret_cast<const char*>(lat.data()),
                  lat.size() * sizeof(uint32_t));
  return res;
}

}  // namespace

SILT_HANDLER(Handle)
