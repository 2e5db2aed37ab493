#include "call_cmd.h"

#include <iostream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace silt::deploy {

using nlohmann::json;

void Logs(const Client& c, const std::string& name, const std::string& ns,
          bool follow, int lines, const std::string& since,
          const std::string& since_time, const std::string& output) {
  std::string q = "?name=" + UrlEncode(name);
  if (!ns.empty()) q += "&namespace=" + UrlEncode(ns);
  if (lines > 0) q += absl::StrCat("&tail=", lines);
  q += follow ? "&follow=true" : "&follow=false";
  std::string since_rfc = since_time;
  if (!since.empty()) {
    // "5m", "1h30m", "45s" back from now.
    int64_t secs = 0, cur = 0;
    for (char ch : since) {
      if (absl::ascii_isdigit(ch)) {
        cur = cur * 10 + (ch - '0');
      } else {
        int64_t mult = ch == 'h' ? 3600 : ch == 'm' ? 60 : ch == 's' ? 1 : -1;
        if (mult < 0)
          Fail(absl::StrCat("bad --since \"", since,
                            "\": use e.g. 30s, 5m, 1h"));
        secs += cur * mult;
        cur = 0;
      }
    }
    secs += cur;
    time_t t = time(nullptr) - secs;
    char buf[32];
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    since_rfc = buf;
  }
  if (!since_rfc.empty()) q += "&since=" + UrlEncode(since_rfc);
  HttpCall call;
  call.url = c.gateway + "/system/logs" + q;
  c.Authorize(call);
  std::string pending, error_body;
  int status = 0;
  auto r = SendStreaming(call, [&](absl::string_view data) {
    pending.append(data.data(), data.size());
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      json j = json::parse(line, nullptr, false);
      if (!j.is_object()) {
        error_body += line + "\n";
        continue;
      }
      if (output == "json") {
        std::cout << line << std::endl;
      } else if (output == "raw") {
        std::cout << j.value("text", "") << std::endl;
      } else {
        std::cout << j.value("timestamp", "") << " " << j.value("name", "")
                  << " (" << j.value("instance", "") << ") "
                  << j.value("text", "") << std::endl;
      }
    }
    return true;
  });
  if (!r.ok())
    Fail(absl::StrCat("Cannot connect to OpenFaaS on URL: ", c.gateway, ". ",
                      r.status().message()));
  status = *r;
  if (status == 401)
    Fail("unauthorized access, run \"silt login\" to set up credentials");
  if (status != 200)
    Fail(absl::StrCat("server returned unexpected status code: ", status, " - ",
                      Trimmed(error_body + pending)));
}

int Invoke(const Client& c, const std::string& name, const std::string& ns,
           const std::string& method, const std::vector<std::string>& headers,
           const std::vector<std::string>& query,
           const std::string& content_type, bool show_headers, bool async,
           const std::string& callback_url) {
  std::string body;
  if (!isatty(STDIN_FILENO)) body = ReadAll(std::cin);
  HttpCall call;
  call.method = async ? "POST" : method;
  if (!callback_url.empty())
    call.headers.emplace_back("X-Callback-Url", callback_url);
  std::string path = std::string(async ? "/async-function/" : "/function/") +
                     name + "." + (ns.empty() ? kDefaultNamespace : ns);
  std::string q;
  for (const auto& kv : query) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos)
      Fail(absl::StrCat("bad --query \"", kv, "\": expected KEY=VALUE"));
    q += (q.empty() ? "?" : "&") + UrlEncode(kv.substr(0, eq)) + "=" +
         UrlEncode(kv.substr(eq + 1));
  }
  call.url = c.gateway + path + q;
  call.body = body;
  call.headers.emplace_back("Content-Type", content_type);
  for (const auto& [k, v] : ParseKeyValues(headers, "--header"))
    call.headers.emplace_back(k, v);
  auto r = Send(call);
  if (!r.ok())
    Fail(absl::StrCat("Cannot connect to OpenFaaS on URL: ", c.gateway, ". ",
                      r.status().message()));
  if (show_headers) {
    std::cerr << "HTTP " << r->status << "\n";
    for (const auto& [k, v] : r->headers) std::cerr << k << ": " << v << "\n";
    std::cerr << std::endl;
  }
  if (r->status >= 400) {
    std::cerr << "Server returned unexpected status code: " << r->status
              << " - " << Trimmed(r->body) << std::endl;
    return 1;
  }
  if (async) {
    std::cerr << "Function submitted asynchronously." << std::endl;
    std::cout << r->Header("X-Call-Id") << std::endl;
    return 0;
  }
  std::cout << r->body << std::flush;
  return 0;
}

}  // namespace silt::deploy
