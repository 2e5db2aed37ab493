// Plain HTTP request/response values passed between the Beast server and the
// handlers, so that handlers and their tests never include Asio or Beast.
#ifndef SILT_GATEWAY_HTTP_TYPES_H_
#define SILT_GATEWAY_HTTP_TYPES_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace silt::gateway {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // upper case, as sent
  std::string target;  // path + '?' + query, as sent
  std::string path;    // target before '?'
  std::string query;   // raw query after '?', without it
  HeaderList headers;
  std::string body;
  std::string remote;  // peer "ip:port"
  unsigned version = 11;

  // First value of a header, compared case-insensitively; empty if absent.
  absl::string_view Header(absl::string_view name) const;
  bool HasHeader(absl::string_view name) const;
  // Value of the last `key=` in the query, URL-decoded; nullopt-like empty when
  // absent (use HasQuery to tell apart).
  std::string QueryParam(absl::string_view key) const;
  bool HasQuery(absl::string_view key) const;
};

struct HttpResponse {
  int status = 200;
  HeaderList headers;
  std::string body;
  // When set, the body is produced by this function on its own thread and sent
  // with chunked encoding; `write` returns false once the client is gone.
  std::function<void(const std::function<bool(absl::string_view)>& write)>
      stream;

  void SetHeader(absl::string_view name, std::string value);
  // Go's http.Error: text/plain body with a trailing newline.
  static HttpResponse Text(int status, absl::string_view message);
  static HttpResponse Json(int status, std::string body);
  static HttpResponse Empty(int status);
};

using Reply = std::function<void(HttpResponse)>;
using Handler = std::function<void(HttpRequest, Reply)>;

std::string UrlDecode(absl::string_view s);
// Headers that describe one connection, not the message (RFC 9110 7.6.1):
// never forwarded between a client and a function.
bool IsHopByHop(absl::string_view header);

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_HTTP_TYPES_H_
