// What the `silt` command files share (deploy/src/*_cmd.cc, cli.cc): the
// gateway client every command calls through, its URL precedence, and how a
// command fails (Fail: a message on stderr, exit code 1).
#ifndef SILT_DEPLOY_CLI_COMMON_H_
#define SILT_DEPLOY_CLI_COMMON_H_

#include <chrono>
#include <functional>
#include <istream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "deploy/http_client.h"
#include "nlohmann/json.hpp"

namespace silt::deploy {

inline constexpr char kDefaultGateway[] = "http://127.0.0.1:8080";
inline constexpr char kDefaultNamespace[] = "openfaas-fn";

// Thrown only by the command files to unwind a command with an exit code;
// RunCli catches it.
struct Exit {
  int code;
};

// Prints `msg` to stderr and ends the command with exit code 1.
[[noreturn]] void Fail(absl::string_view msg);

// Gateway URL precedence (faas-cli): --gateway if given, else the stack file's
// provider.gateway if not the default, else $OPENFAAS_URL, else the default.
std::string ResolveGateway(const std::string& flag,
                           const std::string& from_stack = "");
std::string Trimmed(absl::string_view body);
// "?namespace=NS", or "" for none.
std::string NsQuery(const std::string& ns);
std::string ReadAll(std::istream& in);
// Repeated KEY=VALUE flags (`flag` names them in the error); Fails on one
// without '='.
std::map<std::string, std::string> ParseKeyValues(
    const std::vector<std::string>& kvs, const char* flag);

struct Client {
  std::string gateway;
  std::string token;  // --token overrides the saved credentials

  // --token as a bearer token, else the credentials `silt login` saved for the
  // gateway.
  void Authorize(HttpCall& call) const;
  // One call; Fails when the gateway cannot be reached, refuses the
  // credentials, or is not Silt's own listener for a Silt route.
  HttpResult Call(
      const std::string& method, const std::string& path,
      const std::string& body = "", bool auth = true,
      std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
};

// -g/--gateway and -k/--token as given.
struct GatewayFlags {
  std::string gateway, token;
  // A client of the gateway they name (`from_stack`: the stack file's
  // provider.gateway, see ResolveGateway).
  Client MakeClient(const std::string& from_stack = "") const {
    return Client{ResolveGateway(gateway, from_stack), token};
  }
};

// GET `path` as JSON; Fails (naming `what`) on any other answer than 200
// with JSON.
nlohmann::json GetJson(const Client& c, const std::string& path,
                       const std::string& what);
// POST `body` to `path` and `print` the JSON answer; Fails otherwise.
void PostAndPrint(const Client& c, const std::string& path,
                  const std::string& body,
                  const std::function<void(const nlohmann::json&)>& print);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_CLI_COMMON_H_
