// A data pipeline as one Silt function, in three stages over function state:
//
//   produce    records into the sharded vector `input` (placed where memory
//              is free),
//   transform  each record into a digest, output[i] = Digest(input[i]), a
//              CPU-heavy step run as compute proclets (ctx.Map) on the nodes
//              with free CPU, near or far from the records,
//   reduce     the digests to one checksum with spawned tasks (ctx.Spawn),
//              one per slice, each reading its slice wherever it lives.
//
// POST /function/pipeline?op=... with query parameters:
//   op=produce&input=records&n=N&rounds=R   append N records (R hash rounds
//                                           each: the work per record)
//   op=transform&input=records&output=digests[&progress=1]
//                                           (progress: [[unix µs, done], ...]
//                                           at each share's end)
//   op=reduce&input=digests&parts=8
//   op=run&n=N&rounds=R[&tag=T]             all three on fresh vectors
//   op=transform-local / op=reduce-local    the same in this instance alone
//                                           (what the job must agree with)
//   op=scan&input=records                   one task reads every record
//   op=produce-map&input=M&n=N              N records into map M (id -> record)
//   op=scan-map&input=M                     one task reads every record of M
// Answers JSON; state errors as HTTP codes (404: no such vector, 409: wrong
// kind, 400: bad input).
#include <silt/function.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Record {
  uint64_t id;
  uint64_t rounds;  // work to do on it
  char payload[48];
};

// The transform: `rounds` rounds of a 64-bit mix over the record.
uint64_t Digest(const Record& r) {
  uint64_t h = r.id * 0x9E3779B97F4A7C15ull;
  for (uint64_t i = 0; i < r.rounds; ++i) {
    for (char c : r.payload)
      h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  return h;
}
SILT_TASK(Digest);

struct Slice {
  char input[64];
  uint64_t first, count;
};

// The reduction of one slice of the digests.
uint64_t SumSlice(silt::Context& ctx, const Slice& s) {
  auto v = ctx.Vector<uint64_t>(s.input);
  auto scan = v.Scan(s.first, s.count);
  uint64_t sum = 0;
  while (true) {
    auto block = scan.Next();
    if (!block.ok())
      throw std::runtime_error("reading digests: " + block.message());
    if (block->empty()) break;
    for (uint64_t d : *block) sum += d;
  }
  return sum;
}
SILT_TASK(SumSlice);

// A whole-vector aggregate as one task: sums the records' ids and payload
// bytes, wherever the records live; reports how long the scan itself took.
struct ScanResult {
  uint64_t records, sum;
  double ms;
};
ScanResult ScanRecords(silt::Context& ctx, const Slice& s) {
  auto start = std::chrono::steady_clock::now();
  auto v = ctx.Vector<Record>(s.input);
  auto scan = v.Scan(s.first, s.count);
  ScanResult out{0, 0, 0};
  while (true) {
    auto block = scan.Next();
    if (!block.ok())
      throw std::runtime_error("reading records: " + block.message());
    if (block->empty()) break;
    for (const Record& r : *block) {
      out.sum += r.id;
      for (char c : r.payload) out.sum += static_cast<uint8_t>(c);
    }
    out.records += block->size();
  }
  out.ms = std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - start)
               .count();
  return out;
}
SILT_TASK(ScanRecords);

// The same over records kept in a sharded map (id -> record), read with
// Map::Scan.
ScanResult ScanMapRecords(silt::Context& ctx, const Slice& s) {
  auto start = std::chrono::steady_clock::now();
  auto m = ctx.Map<uint64_t, Record>(s.input);
  auto scan = m.Scan();
  ScanResult out{0, 0, 0};
  while (true) {
    auto batch = scan.Next();
    if (!batch.ok())
      throw std::runtime_error("reading records: " + batch.message());
    if (batch->empty()) break;
    for (const auto& [id, r] : *batch) {
      out.sum += r.id;
      for (char c : r.payload) out.sum += static_cast<uint8_t>(c);
    }
    out.records += batch->size();
  }
  out.ms = std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - start)
               .count();
  return out;
}
SILT_TASK(ScanMapRecords);

