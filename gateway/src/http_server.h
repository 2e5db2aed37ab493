// An HTTP/1.1 server on Boost.Beast: one acceptor, on caller-owned
// io_contexts, each run by one thread (connections are dealt to them in turn;
// a connection's handlers run on its context's thread).
// Private to the gateway (only gateway.cc includes it).
#ifndef SILT_GATEWAY_HTTP_SERVER_H_
#define SILT_GATEWAY_HTTP_SERVER_H_

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>  // Boost 1.74 Asio under C++20 + GCC 12 needs this first.
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "http_types.h"

namespace silt::gateway {

struct HttpServerOptions {
  // Largest request body accepted for a request path; larger → 413, connection
  // closed.
  std::function<size_t(absl::string_view path)> body_limit;
  // Routes whose request bodies over `stream_over` bytes (or chunked ones)
  // reach the handler in parts (HttpRequest::body_rest), as they arrive.
  std::function<bool(absl::string_view path)> streams;
  size_t stream_over = 1 << 20;
  size_t header_limit = 64 * 1024;
  // Time allowed to receive a request's headers (also the keep-alive idle
  // timeout), to receive its body, and to send a response.
  std::chrono::milliseconds header_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds body_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds write_timeout{std::chrono::seconds(60)};
};

// "ADDR:PORT", ":PORT" (all interfaces) or "[V6]:PORT".
absl::StatusOr<boost::asio::ip::tcp::endpoint> ParseListenAddress(
    absl::string_view addr);
std::string FormatEndpoint(const boost::asio::ip::tcp::endpoint& ep);

class HttpServer {
 public:
  // Accepts on the first of `contexts` (at least one); each connection runs
  // on one of them, in turn. Each context must be run by one thread.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Listen(
      const std::vector<boost::asio::io_context*>& contexts,
      absl::string_view listen, HttpServerOptions options, Handler handler);
  ~HttpServer();

  boost::asio::ip::tcp::endpoint local_endpoint() const;
  // Stops accepting; open connections finish their current exchange.
  void Close();

 private:
  struct Listener;
  explicit HttpServer(std::shared_ptr<Listener> l);
  std::shared_ptr<Listener> listener_;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_HTTP_SERVER_H_
