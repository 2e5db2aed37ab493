#include "cli_common.h"

#include <cstdlib>
#include <iostream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "deploy/config.h"

namespace silt::deploy {
namespace {

using nlohmann::json;

// Routes only Silt's own gateway listener serves (not an OpenFaaS gateway,
// nor Silt's provider listener).
bool IsSiltRoute(absl::string_view path) {
  for (absl::string_view r :
       {"/system/bundles", "/system/images", "/system/nodes", "/system/events",
        "/system/proclets", "/system/state", "/system/snapshots",
        "/system/async"})
    if (absl::StartsWith(path, r)) return true;
  return false;
}

}  // namespace

[[noreturn]] void Fail(absl::string_view msg) {
  std::cerr << msg << std::endl;
  throw Exit{1};
}

// Gateway URL precedence (faas-cli): --gateway if given, else the stack file's
// provider.gateway if not the default, else $OPENFAAS_URL, else the default.
std::string ResolveGateway(const std::string& flag,
                           const std::string& from_stack) {
  if (!flag.empty()) return NormalizeGatewayUrl(flag);
  if (!from_stack.empty() && NormalizeGatewayUrl(from_stack) != kDefaultGateway)
    return NormalizeGatewayUrl(from_stack);
  if (const char* env = std::getenv("OPENFAAS_URL");
      env != nullptr && *env != '\0')
    return NormalizeGatewayUrl(env);
  return kDefaultGateway;
}

std::string Trimmed(absl::string_view body) {
  return std::string(absl::StripTrailingAsciiWhitespace(body));
}

std::string NsQuery(const std::string& ns) {
  return ns.empty() ? "" : "?namespace=" + UrlEncode(ns);
}

std::string ReadAll(std::istream& in) {
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::map<std::string, std::string> ParseKeyValues(
    const std::vector<std::string>& kvs, const char* flag) {
  std::map<std::string, std::string> out;
  for (const auto& kv : kvs) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      Fail(absl::StrCat("bad ", flag, " \"", kv, "\": expected KEY=VALUE"));
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

void Client::Authorize(HttpCall& call) const {
  if (!token.empty()) {
    call.headers.emplace_back("Authorization", "Bearer " + token);
  } else if (auto a = AuthorizationFor(gateway)) {
    call.headers.emplace_back("Authorization", *a);
  }
}

HttpResult Client::Call(const std::string& method, const std::string& path,
                        const std::string& body, bool auth,
                        std::chrono::milliseconds timeout) const {
  HttpCall call;
  call.method = method;
  call.url = gateway + path;
  call.body = body;
  call.timeout = timeout;
  if (!body.empty())
    call.headers.emplace_back("Content-Type", "application/json");
  if (auth) Authorize(call);
  auto r = Send(call);
  if (!r.ok()) {
    Fail(absl::StrCat("Cannot connect to OpenFaaS on URL: ", gateway, ". ",
                      r.status().message()));
  }
  if (r->status == 401) {
    Fail(absl::StrCat(
        "unauthorized access, run \"silt login\" to set up credentials for ",
        gateway));
  }
  if (r->status == 404 && IsSiltRoute(path) &&
      (Trimmed(r->body) == "404 page not found" ||
       absl::StrContains(r->body, "is Silt's own route")))
    Fail(absl::StrCat(
        gateway, " has no ", path.substr(0, path.find('?')),
        ": it is not Silt's gateway listener (an OpenFaaS gateway in front "
        "of Silt, or Silt's --provider-listen). This command needs Silt's "
        "own URL, the gateway's --listen address (e.g. "
        "http://127.0.0.1:8080): pass --gateway URL or set OPENFAAS_URL"));
  return *std::move(r);
}

json GetJson(const Client& c, const std::string& path,
             const std::string& what) {
  HttpResult r = c.Call("GET", path);
  if (r.status == 404) Fail(Trimmed(r.body));
  if (r.status != 200)
    Fail(absl::StrCat("server returned unexpected status code: ", r.status,
                      " - ", Trimmed(r.body)));
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded()) Fail("cannot parse the " + what + " from the gateway");
  return j;
}

void PostAndPrint(const Client& c, const std::string& path,
                  const std::string& body,
                  const std::function<void(const json&)>& print) {
  HttpResult r = c.Call("POST", path, body);
  if (r.status != 200)
    Fail(absl::StrCat("error (", r.status, "): ", Trimmed(r.body)));
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded()) Fail("cannot parse the gateway's answer");
  print(j);
}

}  // namespace silt::deploy