std::string Param(std::string_view query, std::string_view key,
                  std::string fallback = "") {
  for (size_t pos = 0; pos <= query.size();) {
    size_t amp = query.find('&', pos);
    std::string_view kv =
        query.substr(pos, amp == query.npos ? query.npos : amp - pos);
    size_t eq = kv.find('=');
    if (kv.substr(0, eq) == key && eq != kv.npos)
      return std::string(kv.substr(eq + 1));
    if (amp == query.npos) break;
    pos = amp + 1;
  }
  return fallback;
}

uint64_t Number(std::string_view query, std::string_view key,
                uint64_t fallback) {
  std::string v = Param(query, key);
  return v.empty() ? fallback : std::strtoull(v.c_str(), nullptr, 10);
}

std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

struct Failure {
  silt::StateCode code;
  std::string message;
};

silt::Response Fail(const Failure& f) {
  using silt::StateCode;
  int status = f.code == StateCode::kNotFound    ? 404
               : f.code == StateCode::kWrongKind ? 409
               : f.code == StateCode::kInvalid   ? 400
               : f.code == StateCode::kTooLarge  ? 413
                                                 : 500;
  return silt::Response::Json(
      status, "{\"error\":\"" + std::string(silt::wire::StateCodeName(f.code)) +
                  "\",\"message\":" + Quote(f.message) + "}\n");
}

double Ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - since)
      .count();
}

template <typename T>
std::optional<Failure> Check(const silt::Result<T>& r) {
  if (r.ok()) return std::nullopt;
  return Failure{r.code(), r.message()};
}

// Appends n records; returns the first index.
silt::Result<uint64_t> Produce(silt::Context& ctx, const std::string& input,
                               uint64_t n, uint64_t rounds) {
  auto v = ctx.Vector<Record>(input);
  auto size = v.Size();
  if (!size.ok()) return size;
  uint64_t first = *size;
  auto grown = v.Extend(first + n);
  if (!grown.ok()) return grown;
  std::vector<Record> batch;
  for (uint64_t i = 0; i < n; i += batch.size()) {
    batch.clear();
    for (uint64_t j = i; j < n && batch.size() < 4096; ++j) {
      Record r{first + j, rounds, {}};
      snprintf(r.payload, sizeof(r.payload), "record %llu of the pipeline",
               static_cast<unsigned long long>(first + j));
      batch.push_back(r);
    }
    auto st = v.SetRange(first + i, batch);
    if (!st.ok()) return silt::Result<uint64_t>(st.code(), st.message());
  }
  return first;
}

// n records with ids [0, n) into the sharded map `input`.
silt::Status ProduceMap(silt::Context& ctx, const std::string& input,
                        uint64_t n) {
  auto m = ctx.Map<uint64_t, Record>(input);
  std::vector<std::pair<uint64_t, Record>> batch;
  for (uint64_t i = 0; i < n; i += batch.size()) {
    batch.clear();
    for (uint64_t j = i; j < n && batch.size() < 4096; ++j) {
      Record r{j, 0, {}};
      snprintf(r.payload, sizeof(r.payload), "record %llu of the pipeline",
               static_cast<unsigned long long>(j));
      batch.emplace_back(j, r);
    }
    if (auto st = m.MultiPut(batch); !st.ok()) return st;
  }
  return silt::Status(silt::Done{});
}

// Map's placement as JSON: {"node-a": elements, ...}.
std::string Placement(const std::vector<silt::JobPlacement>& ps) {
  std::string out = "{";
  for (const auto& p : ps) {
    if (out.size() > 1) out += ",";
    out += Quote(p.node) + ":" + std::to_string(p.elements);
  }
  return out + "}";
}

