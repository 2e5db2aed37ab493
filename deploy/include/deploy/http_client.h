// A small blocking HTTP/1.1 client for the CLI and the tests (Beast stays in
// the .cc).
#ifndef SILT_DEPLOY_HTTP_CLIENT_H_
#define SILT_DEPLOY_HTTP_CLIENT_H_

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::deploy {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpResult {
  int status = 0;
  Headers headers;
  std::string body;
  // First value of a header, case-insensitive; empty if absent.
  absl::string_view Header(absl::string_view name) const;
};

struct HttpCall {
  std::string method = "GET";
  std::string url;  // http://host:port/path?query
  Headers headers;
  std::string body;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Unavailable when the server cannot be reached; any HTTP status is a
// successful result.
absl::StatusOr<HttpResult> Send(const HttpCall& call);

// Like Send, but hands the body to `on_data` as it arrives (log streams); stops
// when on_data returns false. Returns the status code.
absl::StatusOr<int> SendStreaming(
    const HttpCall& call,
    const std::function<bool(absl::string_view)>& on_data);

// Normalises a gateway URL as faas-cli does: lower case, http:// when no
// scheme, no trailing slash.
std::string NormalizeGatewayUrl(absl::string_view url);

std::string UrlEncode(absl::string_view s);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_HTTP_CLIENT_H_
