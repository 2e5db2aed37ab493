// Plain HTTP request/response values passed between the Beast server and the
// handlers, so that handlers and their tests never include Asio or Beast.
#ifndef SILT_GATEWAY_HTTP_TYPES_H_
#define SILT_GATEWAY_HTTP_TYPES_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::gateway {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

class BodyStream;

struct HttpRequest {
  std::string method;  // upper case, as sent
  std::string target;  // path + '?' + query, as sent
  std::string path;    // target before '?'
  std::string query;   // raw query after '?', without it
  HeaderList headers;
  std::string body;
  // When set, `body` is empty and the body comes from here as it arrives
  // (HttpServerOptions::streams); parts are Pulled one at a time, and a
  // body not read to its end closes the connection after the answer.
  std::shared_ptr<BodyStream> body_rest;
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

// A response body that comes in parts (a function streaming its answer).
// The server asks for each part once the one before is written, so a slow
// client slows its producer down instead of piling the body up here.
class BodyStream {
 public:
  struct Part {
    std::string bytes;
    bool last = false;  // the body ends with this part
  };
  using Next = std::function<void(absl::StatusOr<Part>)>;

  virtual ~BodyStream() = default;
  // Calls `next` exactly once, on any thread but never inside this call:
  // the next part, or why the body broke off (the client then sees it cut
  // short). Not again after a last part or an error.
  virtual void Pull(Next next) = 0;
  // No more parts are wanted (the client went away); a pending Pull may
  // still be answered, with an error.
  virtual void Cancel() = 0;
};

struct HttpResponse {
  int status = 200;
  HeaderList headers;
  std::string body;
  // When set, `body` is only the first part: the rest comes from `parts`,
  // sent with chunked encoding as it arrives (close-delimited for HTTP/1.0).
  std::shared_ptr<BodyStream> parts;
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