silt::Status Transform(silt::Context& ctx, const std::string& input,
                       const std::string& output,
                       std::string* placement = nullptr,
                       std::string* progress = nullptr) {
  auto in = ctx.Vector<Record>(input);
  auto out = ctx.Vector<uint64_t>(output);
  auto job = ctx.Map(in, Digest, out);
  silt::Status st = job.Get();
  if (placement != nullptr) *placement = Placement(job.placement());
  if (progress != nullptr) {  // [[unix µs, elements done], ...]
    *progress = "[";
    for (const auto& p : job.progress())
      *progress += (progress->size() > 1 ? ",[" : "[") +
                   std::to_string(p.unix_us) + "," + std::to_string(p.done) +
                   "]";
    *progress += "]";
  }
  return st;
}

// The same transform without compute proclets: this instance reads, digests
// and writes every record itself.
silt::Status TransformLocal(silt::Context& ctx, const std::string& input,
                            const std::string& output) {
  auto in = ctx.Vector<Record>(input);
  auto out = ctx.Vector<uint64_t>(output);
  auto size = in.Size();
  if (!size.ok()) return silt::Status(size.code(), size.message());
  if (auto g = out.Extend(*size); !g.ok())
    return silt::Status(g.code(), g.message());
  auto scan = in.Scan();
  uint64_t at = 0;
  while (true) {
    auto block = scan.Next();
    if (!block.ok()) return silt::Status(block.code(), block.message());
    if (block->empty()) break;
    std::vector<uint64_t> digests;
    for (const Record& r : *block) digests.push_back(Digest(r));
    if (auto st = out.SetRange(at, digests); !st.ok()) return st;
    at += block->size();
  }
  return silt::Status(silt::Done{});
}

silt::Result<uint64_t> Reduce(silt::Context& ctx, const std::string& input,
                              uint64_t parts) {
  auto v = ctx.Vector<uint64_t>(input);
  auto size = v.Size();
  if (!size.ok()) return size;
  if (input.size() >= sizeof(Slice::input))
    return silt::Result<uint64_t>(silt::StateCode::kInvalid, "name too long");
  parts = std::max<uint64_t>(1, std::min(parts, *size));
  std::vector<silt::Future<uint64_t>> sums;
  for (uint64_t p = 0; p < parts; ++p) {
    Slice s{};
    snprintf(s.input, sizeof(s.input), "%s", input.c_str());
    s.first = *size * p / parts;
    s.count = *size * (p + 1) / parts - s.first;
    sums.push_back(ctx.Spawn(SumSlice, s));
  }
  uint64_t total = 0;
  for (auto& f : sums) {
    const auto& r = f.Get();
    if (!r.ok()) return r;
    total += *r;
  }
  return total;
}

silt::Result<uint64_t> ReduceLocal(silt::Context& ctx,
                                   const std::string& input) {
  auto v = ctx.Vector<uint64_t>(input);
  auto scan = v.Scan();
  uint64_t sum = 0;
  while (true) {
    auto block = scan.Next();
    if (!block.ok())
      return silt::Result<uint64_t>(block.code(), block.message());
    if (block->empty()) break;
    for (uint64_t d : *block) sum += d;
  }
  return sum;
}

std::string Json(
    std::initializer_list<std::pair<const char*, std::string>> fields) {
  std::string out = "{";
  for (const auto& [k, v] : fields) {
    if (out.size() > 1) out += ",";
    out += "\"" + std::string(k) + "\":" + v;
  }
  return out + "}\n";
}

