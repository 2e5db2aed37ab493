// The gateway's HTTP API as anyone who can reach its port sees it: the input
// is a selector byte and then HTTP/1.1 requests back to back, parsed by Beast
// as the server parses them, each handed to the real router and handlers
// (Api::Handle, or Api::HandleMetricsPort) over a real store, bundle store,
// node registry (no invokers: calls fail fast) and async queue in a temp dir,
// with auth on. Every request must get an answer: never a crash, a hang, an
// exception (the server would turn it into a 500) or a 500 (an internal error
// a request should not be able to cause).
//
// Selector bits: 0-1 the Authorization header (0: the valid one replaces the
// request's, 2: none, 1 and 3: the request's own); 2 the metrics port.
#include <stdlib.h>

#include <boost/asio/io_context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "api.h"
#include "async_queue.h"
#include "bundles.h"
#include "metrics.h"
#include "nodes.h"
#include "store/store.h"

namespace silt::gateway {
namespace {

namespace http = boost::beast::http;

constexpr size_t kMaxRequests = 8;
constexpr uint32_t kHeaderLimit = 64 * 1024;  // HttpServerOptions::header_limit
constexpr size_t kMaxStreamBytes = 1 << 20;

// One gateway for the whole run (what a long-lived one sees is a sequence).
struct Target {
  std::string dir;
  // No node ever registers here: nothing runs on it.
  boost::asio::io_context ioc;
  std::unique_ptr<store::Store> store;
  Metrics metrics;
  std::unique_ptr<BundleStore> bundles;
  std::unique_ptr<NodeRegistry> nodes;
  std::unique_ptr<AsyncQueue> async;
  std::unique_ptr<Api> api;
  std::string authorization;  // the valid "Basic ..." value
};

[[noreturn]] void Fail(absl::string_view what, const absl::Status& s) {
  fprintf(stderr, "gateway_http_fuzz: %.*s: %s\n",
          static_cast<int>(what.size()), what.data(), s.ToString().c_str());
  abort();
}

Target* Start() {
  auto* t = new Target;
  char tmpl[] = "/tmp/silt-gateway-fuzz-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Fail("mkdtemp", absl::InternalError("failed"));
  t->dir = tmpl;
  auto store = store::Store::Open({.path = t->dir + "/store",
                                   .secrets_key = std::string(32, 'k'),
                                   .sync_writes = false});
  if (!store.ok()) Fail("store", store.status());
  t->store = *std::move(store);
  t->bundles =
      std::make_unique<BundleStore>(t->store.get(), t->dir + "/bundles");
  NodeRegistryOptions node_options{.listen = "127.0.0.1:0"};
  node_options.rebalancer.enabled = false;
  auto nodes =
      NodeRegistry::Start(node_options, {&t->ioc}, t->store.get(),
                          t->bundles.get(), /*images=*/nullptr, &t->metrics);
  if (!nodes.ok()) Fail("node registry", nodes.status());
  t->nodes = *std::move(nodes);
  AsyncQueueOptions async_options;
  async_options.max_attempts = 1;
  async_options.call_timeout = std::chrono::milliseconds(100);
  auto async = AsyncQueue::Start(async_options, t->store.get(), t->nodes.get());
  if (!async.ok()) Fail("async queue", async.status());
  t->async = *std::move(async);
  ApiOptions options;
  options.auth_enabled = true;
  options.credentials = {.user = "admin", .password = "fuzz-password"};
  options.max_system_body_bytes = 1 << 20;
  options.max_function_body_bytes = 1 << 20;
  options.max_async_body_bytes = 1 << 20;
  options.max_bundle_bytes = 1 << 20;
  // Bounds a followed log stream and a call (no node answers).
  options.upstream_timeout = std::chrono::milliseconds(100);
  t->authorization =
      absl::StrCat("Basic ", absl::Base64Escape("admin:fuzz-password"));
  t->api =
      std::make_unique<Api>(t->store.get(), &t->metrics, t->bundles.get(),
                            t->nodes.get(), std::move(options), t->async.get());
  return t;
}

// The answer to one request: set once by the handler, from any thread.
struct Answer {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  HttpResponse response;
};

// As the HTTP server builds it (http_server.cc).
HttpRequest ToRequest(http::request<http::string_body>& msg) {
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  size_t q = req.target.find('?');
  req.path = req.target.substr(0, q);
  if (q != std::string::npos) req.query = req.target.substr(q + 1);
  for (const auto& f : msg) {
    req.headers.emplace_back(std::string(f.name_string()),
                             std::string(f.value()));
  }
  req.body = std::move(msg.body());
  req.remote = "127.0.0.1:40000";
  req.version = msg.version();
  return req;
}

void Serve(Target& t, const HttpRequest& req, bool metrics_port) try {
  HttpResponse res;
  if (metrics_port) {
    res = t.api->HandleMetricsPort(req);
  } else {
    auto answer = std::make_shared<Answer>();
    t.api->Handle(req, [answer](HttpResponse r) {
      std::lock_guard<std::mutex> lock(answer->mu);
      if (answer->done) return;  // the server answers once too
      answer->response = std::move(r);
      answer->done = true;
      answer->cv.notify_all();
    });
    // A handler that never answers is a hang: libFuzzer's -timeout reports it.
    std::unique_lock<std::mutex> lock(answer->mu);
    answer->cv.wait(lock, [&] { return answer->done; });
    res = std::move(answer->response);
  }
  if (res.status < 100 || res.status > 599 || res.status == 500) {
    fprintf(stderr, "gateway_http_fuzz: %s %s answered %d: %s\n",
            req.method.c_str(), req.target.c_str(), res.status,
            res.body.c_str());
    abort();
  }
  if (res.stream) {
    size_t written = 0;
    res.stream([&written](absl::string_view chunk) {
      written += chunk.size();
      return written < kMaxStreamBytes;
    });
  }
} catch (const std::exception& e) {
  fprintf(stderr, "gateway_http_fuzz: %s %s threw: %s\n", req.method.c_str(),
          req.target.c_str(), e.what());
  abort();
}

}  // namespace
}  // namespace silt::gateway

