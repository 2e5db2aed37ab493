#include "async_cmd.h"

#include <chrono>
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace silt::deploy {
namespace {

using nlohmann::json;

std::string Query(const AsyncSelection& sel) {
  std::string q;
  auto add = [&](absl::string_view k, const std::string& v) {
    if (!v.empty())
      absl::StrAppend(&q, q.empty() ? "?" : "&", k, "=", UrlEncode(v));
  };
  add("namespace", sel.ns);
  add("function", sel.function);
  add("state", sel.state);
  return q;
}

int Error(const HttpResult& r) {
  std::cerr << "error (" << r.status
            << "): " << absl::StripTrailingAsciiWhitespace(r.body) << std::endl;
  return 1;
}

std::string Age(int64_t unix_ms) {
  int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  int64_t s = std::max<int64_t>(0, (now - unix_ms) / 1000);
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  if (s < 172800) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

}  // namespace

int AsyncList(const Requester& send, const AsyncSelection& sel,
              const std::string& output) {
  HttpResult r = send("GET", "/system/async" + Query(sel), "");
  if (r.status != 200) return Error(r);
  json list = json::parse(r.body, nullptr, false);
  if (!list.is_array()) {
    std::cerr << "cannot parse the async queue from the gateway" << std::endl;
    return 1;
  }
  if (output == "json") {
    std::cout << list.dump(2) << std::endl;
    return 0;
  }
  std::printf("%-38s %-24s %-9s %-8s %-5s %-6s %s\n", "CALL ID", "FUNCTION",
              "STATE", "ATTEMPTS", "AGE", "STATUS", "LAST ERROR");
  for (const auto& c : list) {
    std::string fn = c.value("function", "");
    if (c.value("namespace", "") != "openfaas-fn")
      fn += "." + c.value("namespace", "");
    std::string state = c.value("state", "");
    if (c.value("running", false)) state = "running";
    int status = c.value("lastStatus", 0);
    std::printf("%-38s %-24s %-9s %-8u %-5s %-6s %s\n",
                c.value("callId", "").c_str(), fn.c_str(), state.c_str(),
                c.value("attempts", 0u),
                Age(c.value("enqueuedUnixMs", int64_t{0})).c_str(),
                status ? absl::StrCat(status).c_str() : "-",
                c.value("lastError", "").c_str());
  }
  return 0;
}

int AsyncRetry(const Requester& send, const std::vector<std::string>& ids,
               bool all, const AsyncSelection& sel) {
  if (all == !ids.empty()) {
    std::cerr << "give call ids or --all (not both)" << std::endl;
    return 2;
  }
  if (all) {
    HttpResult r = send("POST", "/system/async/retry" + Query(sel), "");
    if (r.status != 200) return Error(r);
    json j = json::parse(r.body, nullptr, false);
    std::cout << "Retrying " << (j.is_object() ? j.value("retried", 0) : 0)
              << " dead letter(s)." << std::endl;
    return 0;
  }
  int rc = 0;
  for (const auto& id : ids) {
    HttpResult r =
        send("POST", "/system/async/" + UrlEncode(id) + "/retry", "");
    if (r.status != 202) {
      rc = Error(r);
      continue;
    }
    std::cout << "Retrying " << id << "." << std::endl;
  }
  return rc;
}

int AsyncRemove(const Requester& send, const std::vector<std::string>& ids) {
  int rc = 0;
  for (const auto& id : ids) {
    HttpResult r = send("DELETE", "/system/async/" + UrlEncode(id), "");
    if (r.status != 204) {
      rc = Error(r);
      continue;
    }
    std::cout << "Removed " << id << "." << std::endl;
  }
  return rc;
}

}  // namespace silt::deploy
