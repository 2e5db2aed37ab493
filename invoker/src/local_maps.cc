#include "local_maps.h"

#include <time.h>
#include <unistd.h>

#include "proclets/shard.h"
#include "silt/state_wire.h"

namespace silt::invoker {
namespace {

namespace wire = ::silt::wire;
using proclets::SharedMapShard;
using Read = SharedMapShard::Read;

// Reads that keep going to the invoker look for new local shards this often.
constexpr uint64_t kMissRefreshMs = 1000;
// A retired arena is looked up again no sooner than this.
constexpr uint64_t kStaleRefreshMs = 20;
// Names remembered at once (each holds a few mappings).
constexpr size_t kMaxMaps = 64;

uint64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace

void LocalMaps::Refresh(const std::string& name, Map& m, uint64_t now_ms) {
  m.views.clear();
  m.shared_ms = now_ms;
  m.stale = false;
  std::string request;
  wire::WriteRequestHeader(&request, wire::StateOp::kShareMap,
                           wire::StateKind::kMap, name);
  for (int fd : share_(request)) {
    auto view = SharedMapShard::Open(fd);  // closes fd when it fails
    if (view.ok()) m.views.push_back(*std::move(view));
  }
}

bool LocalMaps::TryAnswer(std::string_view request, std::string* reply) {
  wire::Reader r(request);
  wire::StateOp op;
  wire::StateKind kind;
  std::string_view name, key;
  if (!wire::ReadRequestHeader(&r, &op, &kind, &name) ||
      kind != wire::StateKind::kMap ||
      (op != wire::StateOp::kMapGet && op != wire::StateOp::kMapContains) ||
      !r.Str(&key) || !r.done() || key.size() > proclets::kMaxKeyBytes ||
      !wire::ValidStructureName(name))
    return false;
  auto it = maps_.find(name);
  if (it == maps_.end()) {
    if (maps_.size() >= kMaxMaps) maps_.clear();
    it = maps_.emplace(std::string(name), Map{}).first;
  }
  Map& m = it->second;
  const uint64_t now = NowMs();
  if (m.stale && now - m.shared_ms >= kStaleRefreshMs)
    Refresh(it->first, m, now);
  const uint64_t hash = proclets::KeyHash(key);
  std::string value;
  for (size_t i = 0; i < m.views.size(); ++i) {
    Read got = op == wire::StateOp::kMapGet ? m.views[i]->Get(key, hash, &value)
                                            : m.views[i]->Contains(key, hash);
    if (got == Read::kRetired) {
      m.views.erase(m.views.begin() + static_cast<std::ptrdiff_t>(i--));
      m.stale = true;
      continue;
    }
    if (got == Read::kNotHere) continue;
    // The same bytes the invoker would have sent.
    reply->clear();
    wire::Writer w(reply);
    if (op == wire::StateOp::kMapContains) {
      w.U8(static_cast<uint8_t>(wire::StateCode::kOk));
      w.U8(got == Read::kFound ? 1 : 0);
    } else if (got == Read::kFound) {
      w.U8(static_cast<uint8_t>(wire::StateCode::kOk));
      w.Str(value);
    } else {
      w.U8(static_cast<uint8_t>(wire::StateCode::kNotFound));
      w.Bytes("no such key");
    }
    return true;
  }
  // The invoker answers; perhaps a shard has come here since.
  if (now - m.shared_ms >= kMissRefreshMs) m.stale = true;
  return false;
}

}  // namespace silt::invoker