using namespace silt::gateway;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Target* target = Start();
  if (size < 2) return 0;  // a selector and at least one byte of request
  uint8_t selector = data[0];
  boost::beast::flat_buffer buffer;
  auto in = buffer.prepare(size - 1);
  memcpy(in.data(), data + 1, size - 1);
  buffer.commit(size - 1);

  for (size_t n = 0; n < kMaxRequests && buffer.size() > 0; ++n) {
    // The header first, then the body under the route's limit (as the server).
    http::request_parser<http::string_body> parser;
    parser.header_limit(kHeaderLimit);
    parser.body_limit(std::numeric_limits<uint64_t>::max());
    parser.eager(false);
    boost::beast::error_code ec;
    while (!parser.is_header_done()) {
      size_t used = parser.put(buffer.data(), ec);
      buffer.consume(used);
      if (ec || used == 0) return 0;
    }
    absl::string_view path(parser.get().target().data(),
                           parser.get().target().size());
    size_t limit = target->api->BodyLimit(path.substr(0, path.find('?')));
    // 413 from the server: the handlers never see it.
    if (auto len = parser.content_length(); len && *len > limit) return 0;
    parser.body_limit(limit);
    parser.eager(true);
    while (!parser.is_done()) {
      size_t used = parser.put(buffer.data(), ec);
      buffer.consume(used);
      if (ec == http::error::need_more && used > 0) continue;
      if (ec || used == 0) return 0;
    }
    auto msg = parser.release();
    switch (selector & 3) {
      case 0:
        msg.set(http::field::authorization, target->authorization);
        break;
      case 2:
        msg.erase(http::field::authorization);
        break;
      default:
        break;
    }
    Serve(*target, ToRequest(msg), selector & 4);
  }
  return 0;
}
