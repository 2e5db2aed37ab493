// Function logs gathered from every node, and the gateway's own lines.
#include "nodes_impl.h"

namespace silt::gateway {

void NodeRegistry::Impl::Logs(const std::string& ns, const std::string& name,
                              int64_t since, int64_t tail, bool follow,
                              const std::function<bool(const LogRecord&)>& emit,
                              const std::function<bool()>& stop) {
  std::vector<std::shared_ptr<Node>> targets;
  {
    std::lock_guard<std::mutex> l(mu);
    for (auto& [n, node] : nodes) targets.push_back(node);
  }
  v1::LogsRequest req;
  req.set_name(name);
  req.set_namespace_(ns);
  req.set_since_unix_nanos(since);
  req.set_tail(tail);
  if (!follow) {
    std::vector<LogRecord> all;
    for (auto& node : targets) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
      auto reader = node->stub->Logs(&ctx, req);
      v1::LogEntry e;
      while (reader->Read(&e))
        all.push_back({e.name(), e.namespace_(), e.instance(), e.text(),
                       e.timestamp_unix_nanos()});
      reader->Finish().IgnoreError();
    }
    for (auto& g : gateway_log.Read(ns, name, 0, since))
      all.push_back({g.name, g.ns, "gateway", g.text, g.timestamp_unix_nanos});
    std::stable_sort(all.begin(), all.end(),
                     [](const LogRecord& a, const LogRecord& b) {
                       return a.timestamp_unix_nanos < b.timestamp_unix_nanos;
                     });
    size_t from = tail > 0 && all.size() > static_cast<size_t>(tail)
                      ? all.size() - tail
                      : 0;
    for (size_t i = from; i < all.size(); ++i)
      if (!emit(all[i])) return;
    return;
  }
  req.set_follow(true);
  std::mutex emit_mu;
  std::atomic<bool> closed{false};
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::thread> readers;
  for (auto& node : targets) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    grpc::ClientContext* ctx = ctxs.back().get();
    readers.emplace_back([&, node, ctx] {
      auto reader = node->stub->Logs(ctx, req);
      v1::LogEntry e;
      while (reader->Read(&e)) {
        std::lock_guard<std::mutex> l(emit_mu);
        if (closed) break;
        if (!emit({e.name(), e.namespace_(), e.instance(), e.text(),
                   e.timestamp_unix_nanos()}))
          closed = true;
      }
      reader->Finish().IgnoreError();
    });
  }
  // The gateway's own lines: those already there, then new ones as they
  // come (checked as often as the stop condition).
  uint64_t seen = 0;
  auto emit_gateway_lines = [&] {
    for (auto& g : gateway_log.Read(ns, name, seen, since)) {
      seen = g.seq;
      std::lock_guard<std::mutex> l(emit_mu);
      if (closed) return;
      if (!emit({g.name, g.ns, "gateway", g.text, g.timestamp_unix_nanos}))
        closed = true;
    }
  };
  while (!closed && !stop()) {
    emit_gateway_lines();
    std::unique_lock<std::mutex> l(stop_mu);
    if (stop_cv.wait_for(l, std::chrono::milliseconds(200),
                         [&] { return stopping; }))
      break;
  }
  closed = true;
  for (auto& c : ctxs) c->TryCancel();
  for (auto& t : readers) t.join();
}

}  // namespace silt::gateway
