#include "deploy/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <utility>  // Boost 1.74 Asio under C++20 + GCC 12 needs this first.

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace silt::deploy {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct ParsedUrl {
  std::string host;
  std::string port;
  std::string target;
};

absl::StatusOr<ParsedUrl> ParseUrl(absl::string_view url) {
  if (absl::StartsWithIgnoreCase(url, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("https is not supported by this client: ", url));
  }
  if (!absl::ConsumePrefix(&url, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an http:// URL: ", url));
  }
  size_t slash = url.find('/');
  absl::string_view hostport = url.substr(0, slash);
  ParsedUrl p;
  p.target =
      slash == absl::string_view::npos ? "/" : std::string(url.substr(slash));
  if (absl::StartsWith(hostport, "[")) {
    size_t close = hostport.find(']');
    if (close == absl::string_view::npos)
      return absl::InvalidArgumentError(absl::StrCat("bad URL host: ", url));
    p.host = std::string(hostport.substr(1, close - 1));
    absl::string_view rest = hostport.substr(close + 1);
    p.port = absl::ConsumePrefix(&rest, ":") ? std::string(rest) : "80";
  } else {
    size_t colon = hostport.rfind(':');
    p.host = std::string(hostport.substr(0, colon));
    p.port = colon == absl::string_view::npos
                 ? "80"
                 : std::string(hostport.substr(colon + 1));
  }
  if (p.host.empty())
    return absl::InvalidArgumentError(absl::StrCat("no host in URL: ", url));
  return p;
}

// Connects to the call's server and sends the request; the caller reads the
// answer.
absl::Status Open(const HttpCall& call, beast::tcp_stream& stream) {
  auto url = ParseUrl(call.url);
  if (!url.ok()) return url.status();
  beast::error_code ec;
  tcp::resolver resolver(stream.get_executor());
  auto endpoints = resolver.resolve(url->host, url->port, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", url->host, ": ", ec.message()));
  }
  stream.expires_after(call.timeout);
  stream.connect(endpoints, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to ", url->host, ":", url->port, ": ", ec.message()));
  }
  http::request<http::string_body> req;
  req.method_string(call.method);
  req.target(url->target);
  req.version(11);
  req.set(http::field::host, absl::StrCat(url->host, ":", url->port));
  req.set(http::field::user_agent, "silt-cli");
  for (const auto& [k, v] : call.headers) req.set(k, v);
  req.body() = call.body;
  if (!call.body.empty() || call.method == "POST" || call.method == "PUT" ||
      call.method == "PATCH" || call.method == "DELETE") {
    req.prepare_payload();
  }
  req.keep_alive(false);
  http::write(stream, req, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("sending ", call.method, " ",
                                               call.url, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view HttpResult::Header(absl::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, name)) return v;
  }
  return {};
}

absl::StatusOr<HttpResult> Send(const HttpCall& call) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  if (auto s = Open(call, stream); !s.ok()) return s;
  beast::error_code ec;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());
  if (call.method == "HEAD") parser.skip(true);
  http::read(stream, buffer, parser, ec);
  // A connection closed before a whole answer (the server died) is no answer:
  // the parser's defaults would read as an empty 200.
  if (ec == http::error::end_of_stream && !parser.is_done())
    return absl::UnavailableError(
        absl::StrCat("the connection closed before an answer to ", call.method,
                     " ", call.url));
  if (ec && ec != http::error::end_of_stream) {
    return absl::UnavailableError(absl::StrCat("reading the answer to ",
                                               call.method, " ", call.url, ": ",
                                               ec.message()));
  }
  auto& res = parser.get();
  HttpResult out;
  out.status = static_cast<int>(res.result_int());
  for (const auto& f : res) {
    out.headers.emplace_back(std::string(f.name_string()),
                             std::string(f.value()));
  }
  out.body = std::move(res.body());
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return out;
}

absl::StatusOr<int> SendStreaming(
    const HttpCall& call,
    const std::function<bool(absl::string_view)>& on_data) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  if (auto s = Open(call, stream); !s.ok()) return s;
  stream.expires_never();  // a followed stream lasts as long as the server
                           // keeps it open
  beast::error_code ec;
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());
  http::read_header(stream, buffer, parser, ec);
  if (ec) return absl::UnavailableError(ec.message());
  int status = static_cast<int>(parser.get().result_int());
  char buf[8192];
  while (!parser.is_done()) {
    parser.get().body().data = buf;
    parser.get().body().size = sizeof(buf);
    http::read_some(stream, buffer, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) break;
    size_t n = sizeof(buf) - parser.get().body().size;
    if (n > 0 && !on_data(absl::string_view(buf, n))) break;
  }
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return status;
}

std::string NormalizeGatewayUrl(absl::string_view url) {
  std::string u = absl::AsciiStrToLower(absl::StripAsciiWhitespace(url));
  if (!absl::StartsWith(u, "http://") && !absl::StartsWith(u, "https://"))
    u = "http://" + u;
  while (absl::EndsWith(u, "/")) u.pop_back();
  return u;
}

std::string UrlEncode(absl::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' ||
        c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

}  // namespace silt::deploy