silt::Response Handle(const silt::Request& req, silt::Context& ctx) {
  const std::string op = Param(req.query, "op");
  const std::string input = Param(req.query, "input", "records");
  const std::string output = Param(req.query, "output", "digests");
  auto start = std::chrono::steady_clock::now();
  if (op == "produce") {
    uint64_t n = Number(req.query, "n", 1000);
    auto first = Produce(ctx, input, n, Number(req.query, "rounds", 100));
    if (auto f = Check(first)) return Fail(*f);
    return silt::Response::Json(200, Json({{"first", std::to_string(*first)},
                                           {"produced", std::to_string(n)},
                                           {"ms", std::to_string(Ms(start))}}));
  }
  if (op == "transform" || op == "transform-local") {
    std::string placement = "{}", progress = "[]";
    bool with_progress = Param(req.query, "progress") == "1";
    auto st = op == "transform" ? Transform(ctx, input, output, &placement,
                                            with_progress ? &progress : nullptr)
                                : TransformLocal(ctx, input, output);
    if (auto f = Check(st)) return Fail(*f);
    if (!with_progress)
      return silt::Response::Json(200, Json({{"ms", std::to_string(Ms(start))},
                                             {"placement", placement}}));
    return silt::Response::Json(200, Json({{"ms", std::to_string(Ms(start))},
                                           {"placement", placement},
                                           {"progress", progress}}));
  }
  if (op == "reduce" || op == "reduce-local") {
    auto sum = op == "reduce"
                   ? Reduce(ctx, input, Number(req.query, "parts", 8))
                   : ReduceLocal(ctx, input);
    if (auto f = Check(sum)) return Fail(*f);
    return silt::Response::Json(
        200, Json({{"sum", "\"" + std::to_string(*sum) + "\""},
                   {"ms", std::to_string(Ms(start))}}));
  }
  if (op == "produce-map") {
    uint64_t n = Number(req.query, "n", 10000);
    if (auto f = Check(ProduceMap(ctx, input, n))) return Fail(*f);
    return silt::Response::Json(200, Json({{"produced", std::to_string(n)},
                                           {"ms", std::to_string(Ms(start))}}));
  }
  if (op == "scan" || op == "scan-map") {  // one compute proclet reads all
    Slice s{};
    if (input.size() >= sizeof(s.input))
      return Fail({silt::StateCode::kInvalid, "name too long"});
    snprintf(s.input, sizeof(s.input), "%s", input.c_str());
    s.count = silt::wire::kAll;
    auto job = ctx.Spawn(op == "scan" ? ScanRecords : ScanMapRecords, s);
    const auto& r = job.Get();
    if (auto f = Check(r)) return Fail(*f);
    return silt::Response::Json(
        200, Json({{"records", std::to_string(r->records)},
                   {"sum", "\"" + std::to_string(r->sum) + "\""},
                   {"scan_ms", std::to_string(r->ms)},
                   {"placement", Placement(job.placement())},
                   {"ms", std::to_string(Ms(start))}}));
  }
  if (op == "run") {
    std::string tag = Param(req.query, "tag", std::string(ctx.call_id()));
    std::string records = "records-" + tag, digests = "digests-" + tag;
    uint64_t n = Number(req.query, "n", 10000);
    auto first = Produce(ctx, records, n, Number(req.query, "rounds", 100));
    if (auto f = Check(first)) return Fail(*f);
    double produce_ms = Ms(start);
    auto t = std::chrono::steady_clock::now();
    std::string placement;
    if (auto f = Check(Transform(ctx, records, digests, &placement)))
      return Fail(*f);
    double transform_ms = Ms(t);
    t = std::chrono::steady_clock::now();
    auto sum = Reduce(ctx, digests, Number(req.query, "parts", 8));
    if (auto f = Check(sum)) return Fail(*f);
    return silt::Response::Json(
        200, Json({{"records", std::to_string(n)},
                   {"sum", "\"" + std::to_string(*sum) + "\""},
                   {"produce_ms", std::to_string(produce_ms)},
                   {"transform_ms", std::to_string(transform_ms)},
                   {"placement", placement},
                   {"reduce_ms", std::to_string(Ms(t))}}));
  }
  return Fail({silt::StateCode::kInvalid,
               "op must be produce, transform, reduce, run, transform-local "
               "or reduce-local"});
}

}  // namespace

SILT_HANDLER(Handle)
