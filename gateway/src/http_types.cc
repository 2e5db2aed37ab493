#include "http_types.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace silt::gateway {

absl::string_view HttpRequest::Header(absl::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, name)) return v;
  }
  return {};
}

bool HttpRequest::HasHeader(absl::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, name)) return true;
  }
  return false;
}

std::string HttpRequest::QueryParam(absl::string_view key) const {
  std::string value;
  for (absl::string_view part : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (UrlDecode(kv.first) == key) value = UrlDecode(kv.second);
  }
  return value;
}

bool HttpRequest::HasQuery(absl::string_view key) const {
  for (absl::string_view part : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (UrlDecode(kv.first) == key) return true;
  }
  return false;
}

void HttpResponse::SetHeader(absl::string_view name, std::string value) {
  for (auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, name)) {
      v = std::move(value);
      return;
    }
  }
  headers.emplace_back(std::string(name), std::move(value));
}

HttpResponse HttpResponse::Text(int status, absl::string_view message) {
  HttpResponse r;
  r.status = status;
  r.headers = {{"Content-Type", "text/plain; charset=utf-8"},
               {"X-Content-Type-Options", "nosniff"}};
  r.body = std::string(message);
  r.body.push_back('\n');
  return r;
}

HttpResponse HttpResponse::Json(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.headers = {{"Content-Type", "application/json"}};
  r.body = std::move(body);
  return r;
}

HttpResponse HttpResponse::Empty(int status) {
  HttpResponse r;
  r.status = status;
  return r;
}

std::string UrlDecode(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < s.size() && absl::ascii_isxdigit(s[i + 1]) &&
               absl::ascii_isxdigit(s[i + 2])) {
      auto hex = [](char h) {
        return absl::ascii_isdigit(h) ? h - '0'
                                      : absl::ascii_tolower(h) - 'a' + 10;
      };
      out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

bool IsHopByHop(absl::string_view header) {
  for (absl::string_view x :
       {"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
        "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}) {
    if (absl::EqualsIgnoreCase(header, x)) return true;
  }
  return false;
}

}  // namespace silt::gateway
