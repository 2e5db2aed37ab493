#include "autoscaler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace silt::gateway {
namespace {

constexpr absl::string_view kLabelPrefix = "com.openfaas.scale.";
// Kept decisions: kMeta "autoscale/<ns>/<name>" → the replicas, in decimal.
constexpr absl::string_view kStateKeyPrefix = "autoscale/";

std::string Key(const std::string& ns, const std::string& name) {
  return absl::StrCat(ns, "/", name);
}

absl::Status BadLabel(absl::string_view label, absl::string_view value,
                      absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat(
      "label ", kLabelPrefix, label, "=\"", value, "\" must be ", want));
}

// Go's time.ParseDuration for what labels hold: "15m", "90s", "1m30s",
// "500ms", "1.5h".
std::optional<absl::Duration> ParseGoDuration(absl::string_view s) {
  absl::Duration d;
  if (s == "0") return absl::ZeroDuration();
  if (s.empty() || !absl::ParseDuration(s, &d) || d < absl::ZeroDuration())
    return std::nullopt;
  return d;
}

}  // namespace

absl::string_view ScaleTypeName(ScaleType t) {
  switch (t) {
    case ScaleType::kRps:
      return "rps";
    case ScaleType::kCapacity:
      return "capacity";
    case ScaleType::kCpu:
      return "cpu";
  }
  return "rps";
}

absl::StatusOr<ScalePolicy> ParseScalePolicy(
    const std::map<std::string, std::string>& labels) {
  ScalePolicy p;
  auto get = [&](absl::string_view name) -> const std::string* {
    auto it = labels.find(absl::StrCat(kLabelPrefix, name));
    return it == labels.end() ? nullptr : &it->second;
  };
  for (absl::string_view opt_in :
       {"type", "target", "target-proportion", "max", "zero", "zero-duration"})
    if (get(opt_in)) p.autoscaled = true;
  if (const std::string* v = get("type")) {
    if (*v == "rps") {
      p.type = ScaleType::kRps;
    } else if (*v == "capacity" || *v == "inflight") {
      p.type = ScaleType::kCapacity;
    } else if (*v == "cpu") {
      p.type = ScaleType::kCpu;
    } else {
      return BadLabel("type", *v, "rps, capacity or cpu");
    }
  }
  if (const std::string* v = get("target")) {
    if (!absl::SimpleAtod(*v, &p.target) || !(p.target > 0) ||
        !std::isfinite(p.target))
      return BadLabel("target", *v, "a positive number");
  }
  if (const std::string* v = get("target-proportion")) {
    if (!absl::SimpleAtod(*v, &p.proportion) || !(p.proportion > 0) ||
        p.proportion > 1)
      return BadLabel("target-proportion", *v,
                      "a fraction above 0 and at most 1 (0.9 = 90%)");
  }
  if (const std::string* v = get("min")) {
    if (!absl::SimpleAtoi(*v, &p.min))
      return BadLabel("min", *v, "a non-negative integer");
  }
  if (const std::string* v = get("max")) {
    if (!absl::SimpleAtoi(*v, &p.max) || p.max == 0)
      return BadLabel("max", *v, "a positive integer");
  }
  // A min above the default max raises it; both given, deploy refuses it.
  if (p.min > p.max && !get("max")) p.max = p.min;
  if (const std::string* v = get("zero")) {
    if (*v == "true" || *v == "1") {
      p.zero = true;
    } else if (*v != "false" && *v != "0") {
      return BadLabel("zero", *v, "true or false");
    }
  }
  if (const std::string* v = get("zero-duration")) {
    auto d = ParseGoDuration(*v);
    if (!d) return BadLabel("zero-duration", *v, "a duration such as 15m");
    p.zero_duration = *d;
  }
  return p;
}

uint64_t ReplicasFor(const ScalePolicy& p, double load) {
  if (!(load > 0)) return 0;
  double n = std::ceil(load / (p.target * p.proportion));
  if (!(n < static_cast<double>(p.max))) return p.max;
  return std::max<uint64_t>(1, static_cast<uint64_t>(n));
}

absl::Status AutoscalerOptions::Validate() const {
  if (interval < absl::ZeroDuration())
    return absl::InvalidArgumentError("autoscaler interval must be >= 0");
  if (window <= absl::ZeroDuration())
    return absl::InvalidArgumentError("autoscaler window must be > 0");
  if (scale_down_delay < absl::ZeroDuration())
    return absl::InvalidArgumentError("scale-down delay must be >= 0");
  return absl::OkStatus();
}

struct Autoscaler::Impl {
  struct Sample {
    absl::Time at;
    uint64_t calls = 0;
    double inflight = 0;
    double cpu_cores = 0;
  };
  // One scaled function: what it saw and what it decided.
  struct State {
    std::deque<Sample> samples;                        // over the window
    std::deque<std::pair<absl::Time, uint64_t>> want;  // over the delay
    uint64_t desired = 0;
    uint64_t floor = 0;  // the user's count when last seen
    bool seen = false;   // sampled at least once since the start
    absl::Time active;   // the last call seen (or the start)
  };

  AutoscalerOptions options;
  Hooks hooks;
  store::Store* store = nullptr;
  Metrics* metrics = nullptr;

  // Held for a whole round: rounds never interleave (Tick from a test and
  // the thread).
  absl::Mutex round_mu;
  mutable absl::Mutex mu ABSL_ACQUIRED_AFTER(round_mu);
  std::map<std::string, State> states ABSL_GUARDED_BY(mu);  // by ns/name
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::thread thread;

  absl::Time Now() const { return options.now ? options.now() : absl::Now(); }

  void Loop() {
    while (true) {
      {
        absl::MutexLock l(&mu);
        auto stop = [this]()
                        ABSL_SHARED_LOCKS_REQUIRED(mu) { return stopping; };
        mu.AwaitWithTimeout(absl::Condition(&stop), options.interval);
        if (stopping) return;
      }
      Round();
    }
  }

  // The load the policy scales on, averaged over the window.
  static double LoadOf(const ScalePolicy& p, const std::deque<Sample>& s) {
    if (s.empty()) return 0;
    switch (p.type) {
      case ScaleType::kRps: {
        double secs = absl::ToDoubleSeconds(s.back().at - s.front().at);
        if (secs <= 0 || s.back().calls < s.front().calls) return 0;
        return static_cast<double>(s.back().calls - s.front().calls) / secs;
      }
      case ScaleType::kCapacity:
      case ScaleType::kCpu: {
        double sum = 0;
        for (const auto& x : s)
          sum += p.type == ScaleType::kCpu ? x.cpu_cores * 1000 : x.inflight;
        return sum / static_cast<double>(s.size());
      }
    }
    return 0;
  }

  static std::string Explain(const ScalePolicy& p, double load) {
    absl::string_view unit = p.type == ScaleType::kRps        ? " calls/s"
                             : p.type == ScaleType::kCapacity ? " in flight"
                                                              : "m CPU";
    return absl::StrFormat("%s load %.2f%s, target %g per replica x %.2f",
                           ScaleTypeName(p.type), load, unit, p.target,
                           p.proportion);
  }

  struct Change {
    std::string ns, name;
    std::optional<uint64_t> desired;  // nullopt: no longer scaled
    uint64_t from = 0;
    std::string why;
  };

  void Round() {
    absl::MutexLock round(&round_mu);
    std::vector<FunctionLoad> loads = hooks.loads();
    absl::Time now = Now();
    std::vector<Change> changes;
    std::map<std::string, ScaleGauge> gauges;
    {
      absl::MutexLock l(&mu);
      std::set<std::string> present;
      for (const FunctionLoad& f : loads) {
        std::string key = Key(f.ns, f.name);
        auto policy = ParseScalePolicy(f.labels);
        if (!policy.ok() || !policy->autoscaled) continue;
        present.insert(key);
        Decide(f, *policy, now, &changes, &gauges);
      }
      for (auto it = states.begin(); it != states.end();) {
        if (present.contains(it->first)) {
          ++it;
          continue;
        }
        size_t slash = it->first.find('/');
        changes.push_back({it->first.substr(0, slash),
                           it->first.substr(slash + 1), std::nullopt,
                           it->second.desired, ""});
        it = states.erase(it);
      }
    }
    if (metrics) metrics->AutoscalerState(std::move(gauges));
    Apply(changes);
  }

  // Caller holds mu. Samples one function and records a change of its
  // replicas in `changes`.
  void Decide(const FunctionLoad& f, const ScalePolicy& p, absl::Time now,
              std::vector<Change>* changes,
              std::map<std::string, ScaleGauge>* gauges)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    State& s = states[Key(f.ns, f.name)];
    uint64_t floor = std::min(f.replicas, p.max);
    bool first = !s.seen;
    bool user = !first && floor != s.floor;
    if (first) {
      s.seen = true;
      bool restored = !s.want.empty();
      // At zero before a restart: it stays there until a call comes.
      s.active = restored && s.desired == 0 ? absl::InfinitePast() : now;
      if (!restored) s.desired = floor;
    } else if (user) {
      // The user scaled it: that count holds from now on, and load seen
      // before it no longer argues for more.
      s.samples.clear();
      s.want.clear();
    }
    s.floor = floor;
    if (!s.samples.empty() &&
        (f.calls != s.samples.back().calls || f.inflight > 0))
      s.active = now;
    s.samples.push_back(
        {now, f.calls, static_cast<double>(f.inflight), f.cpu_cores});
    while (s.samples.size() > 1 && s.samples[1].at <= now - options.window)
      s.samples.pop_front();
    double load = LoadOf(p, s.samples);
    uint64_t wanted = ReplicasFor(p, load);
    s.want.emplace_back(now, wanted);
    while (!s.want.empty() &&
           s.want.front().first < now - options.scale_down_delay)
      s.want.pop_front();
    uint64_t stable = 0;
    for (const auto& [at, n] : s.want) stable = std::max(stable, n);
    uint64_t next = std::min(std::max(floor, stable), p.max);
    std::string why;
    bool idle = f.inflight == 0 && now - s.active >= p.zero_duration;
    if (p.zero && idle) {
      next = 0;
      why = absl::StrCat("no calls for ",
                         absl::FormatDuration(absl::Trunc(
                             now - s.active, absl::Milliseconds(100))),
                         " (com.openfaas.scale.zero-duration=",
                         absl::FormatDuration(p.zero_duration), ")");
    } else if (user) {
      why = absl::StrCat("the user asked for ", f.replicas,
                         " (/system/scale-function)");
    } else if (s.desired == 0 && next > 0) {
      why = "calls arrived while at zero";
    } else if (next > s.desired) {
      why = Explain(p, load);
    } else if (next < s.desired) {
      why = next == floor
                ? absl::StrCat("load low for ",
                               absl::FormatDuration(options.scale_down_delay),
                               "; back to the minimum (", Explain(p, load), ")")
                : absl::StrCat("load low for ",
                               absl::FormatDuration(options.scale_down_delay),
                               " (", Explain(p, load), ")");
    }
    (*gauges)[absl::StrCat(f.name, ".", f.ns)] = {
        next, load, std::string(ScaleTypeName(p.type))};
    if (first || next != s.desired) {
      changes->push_back({f.ns, f.name, next, s.desired, std::move(why)});
      s.desired = next;
    }
  }

  void Apply(const std::vector<Change>& changes) {
    store::WriteBatch batch;
    bool write = false;
    for (const Change& c : changes) {
      std::string key = absl::StrCat(kStateKeyPrefix, c.ns, "/", c.name);
      hooks.set_desired(c.ns, c.name, c.desired);
      if (!c.desired) {
        batch.Delete(store::Table::kMeta, key);
        write = true;
        continue;
      }
      batch.Put(store::Table::kMeta, key, absl::StrCat(*c.desired));
      write = true;
      if (c.why.empty()) continue;  // first sight: nothing changed
      std::string text = absl::StrCat("silt: autoscaler: replicas ", c.from,
                                      " -> ", *c.desired, ": ", c.why);
      fprintf(stderr, "silt-gateway: function %s.%s: %s\n", c.name.c_str(),
              c.ns.c_str(), text.c_str());
      if (hooks.log) hooks.log(c.ns, c.name, text);
      if (metrics) {
        metrics->ScaleEvent(absl::StrCat(c.name, ".", c.ns),
                            *c.desired == 0       ? "zero"
                            : *c.desired > c.from ? "up"
                                                  : "down");
      }
    }
    // Lost on a failed write: the decision still holds in memory, and the
    // next change writes again.
    if (write && store) store->Write(batch).IgnoreError();
  }

  // Decisions a previous run kept: the nodes get them before any round.
  absl::Status Restore() {
    if (!store) return absl::OkStatus();
    auto rows = store->Scan(store::Table::kMeta, kStateKeyPrefix);
    if (!rows.ok()) return rows.status();
    absl::MutexLock l(&mu);
    for (const auto& [key, value] : *rows) {
      if (!absl::StartsWith(key, kStateKeyPrefix)) continue;
      std::string fn = key.substr(kStateKeyPrefix.size());
      size_t slash = fn.find('/');
      uint64_t n = 0;
      if (slash == std::string::npos || !absl::SimpleAtoi(value, &n)) continue;
      State& s = states[fn];
      s.desired = n;
      // Held like any other decision: it comes down after the delay.
      s.want.emplace_back(Now(), n);
      hooks.set_desired(fn.substr(0, slash), fn.substr(slash + 1), n);
    }
    return absl::OkStatus();
  }
};

Autoscaler::Autoscaler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Autoscaler::~Autoscaler() {
  {
    absl::MutexLock l(&impl_->mu);
    impl_->stopping = true;
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

absl::StatusOr<std::unique_ptr<Autoscaler>> Autoscaler::Start(
    const AutoscalerOptions& options, Hooks hooks, store::Store* store,
    Metrics* metrics) {
  if (auto s = options.Validate(); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->hooks = std::move(hooks);
  impl->store = store;
  impl->metrics = metrics;
  if (auto s = impl->Restore(); !s.ok()) return s;
  std::unique_ptr<Autoscaler> a(new Autoscaler(std::move(impl)));
  if (options.interval > absl::ZeroDuration()) {
    Impl* p = a->impl_.get();
    p->thread = std::thread([p] { p->Loop(); });
  }
  return a;
}

void Autoscaler::Tick() { impl_->Round(); }

std::optional<uint64_t> Autoscaler::Desired(const std::string& ns,
                                            const std::string& name) const {
  absl::MutexLock l(&impl_->mu);
  auto it = impl_->states.find(Key(ns, name));
  if (it == impl_->states.end()) return std::nullopt;
  return it->second.desired;
}

}  // namespace silt::gateway
