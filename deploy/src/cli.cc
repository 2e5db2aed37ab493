#include "deploy/cli.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "async_cmd.h"
#include "deploy/build.h"
#include "deploy/config.h"
#include "deploy/http_client.h"
#include "deploy/stack.h"
#include "gpu_cmd.h"
#include "image_cmd.h"
#include "nlohmann/json.hpp"
#include "silt/version.h"
#include "watch.h"

namespace silt::deploy {
namespace {

using nlohmann::json;

constexpr char kDefaultGateway[] = "http://127.0.0.1:8080";
constexpr char kDefaultNamespace[] = "openfaas-fn";

// Thrown only inside this file to unwind a command with an exit code; RunCli
// catches it.
struct Exit {
  int code;
};

[[noreturn]] void Fail(absl::string_view msg) {
  std::cerr << msg << std::endl;
  throw Exit{1};
}

// Gateway URL precedence (faas-cli): --gateway if given, else the stack file's
// provider.gateway if not the default, else $OPENFAAS_URL, else the default.
std::string ResolveGateway(const std::string& flag,
                           const std::string& from_stack = "") {
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

struct Client {
  std::string gateway;
  std::string token;  // --token overrides the saved credentials

  // --token as a bearer token, else the credentials `silt login` saved for the
  // gateway.
  void Authorize(HttpCall& call) const {
    if (!token.empty()) {
      call.headers.emplace_back("Authorization", "Bearer " + token);
    } else if (auto a = AuthorizationFor(gateway)) {
      call.headers.emplace_back("Authorization", *a);
    }
  }

  HttpResult Call(
      const std::string& method, const std::string& path,
      const std::string& body = "", bool auth = true,
      std::chrono::milliseconds timeout = std::chrono::seconds(60)) const {
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
};

std::string NsQuery(const std::string& ns) {
  return ns.empty() ? "" : "?namespace=" + UrlEncode(ns);
}

std::string ReadAll(std::istream& in) {
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- commands ----

void Login(const std::string& gateway_flag, const std::string& user,
           std::string password, bool password_stdin) {
  std::string gateway = ResolveGateway(gateway_flag);
  if (password_stdin) {
    password = Trimmed(ReadAll(std::cin));
  } else if (!password.empty()) {
    std::cerr << "WARNING! Using --password is insecure, consider using: cat "
                 "~/faas_pass.txt | silt login -u user --password-stdin"
              << std::endl;
  }
  if (password.empty())
    Fail(
        "must provide a non-empty password via --password or --password-stdin");
  if (user.empty()) Fail("must provide --username or -u");
  std::cout << "Calling the OpenFaaS server to validate the credentials..."
            << std::endl;
  HttpCall call;
  call.url = gateway + "/system/functions";
  call.headers.emplace_back("Authorization",
                            "Basic " + BasicToken(user, password));
  auto r = Send(call);
  if (!r.ok())
    Fail(absl::StrCat("cannot connect to ", gateway, ": ",
                      r.status().message()));
  if (r->status == 401)
    Fail("Unable to login, either username or password is incorrect");
  if (r->status != 200) {
    Fail(absl::StrCat("server returned unexpected status code: ", r->status,
                      " - ", Trimmed(r->body)));
  }
  if (auto s = SaveAuth({gateway, "basic", BasicToken(user, password)});
      !s.ok())
    Fail(s.message());
  std::cout << "credentials saved for " << user << " " << gateway << std::endl;
}

void Logout(const std::string& gateway_flag) {
  std::string gateway = ResolveGateway(gateway_flag);
  if (auto s = RemoveAuth(gateway); !s.ok()) Fail(s.message());
  std::cout << "credentials removed for " << gateway << std::endl;
}

void List(const Client& c, const std::string& ns, bool verbose,
          const std::string& output) {
  HttpResult r = c.Call("GET", "/system/functions" + NsQuery(ns));
  if (r.status != 200)
    Fail(absl::StrCat("server returned unexpected status code: ", r.status,
                      " - ", Trimmed(r.body)));
  if (output == "json") {
    std::cout << r.body << std::endl;
    return;
  }
  json fns = json::parse(r.body, nullptr, false);
  if (!fns.is_array()) Fail("cannot parse the function list from the gateway");
  if (verbose) {
    std::cout << absl::StrFormat("%-30s\t%-40s\t%-15s\t%-5s\n", "Function",
                                 "Image", "Invocations", "Replicas");
  } else {
    std::cout << absl::StrFormat("%-30s\t%-15s\t%-5s\n", "Function",
                                 "Invocations", "Replicas");
  }
  for (const auto& f : fns) {
    std::string name = f.value("name", "");
    int64_t inv = static_cast<int64_t>(f.value("invocationCount", 0.0));
    uint64_t rep = f.value("replicas", uint64_t{0});
    if (verbose) {
      std::cout << absl::StrFormat("%-30s\t%-40s\t%-15d\t%-5d\n", name,
                                   f.value("image", ""), inv, rep);
    } else {
      std::cout << absl::StrFormat("%-30s\t%-15d\t%-5d\n", name, inv, rep);
    }
  }
}

void PrintMap(const char* title, const json& m) {
  if (!m.is_object() || m.empty()) {
    std::cout << absl::StrFormat("%-18s<none>\n", absl::StrCat(title, ":"));
    return;
  }
  std::cout << title << ":\n";
  for (auto& [k, v] : m.items()) {
    std::cout << "  " << k << ": "
              << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
  }
}

void Describe(const Client& c, const std::string& name, const std::string& ns) {
  std::string q = absl::StrCat(
      "?namespace=", UrlEncode(ns.empty() ? kDefaultNamespace : ns),
      "&usage=1");
  HttpResult r = c.Call("GET", "/system/function/" + UrlEncode(name) + q);
  if (r.status == 404) Fail(absl::StrCat("No such function: ", name));
  if (r.status != 200)
    Fail(absl::StrCat("server returned unexpected status code: ", r.status,
                      " - ", Trimmed(r.body)));
  json f = json::parse(r.body, nullptr, false);
  if (!f.is_object()) Fail("cannot parse the function status from the gateway");
  std::string fns = f.value("namespace", ns.empty() ? kDefaultNamespace : ns);
  uint64_t available = f.value("availableReplicas", uint64_t{0});
  auto row = [](const char* k, const std::string& v) {
    std::cout << absl::StrFormat("%-18s%s\n", absl::StrCat(k, ":"),
                                 v.empty() ? "<none>" : v);
  };
  row("Name", f.value("name", name));
  row("Namespace", fns);
  row("Status", available > 0 ? "Ready" : "Not Ready");
  row("Replicas", std::to_string(f.value("replicas", uint64_t{0})));
  row("Available Replicas", std::to_string(available));
  row("Invocations",
      std::to_string(static_cast<int64_t>(f.value("invocationCount", 0.0))));
  row("Image", f.value("image", ""));
  row("Function Process", f.value("envProcess", ""));
  std::string suffix = fns == kDefaultNamespace ? "" : "." + fns;
  row("URL",
      absl::StrCat(c.gateway, "/function/", f.value("name", name), suffix));
  row("Async URL", absl::StrCat(c.gateway, "/async-function/",
                                f.value("name", name), suffix));
  row("Created", f.value("createdAt", ""));
  PrintMap("Labels", f.value("labels", json::object()));
  PrintMap("Annotations", f.value("annotations", json::object()));
  PrintMap("Environment", f.value("envVars", json::object()));
  json secrets = f.value("secrets", json::array());
  row("Secrets",
      secrets.empty()
          ? ""
          : absl::StrJoin(secrets.get<std::vector<std::string>>(), ", "));
  PrintMap("Limits", f.value("limits", json::object()));
  PrintMap("Requests", f.value("requests", json::object()));
  json labels = f.value("labels", json::object());
  if (labels.is_object() && labels.value("com.silt.snapshot", "") == "false") {
    row("Snapshot", "off (label com.silt.snapshot=false: always boots)");
    return;
  }
  HttpResult sr = c.Call("GET", "/system/snapshots/" + UrlEncode(name) + q);
  json snaps = json::parse(sr.body, nullptr, false);
  std::string state = "none yet (the first cold start boots and takes it)";
  if (sr.status == 200 && snaps.is_array()) {
    for (const auto& sn : snaps) {
      if (!sn.value("current", false)) continue;
      auto nodes = sn.value("nodes", std::vector<std::string>{});
      state = absl::StrFormat(
          "ready (%s, %.1f MiB, on %s%s)", sn.value("id", ""),
          static_cast<double>(sn.value("bytes", uint64_t{0})) / (1 << 20),
          nodes.empty() ? "no online node" : absl::StrJoin(nodes, ", "),
          sn.value("template", false) ? ", fork template resident" : "");
    }
  }
  row("Snapshot", state);
}

void SnapshotList(const Client& c, const std::string& ns,
                  const std::string& name, bool as_json) {
  std::string path = "/system/snapshots";
  if (!name.empty()) path += "/" + UrlEncode(name);
  HttpResult r = c.Call("GET", path + NsQuery(ns));
  if (r.status == 404) Fail(absl::StrCat("No such function: ", name));
  if (r.status != 200)
    Fail(absl::StrCat("server returned unexpected status code: ", r.status,
                      " - ", Trimmed(r.body)));
  json snaps = json::parse(r.body, nullptr, false);
  if (!snaps.is_array())
    Fail("cannot parse the snapshot list from the gateway");
  if (as_json) {
    std::cout << snaps.dump(2) << std::endl;
    return;
  }
  std::cout << absl::StrFormat("%-36s\t%-20s\t%-10s\t%-8s\t%-8s\t%s\n",
                               "Snapshot", "Function", "Size", "Resident",
                               "Staged", "Nodes");
  for (const auto& sn : snaps) {
    auto nodes = sn.value("nodes", std::vector<std::string>{});
    std::cout << absl::StrFormat(
        "%-36s\t%-20s\t%-10s\t%-8s\t%-8s\t%s\n", sn.value("id", ""),
        absl::StrCat(sn.value("name", ""), ".", sn.value("namespace", ""),
                     sn.value("current", false) ? "" : " (old)"),
        absl::StrFormat(
            "%.1fMiB",
            static_cast<double>(sn.value("bytes", uint64_t{0})) / (1 << 20)),
        absl::StrFormat("%.1fMiB", static_cast<double>(
                                       sn.value("residentBytes", uint64_t{0})) /
                                       (1 << 20)),
        absl::StrCat(
            sn.value("staged", false) ? "restorer" : "",
            sn.value("staged", false) && sn.value("template", false) ? "+" : "",
            sn.value("template", false) ? "template" : "",
            sn.value("staged", false) || sn.value("template", false) ? ""
                                                                     : "-"),
        nodes.empty() ? "-" : absl::StrJoin(nodes, ","));
  }
}

void SnapshotDelete(const Client& c, const std::string& ns,
                    const std::string& name) {
  HttpResult r =
      c.Call("DELETE", "/system/snapshots/" + UrlEncode(name) + NsQuery(ns));
  if (r.status == 404) Fail(absl::StrCat("No such function: ", name));
  if (r.status != 200)
    Fail(absl::StrCat("server returned unexpected status code: ", r.status,
                      " - ", Trimmed(r.body)));
  json out = json::parse(r.body, nullptr, false);
  std::cout << "Deleted " << out.value("deleted", 0) << " snapshot(s) of "
            << name << "; its next cold start boots and snapshots again."
            << std::endl;
}

// ---- nodes, proclets, state ----

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

std::string Mib(uint64_t bytes) {
  return absl::StrFormat("%.1fMiB", static_cast<double>(bytes) / (1 << 20));
}

void NodesList(const Client& c, const std::string& output) {
  json nodes = GetJson(c, "/system/nodes", "node list");
  if (output == "json") {
    std::cout << nodes.dump(2) << std::endl;
    return;
  }
  std::cout << absl::StrFormat(
      "%-16s\t%-5s\t%-8s\t%-12s\t%-12s\t%-12s\t%-9s\t%-18s\t%s\n", "Node",
      "CPUs", "CPU used", "Memory", "Used", "Free", "Instances",
      "Memory proclets", "Compute proclets");
  for (const auto& n : nodes) {
    std::cout << absl::StrFormat(
        "%-16s\t%-5d\t%-8.2f\t%-12s\t%-12s\t%-12s\t%-9d\t%-18s\t%d\n",
        n.value("name", ""), n.value("cores", 0), n.value("cpuUsed", 0.0),
        Mib(n.value("memoryBytes", uint64_t{0})),
        Mib(n.value("memoryUsedBytes", uint64_t{0})),
        Mib(n.value("memoryFreeBytes", uint64_t{0})), n.value("instances", 0),
        absl::StrFormat("%d (%s)", n.value("proclets", 0),
                        Mib(n.value("procletBytes", uint64_t{0}))),
        n.value("computeProclets", 0));
  }
}

void ProcletsList(const Client& c, const std::string& ns,
                  const std::string& function, const std::string& output) {
  std::string q = NsQuery(ns);
  if (!function.empty())
    q += (q.empty() ? "?" : "&") + std::string("function=") +
         UrlEncode(function);
  json ps = GetJson(c, "/system/proclets" + q, "proclet list");
  if (output == "json") {
    std::cout << ps.dump(2) << std::endl;
    return;
  }
  std::cout << absl::StrFormat(
      "%-8s\t%-6s\t%-24s\t%-16s\t%-10s\t%-9s\t%-5s\t%s\n", "ID", "Kind",
      "Structure", "Node", "Bytes", "Elements", "Epoch", "State");
  for (const auto& p : ps) {
    std::cout << absl::StrFormat(
        "%-8d\t%-6s\t%-24s\t%-16s\t%-10s\t%-9d\t%-5d\t%s\n",
        p.value("id", uint64_t{0}), p.value("kind", ""),
        absl::StrCat(p.value("structure", ""), ".", p.value("namespace", "")),
        p.value("node", ""), Mib(p.value("bytes", uint64_t{0})),
        p.value("count", uint64_t{0}), p.value("epoch", uint64_t{0}),
        p.value("state", ""));
  }
}

void PrintMigration(const json& m) {
  std::cout << absl::StrFormat(
                   "proclet %d: %s -> %s, %s in %.2f ms (%d rounds), writes "
                   "held %.3f ms",
                   m.value("id", uint64_t{0}), m.value("from", ""),
                   m.value("to", ""), Mib(m.value("bytes", uint64_t{0})),
                   m.value("totalMs", 0.0), m.value("rounds", 0),
                   m.value("pauseMs", 0.0))
            << std::endl;
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

void StateList(const Client& c, const std::string& ns,
               const std::string& output) {
  json st = GetJson(c, "/system/state" + NsQuery(ns), "state list");
  if (output == "json") {
    std::cout << st.dump(2) << std::endl;
    return;
  }
  std::cout << absl::StrFormat("%-24s\t%-6s\t%-6s\t%-10s\t%-9s\t%s\n", "State",
                               "Kind", "Shards", "Bytes", "Elements",
                               "Functions");
  for (const auto& s : st) {
    auto fns = s.value("functions", std::vector<std::string>{});
    uint32_t lost = s.value("lostShards", 0u);
    std::cout << absl::StrFormat(
        "%-24s\t%-6s\t%-6s\t%-10s\t%-9d\t%s\n",
        absl::StrCat(s.value("name", ""), ".", s.value("namespace", "")),
        s.value("kind", ""),
        absl::StrCat(s.value("shards", 0),
                     lost ? absl::StrCat(" (", lost, " lost)") : ""),
        Mib(s.value("bytes", uint64_t{0})), s.value("count", uint64_t{0}),
        fns.empty() ? "-" : absl::StrJoin(fns, ","));
  }
}

bool RemoveOne(const Client& c, const std::string& name,
               const std::string& ns) {
  json body = {{"functionName", name}};
  if (!ns.empty()) body["namespace"] = ns;
  std::cout << "Deleting: " << name << "."
            << (ns.empty() ? kDefaultNamespace : ns) << std::endl;
  HttpResult r = c.Call("DELETE", "/system/functions", body.dump());
  if (r.status == 200 || r.status == 202) {
    std::cout << "Removing old function." << std::endl;
    return true;
  }
  if (r.status == 404) {
    std::cerr << "No existing function to remove" << std::endl;
    return false;
  }
  std::cerr << "Server returned unexpected status code " << r.status << " "
            << Trimmed(r.body) << std::endl;
  return false;
}

bool DeployOne(const Client& c, const StackFunction& f, bool replace,
               bool update) {
  std::cout << "Deploying: " << f.name << "." << std::endl;
  if (f.image.empty()) {
    std::cerr << "function " << f.name << " has no image" << std::endl;
    return false;
  }
  std::string body = DeploymentJson(f);
  if (replace) {
    json del = {{"functionName", f.name}};
    if (!f.ns.empty()) del["namespace"] = f.ns;
    c.Call("DELETE", "/system/functions", del.dump());
  }
  HttpResult r;
  if (update && !replace) {
    r = c.Call("PUT", "/system/functions", body);
    if (r.status == 404) r = c.Call("POST", "/system/functions", body);
  } else {
    r = c.Call("POST", "/system/functions", body);
  }
  if (r.status == 200 || r.status == 201 || r.status == 202) {
    std::string suffix =
        f.ns.empty() || f.ns == kDefaultNamespace ? "" : "." + f.ns;
    std::cout << "\nDeployed. " << r.status << " "
              << (r.status == 200 ? "OK" : "Accepted")
              << ".\nURL: " << c.gateway << "/function/" << f.name << suffix
              << "\n"
              << std::endl;
    return true;
  }
  std::cerr << "Unexpected status: " << r.status
            << ", message: " << Trimmed(r.body) << std::endl;
  return false;
}

StringMap ParseKeyValues(const std::vector<std::string>& kvs,
                         const char* flag) {
  StringMap out;
  for (const auto& kv : kvs) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      Fail(absl::StrCat("bad ", flag, " \"", kv, "\": expected KEY=VALUE"));
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

std::string SecretValue(const std::string& literal, const std::string& file,
                        bool literal_set) {
  if (literal_set) return literal;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) Fail(absl::StrCat("cannot read ", file));
    return ReadAll(in);
  }
  if (isatty(STDIN_FILENO))
    std::cerr << "Reading from STDIN - hit (Control + D) to stop." << std::endl;
  return Trimmed(ReadAll(std::cin));
}

void Version(const std::string& gateway_flag, const std::string& token,
             bool short_version) {
  if (short_version) {
    std::cout << kVersion << std::endl;
    return;
  }
  std::cout << "CLI:\n commit:  " << kGitSha << "\n version: " << kVersion
            << "\n";
  Client c{ResolveGateway(gateway_flag), token};
  HttpCall call;
  call.url = c.gateway + "/system/info";
  c.Authorize(call);
  auto r = Send(call);
  if (!r.ok() || r->status != 200) {
    std::cout << "\nGateway: unavailable at " << c.gateway
              << (r.ok() ? absl::StrCat(" (HTTP ", r->status, ")") : "")
              << std::endl;
    return;
  }
  json info = json::parse(r->body, nullptr, false);
  if (!info.is_object()) Fail("cannot parse /system/info from the gateway");
  json v = info.value("version", json::object());
  json p = info.value("provider", json::object());
  json pv = p.value("version", json::object());
  std::cout << "\nGateway\n uri:     " << c.gateway
            << "\n version: " << v.value("release", "")
            << "\n sha:     " << v.value("sha", "")
            << "\n\nProvider\n name:          " << p.value("provider", "")
            << "\n orchestration: " << p.value("orchestration", "")
            << "\n version:       " << pv.value("release", "")
            << "\n sha:           " << pv.value("sha", "") << std::endl;
}

std::string StackDir(const std::string& stack_file) {
  std::string dir = std::filesystem::path(stack_file).parent_path().string();
  return dir.empty() ? "." : dir;
}

std::vector<StackFunction> SelectFunctions(const Stack& stack,
                                           const std::string& filter,
                                           const std::string& file) {
  std::vector<StackFunction> out;
  for (const auto& f : stack.functions)
    if (filter.empty() || f.name == filter) out.push_back(f);
  if (out.empty())
    Fail(absl::StrCat("no function named ", filter, " in ", file));
  return out;
}

BuiltBundle BuildOne(const std::string& dir, const StackFunction& f) {
  std::cout << "Building " << f.name << " (lang "
            << (f.lang.empty() ? "exec" : f.lang) << ")..." << std::endl;
  std::string log;
  auto b = BuildFunction(dir, f, &log);
  if (!b.ok()) Fail(b.status().message());
  std::cout << "Built " << f.name << ": " << b->digest << " (" << b->size
            << " bytes, " << b->kind << ") -> " << b->path << std::endl;
  return *b;
}

void PushOne(const Client& c, const StackFunction& f, const BuiltBundle& b) {
  std::ifstream in(b.path, std::ios::binary);
  std::string bytes = ReadAll(in);
  HttpResult r =
      c.Call("POST", "/system/bundles?digest=" + UrlEncode(b.digest), bytes);
  if (r.status != 200 && r.status != 201)
    Fail(absl::StrCat("pushing ", f.name, " failed: ", r.status, " ",
                      Trimmed(r.body)));
  std::cout << "Pushed " << f.name << ": " << b.digest
            << (r.status == 201 ? "" : " (already on the gateway)")
            << std::endl;
}

// The image a built function deploys as: NAME@sha256:<digest>.
std::string BundleImage(const StackFunction& f, const std::string& digest) {
  std::string base = f.image.empty() ? f.name : f.image;
  if (size_t at = base.find('@'); at != std::string::npos)
    base = base.substr(0, at);
  return base + "@" + digest;
}

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

void NewFunction(const std::string& name, const std::string& lang,
                 const std::string& stack_file) {
  if (lang != "cpp" && lang != "python" && lang != "exec")
    Fail(absl::StrCat("--lang ", lang,
                      " is not supported: use cpp, python or exec"));
  namespace fs = std::filesystem;
  std::string dir = StackDir(stack_file);
  fs::path handler = fs::path(dir) / name;
  if (fs::exists(handler))
    Fail(absl::StrCat("folder ", handler.string(), " already exists"));
  fs::create_directories(handler);
  std::string fprocess;
  if (lang == "cpp") {
    std::ofstream(handler / "handler.cc")
        << R"(#include <silt/function.h>

#include <string>

// Runs once per instance, before the first request: put expensive set-up here.
static void Init(silt::Context& ctx) { ctx.Log("init done"); }

static silt::Response Handle(const silt::Request& req, silt::Context& ctx) {
  return silt::Response::Text(200, "Hello from )" +
               name + R"(: " + std::string(req.body) + "\n");
}

SILT_INIT(Init)
SILT_HANDLER(Handle)
)";
  } else if (lang == "python") {
    std::ofstream(handler / "handler.py") << R"(import sys

# Classic watchdog mode: the request body arrives on stdin, the response goes to stdout.
body = sys.stdin.read()
print("Hello from )" + name + R"(: " + body)
)";
    fprocess = "python3 handler.py";
  } else {
    std::ofstream(handler / "handler.sh")
        << "#!/bin/sh\necho \"Hello from " << name << ": $(cat)\"\n";
    fs::permissions(handler / "handler.sh", fs::perms(0755));
    fprocess = "sh handler.sh";
  }
  bool exists = fs::exists(stack_file);
  std::ofstream out(stack_file, std::ios::app);
  if (!exists) {
    out << "version: 1.0\nprovider:\n  name: openfaas\n  gateway: "
           "http://127.0.0.1:8080\n"
           "functions:\n";
  }
  out << "  " << name << ":\n    lang: " << lang << "\n    handler: ./" << name
      << "\n    image: " << name << ":latest\n";
  if (!fprocess.empty()) out << "    fprocess: " << fprocess << "\n";
  std::cout << "Folder: " << handler.string() << " created.\nFunction " << name
            << " added to " << stack_file << "; deploy it with: silt up -f "
            << stack_file << std::endl;
}

// ---- silt local ----

struct LocalOptions {
  std::string data_dir;
  std::string listen = "127.0.0.1:8080";  // the gateway's HTTP API
  // The gateway's invoker-facing gRPC and its metrics port; empty: the host of
  // `listen`, port 0 (a free port, so two `silt local` never collide).
  std::string grpc_listen;
  std::string metrics_listen;
  std::string provider_listen;  // the faas-provider API; empty: none
  bool no_auth = false;
};

// A daemon binary installed beside this one, or in the build tree.
std::string FindDaemon(const char* name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  fs::path bindir = self.parent_path();
  for (fs::path p : {bindir / name, bindir.parent_path() / "gateway" / name,
                     bindir.parent_path() / "invoker" / name}) {
    if (fs::exists(p)) return p.string();
  }
  Fail(absl::StrCat("cannot find ", name, " next to ", self.string()));
}

struct Child {
  pid_t pid = -1;
  int out = -1;  // its stdout
};

// Starts `args` with `blocked` unblocked again and its stdout on a pipe.
Child Spawn(std::vector<std::string> args, const sigset_t& blocked) {
  int p[2];
  if (pipe(p) != 0) Fail("pipe failed");
  pid_t pid = fork();
  if (pid == 0) {
    sigprocmask(SIG_UNBLOCK, &blocked, nullptr);
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    std::vector<char*> a;
    for (auto& s : args) a.push_back(s.data());
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  close(p[1]);
  return Child{pid, p[0]};
}

// Reads `fd` until a line starting with `prefix` and returns the rest of it;
// echoes every other line. Empty if the child closed its stdout first.
std::string WaitLine(int fd, const std::string& prefix) {
  std::string buf;
  char c;
  while (read(fd, &c, 1) == 1) {
    if (c != '\n') {
      buf.push_back(c);
      continue;
    }
    if (absl::StartsWith(buf, prefix)) return buf.substr(prefix.size());
    std::cout << buf << std::endl;
    buf.clear();
  }
  return "";
}

void StopChildren(std::initializer_list<pid_t> children) {
  for (pid_t pid : children) kill(pid, SIGTERM);
  for (pid_t pid : children) waitpid(pid, nullptr, 0);
}

// Polls the gateway until a node is registered (at most ~5 s).
void WaitRegistered(const LocalOptions& o, const std::string& http_addr) {
  for (int i = 0; i < 500; ++i) {
    HttpCall call;
    call.url = "http://" + http_addr + "/system/nodes";
    if (!o.no_auth) {
      std::ifstream in(o.data_dir + "/gateway/secrets/basic-auth-password");
      call.headers.emplace_back(
          "Authorization",
          "Basic " + BasicToken("admin", Trimmed(ReadAll(in))));
    }
    auto r = Send(call);
    if (r.ok() && r->status == 200 && r->body != "[]") return;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
}

// `silt local`: a gateway and one invoker on this machine, as child processes.
// The invoker learns the gateway's gRPC address from the gateway's output, so
// every port but --listen's may be 0.
int Local(LocalOptions o) {
  std::string gateway_bin = FindDaemon("silt-gateway"),
              invoker_bin = FindDaemon("silt-invoker");
  std::string host = o.listen.substr(0, o.listen.rfind(':'));
  if (o.grpc_listen.empty()) o.grpc_listen = host + ":0";
  if (o.metrics_listen.empty()) o.metrics_listen = host + ":0";

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGCHLD);
  sigprocmask(SIG_BLOCK, &stop, nullptr);

  std::vector<std::string> gw_args = {
      gateway_bin,        "--listen",       o.listen,
      "--metrics-listen", o.metrics_listen, "--grpc-listen",
      o.grpc_listen,      "--data-dir",     o.data_dir + "/gateway"};
  if (o.no_auth) gw_args.push_back("--no-auth");
  if (!o.provider_listen.empty())
    gw_args.insert(gw_args.end(), {"--provider-listen", o.provider_listen});
  Child gw = Spawn(gw_args, stop);
  std::string grpc_addr = WaitLine(gw.out, "invokers connect to ");
  std::string provider_addr = grpc_addr.empty() || o.provider_listen.empty()
                                  ? ""
                                  : WaitLine(gw.out, "faas-provider API on ");
  std::string http_addr =
      grpc_addr.empty() ? "" : WaitLine(gw.out, "listening on ");
  if (http_addr.empty()) {
    StopChildren({gw.pid});
    Fail("silt-gateway did not start (see its messages above)");
  }
  Child inv =
      Spawn({invoker_bin, "--gateway", grpc_addr, "--listen", host + ":0",
             "--data-dir", o.data_dir + "/invoker", "--node-name", "local"},
            stop);
  std::string inv_addr = WaitLine(inv.out, "listening on ");
  if (inv_addr.empty()) {
    StopChildren({gw.pid, inv.pid});
    Fail("silt-invoker did not start (see its messages above)");
  }
  WaitRegistered(o, http_addr);
  if (!provider_addr.empty())
    std::cout << "faas-provider API on " << provider_addr << "\n";
  std::cout << "invoker " << inv_addr << " registered\nlistening on "
            << http_addr << std::endl;
  int sig = 0;
  sigwait(&stop, &sig);
  StopChildren({inv.pid, gw.pid});
  std::cout << "stopped" << std::endl;
  return sig == SIGCHLD ? 1 : 0;
}

// ---- unknown commands ----

// Optimal string alignment distance: insertions, deletions, substitutions and
// swaps of two neighbours each count one.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1,
                                     std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t subst = d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, subst});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// `cmd`'s named subcommands (CLI11 keeps option groups among them, unnamed).
std::vector<const CLI::App*> Commands(const CLI::App& cmd) {
  return cmd.get_subcommands(
      [](const CLI::App* sub) { return !sub->get_name().empty(); });
}

// The subcommand name or alias of `cmd` nearest to `word`, if it is near
// enough to be a typo of it; else empty. Names win ties with aliases.
std::string NearestCommand(const CLI::App& cmd, const std::string& word) {
  std::string lower = absl::AsciiStrToLower(word);
  size_t best = lower.size() <= 3 ? 2 : 3;  // one more than the edits allowed
  std::string nearest;
  for (const CLI::App* sub : Commands(cmd)) {
    std::vector<std::string> words = {sub->get_name()};
    for (const auto& alias : sub->get_aliases()) words.push_back(alias);
    for (const auto& w : words) {
      size_t d = EditDistance(lower, w);
      if (d < best) {
        best = d;
        nearest = w;
      }
    }
  }
  return nearest;
}

void PrintUnknownCommand(const CLI::App& cmd, const std::string& path,
                         const std::string& word) {
  std::string near = NearestCommand(cmd, word);
  std::cerr << path << ": unknown command \"" << word << "\"; "
            << (near.empty()
                    ? absl::StrCat("run \"", path, " --help\" for the commands")
                    : absl::StrCat("did you mean \"", near, "\"?"))
            << std::endl;
}

// After a failed parse, or --help: if a word where a command belongs named
// none, says which word, suggests the nearest command and returns 2; with
// --help, any word nothing took is an error too (help must not hide a typo).
// Looks at the commands parsed from the top down, as the first unknown word is
// the one to fix. Else nullopt: CLI11's own message and code stand.
std::optional<int> ReportUnknownWord(const CLI::App& app, bool help) {
  std::string path = "silt";
  for (const CLI::App* cmd = &app;;) {
    std::vector<std::string> words = cmd->remaining();
    for (const std::string& word : words) {
      if (Commands(*cmd).empty() || word.empty() || word[0] == '-') continue;
      PrintUnknownCommand(*cmd, path, word);
      return 2;
    }
    if (help && !words.empty()) {
      std::cerr << path << ": unexpected argument \"" << words.front()
                << "\"; run \"" << path << " --help\" for the usage"
                << std::endl;
      return 2;
    }
    std::vector<CLI::App*> parsed = cmd->get_subcommands();
    if (parsed.empty()) return std::nullopt;
    cmd = parsed.front();
    path += " " + cmd->get_name();
  }
}

}  // namespace

int RunCli(int argc, char** argv) {
  CLI::App app{
      "silt: deploy and manage functions on Silt (or any OpenFaaS gateway)"};
  app.require_subcommand(1);
  std::string gateway, token, ns;
  auto gw_opt = [&](CLI::App* cmd) {
    cmd->add_option("-g,--gateway", gateway,
                    "Gateway URL (default $OPENFAAS_URL or " +
                        std::string(kDefaultGateway) + ")");
    cmd->add_option("-k,--token", token,
                    "Bearer token instead of saved credentials");
  };
  auto ns_opt = [&](CLI::App* cmd) {
    cmd->add_option("-n,--namespace", ns, "Namespace of the function");
  };

  // login / logout
  std::string user = "admin", password;
  bool password_stdin = false;
  auto* login =
      app.add_subcommand("login", "Save basic-auth credentials for a gateway");
  login->add_option("-g,--gateway", gateway, "Gateway URL");
  login->add_option("-u,--username", user, "Gateway username")
      ->capture_default_str();
  login->add_option("-p,--password", password, "Gateway password");
  login->add_flag("-s,--password-stdin", password_stdin,
                  "Read the password from stdin");
  bool tls_no_verify = false;
  login->add_flag("--tls-no-verify", tls_no_verify,
                  "Accepted for faas-cli compatibility");
  auto* logout =
      app.add_subcommand("logout", "Forget the credentials for a gateway");
  logout->add_option("-g,--gateway", gateway, "Gateway URL");

  // list / describe / remove
  bool verbose = false;
  std::string output;
  auto* list = app.add_subcommand("list", "List deployed functions");
  list->alias("ls");
  gw_opt(list);
  ns_opt(list);
  list->add_flag("-v,--verbose", verbose, "Show the image too");
  list->add_option("-o,--output", output, "Output format: json")
      ->check(CLI::IsMember({"json"}));

  std::string name;
  auto* describe = app.add_subcommand("describe", "Show a function's details");
  gw_opt(describe);
  ns_opt(describe);
  describe->add_option("NAME", name, "Function name")->required();

  std::string stack_file;
  std::vector<std::string> filter_names;
  auto* remove = app.add_subcommand("remove", "Remove deployed functions");
  remove->alias("rm");
  remove->alias("delete");
  gw_opt(remove);
  ns_opt(remove);
  remove->add_option("-f,--yaml", stack_file,
                     "Stack file whose functions to remove");
  remove->add_option("NAME", filter_names, "Function names");

  // deploy
  bool replace = false, update = true, envsubst = true;
  std::string image, fprocess, filter;
  std::vector<std::string> env, labels, annotations, secrets, constraints;
  auto* deploy = app.add_subcommand(
      "deploy", "Deploy functions from a stack file or flags");
  gw_opt(deploy);
  ns_opt(deploy);
  deploy->add_option("-f,--yaml", stack_file, "Stack file (stack.yml)");
  deploy->add_option("--filter", filter,
                     "Deploy only this function of the stack file");
  deploy->add_option("--image", image,
                     "Image (with --name, deploy without a stack file)");
  deploy->add_option("--name", name, "Function name (with --image)");
  deploy->add_option("--fprocess", fprocess, "Process the watchdog runs");
  deploy->add_option("-e,--env", env,
                     "Environment variable KEY=VALUE (repeatable)");
  deploy->add_option("-l,--label", labels, "Label KEY=VALUE (repeatable)");
  deploy->add_option("--annotation", annotations,
                     "Annotation KEY=VALUE (repeatable)");
  deploy->add_option("--secret", secrets, "Secret to mount (repeatable)");
  deploy->add_option("--constraint", constraints,
                     "Placement constraint (repeatable)");
  deploy->add_flag("--replace", replace,
                   "Remove and re-create existing functions");
  deploy->add_flag("--update,!--no-update", update,
                   "Update existing functions in place (default), else create");
  deploy->add_flag("--envsubst,!--no-envsubst", envsubst,
                   "Substitute ${VAR} in the stack file (default on)");
  bool no_snapshot = false;
  deploy->add_flag("--no-snapshot", no_snapshot,
                   "Always boot (label com.silt.snapshot=false): for functions "
                   "whose state must not be cloned");

  // snapshots
  auto* snapshot_cmd =
      app.add_subcommand("snapshot", "Inspect and delete function snapshots");
  snapshot_cmd->require_subcommand(1);
  auto* snap_list = snapshot_cmd->add_subcommand("list", "List snapshots");
  snap_list->alias("ls");
  gw_opt(snap_list);
  ns_opt(snap_list);
  auto* snap_inspect = snapshot_cmd->add_subcommand(
      "inspect", "Show a function's snapshots (JSON)");
  gw_opt(snap_inspect);
  ns_opt(snap_inspect);
  snap_inspect->add_option("NAME", name, "Function name")->required();
  auto* snap_delete = snapshot_cmd->add_subcommand(
      "delete", "Delete a function's snapshots on every node");
  snap_delete->alias("rm");
  gw_opt(snap_delete);
  ns_opt(snap_delete);
  snap_delete->add_option("NAME", name, "Function name")->required();

  // nodes, proclets, state
  auto* nodes_cmd = app.add_subcommand(
      "nodes", "List the invokers: capacity, use and free per resource");
  gw_opt(nodes_cmd);
  nodes_cmd->add_option("-o,--output", output, "table or json");
  auto* events_cmd = app.add_subcommand(
      "events", "Show what the rebalancer moved where, and why");
  gw_opt(events_cmd);
  bool events_follow = false;
  events_cmd->add_flag("-f,--follow", events_follow, "Keep printing new ones");
  events_cmd->add_option("-o,--output", output, "table or json");
  auto* top_cmd = app.add_subcommand(
      "top", "Watch nodes, their load and the rebalancer's moves live");
  gw_opt(top_cmd);
  int top_interval_ms = 500, top_frames = 0;
  top_cmd->add_option("--interval-ms", top_interval_ms, "Refresh period")
      ->capture_default_str()
      ->check(CLI::Range(50, 60000));
  top_cmd
      ->add_option("-n,--frames", top_frames,
                   "Stop after this many refreshes (0: until Ctrl-C)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  auto* node_cmd = app.add_subcommand("node", "Operate on one node");
  node_cmd->require_subcommand(1);
  auto* node_drain = node_cmd->add_subcommand(
      "drain", "Move every memory proclet off a node (live)");
  gw_opt(node_drain);
  node_drain->add_option("NAME", name, "Node name")->required();
  auto* proclets_cmd =
      app.add_subcommand("proclets", "List and move memory and GPU proclets");
  proclets_cmd->require_subcommand(1);
  auto* pl_list = proclets_cmd->add_subcommand("list", "List proclets");
  pl_list->alias("ls");
  gw_opt(pl_list);
  ns_opt(pl_list);
  std::string function_filter, target_node;
  pl_list->add_option("--function", function_filter,
                      "Only the state this function uses");
  pl_list->add_option("-o,--output", output, "table or json");
  auto* pl_migrate = proclets_cmd->add_subcommand(
      "migrate", "Move a proclet to another node while it keeps serving");
  gw_opt(pl_migrate);
  pl_migrate->add_option("ID", name, "Proclet id (silt proclets list)")
      ->required();
  pl_migrate->add_option("--to", target_node, "Target node")->required();
  std::string target_backend;
  pl_migrate
      ->add_option("--backend", target_backend,
                   "A GPU proclet's backend there: cuda (its GPU) or host "
                   "(its CPU cores); default: its GPU if it has one")
      ->check(CLI::IsMember({"cuda", "host"}));
  auto* state_cmd = app.add_subcommand(
      "state", "Inspect and delete function state (maps, vectors, queues)");
  state_cmd->require_subcommand(1);
  auto* st_list = state_cmd->add_subcommand("list", "List state structures");
  st_list->alias("ls");
  gw_opt(st_list);
  ns_opt(st_list);
  st_list->add_option("-o,--output", output, "table or json");
  auto* st_inspect = state_cmd->add_subcommand(
      "inspect", "Show one structure and its shards (JSON)");
  gw_opt(st_inspect);
  ns_opt(st_inspect);
  st_inspect->add_option("NAME", name, "Structure name")->required();
  auto* st_delete = state_cmd->add_subcommand(
      "delete", "Delete a structure and all its data");
  st_delete->alias("rm");
  gw_opt(st_delete);
  ns_opt(st_delete);
  st_delete->add_option("NAME", name, "Structure name")->required();

  // secrets
  auto* secret = app.add_subcommand("secret", "Manage secrets");
  secret->require_subcommand(1);
  std::string secret_name, literal, from_file;
  bool secret_replace = false;
  auto secret_cmd = [&](const char* n, const char* d, bool value) {
    auto* s = secret->add_subcommand(n, d);
    gw_opt(s);
    ns_opt(s);
    if (std::string(n) != "list")
      s->add_option("NAME", secret_name, "Secret name")->required();
    if (value) {
      s->add_option("--from-literal", literal, "Secret value");
      s->add_option("--from-file", from_file, "Read the value from a file");
    }
    return s;
  };
  auto* secret_create = secret_cmd(
      "create", "Create a secret (value from stdin by default)", true);
  secret_create->add_flag("--replace", secret_replace,
                          "Update the secret if it exists");
  auto* secret_update = secret_cmd("update", "Update a secret's value", true);
  auto* secret_list = secret_cmd("list", "List secrets (names only)", false);
  secret_list->alias("ls");
  auto* secret_remove = secret_cmd("remove", "Remove a secret", false);
  secret_remove->alias("rm");

  // namespaces
  auto* namespaces = app.add_subcommand("namespace", "Manage namespaces");
  namespaces->alias("namespaces");
  namespaces->alias("ns");
  std::string ns_name;
  auto* ns_list = namespaces->add_subcommand("list", "List namespaces");
  ns_list->alias("ls");
  gw_opt(ns_list);
  auto* ns_create = namespaces->add_subcommand("create", "Create a namespace");
  gw_opt(ns_create);
  ns_create->add_option("NAME", ns_name, "Namespace")->required();
  auto* ns_remove =
      namespaces->add_subcommand("remove", "Remove an empty namespace");
  ns_remove->alias("rm");
  gw_opt(ns_remove);
  ns_remove->add_option("NAME", ns_name, "Namespace")->required();
  gw_opt(namespaces);

  // build / push / up
  std::string build_filter;
  auto* build = app.add_subcommand(
      "build", "Build functions of a stack file into bundles");
  build->add_option("-f,--yaml", stack_file, "Stack file")
      ->capture_default_str();
  build->add_option("--filter", build_filter, "Only this function");
  auto* push =
      app.add_subcommand("push", "Upload built bundles to the gateway");
  gw_opt(push);
  push->add_option("-f,--yaml", stack_file, "Stack file");
  push->add_option("--filter", build_filter, "Only this function");
  auto* up = app.add_subcommand("up", "Build, push and deploy a stack file");
  gw_opt(up);
  ns_opt(up);
  up->add_option("-f,--yaml", stack_file, "Stack file");
  up->add_option("--filter", build_filter, "Only this function");

  // new
  std::string new_name, new_lang = "cpp";
  auto* new_cmd =
      app.add_subcommand("new", "Create a function from a starter template");
  new_cmd->add_option("NAME", new_name, "Function name")->required();
  new_cmd->add_option("--lang", new_lang, "cpp, python or exec")
      ->capture_default_str();
  new_cmd->add_option("-f,--yaml", stack_file,
                      "Stack file to add it to (default stack.yml)");

  // logs
  bool follow = false;
  int lines = 0;
  std::string since, since_time, log_output = "plain";
  auto* logs = app.add_subcommand("logs", "Show a function's log lines");
  gw_opt(logs);
  ns_opt(logs);
  logs->add_option("NAME", name, "Function name")->required();
  logs->add_flag("-t,--tail,--follow", follow, "Keep streaming new lines");
  logs->add_option("--lines", lines, "Only the last N lines");
  logs->add_option("--since", since,
                   "Only lines newer than this (30s, 5m, 1h)");
  logs->add_option("--since-time", since_time,
                   "Only lines newer than this RFC 3339 time");
  logs->add_option("-o,--output", log_output, "plain, raw or json")
      ->check(CLI::IsMember({"plain", "raw", "json"}));

  // invoke
  std::string method = "POST", content_type = "text/plain";
  std::vector<std::string> headers, query;
  bool show_headers = false;
  auto* invoke =
      app.add_subcommand("invoke", "Call a function (body from stdin)");
  gw_opt(invoke);
  ns_opt(invoke);
  invoke->add_option("NAME", name, "Function name")->required();
  invoke->add_option("-m,--method", method, "HTTP method")
      ->capture_default_str();
  invoke->add_option("-H,--header", headers, "Header KEY=VALUE (repeatable)");
  invoke->add_option("--query", query, "Query KEY=VALUE (repeatable)");
  invoke->add_option("--content-type", content_type, "Content-Type")
      ->capture_default_str();
  invoke->add_flag("-v,--verbose", show_headers,
                   "Print the response status and headers to stderr");
  bool invoke_async = false;
  std::string callback_url;
  invoke->add_flag("-a,--async", invoke_async,
                   "Queue the call (POST /async-function): prints its call id");
  invoke->add_option("--callback-url", callback_url,
                     "With --async: where the result is POSTed");

  // async
  auto* async_cmd =
      app.add_subcommand("async", "List, retry and remove queued async calls");
  async_cmd->require_subcommand(1);
  AsyncSelection async_sel;
  std::vector<std::string> call_ids;
  bool async_all = false, async_dead = false;
  auto* as_list = async_cmd->add_subcommand(
      "list", "Calls waiting, running, or given up on (dead letters)");
  as_list->alias("ls");
  auto* as_retry = async_cmd->add_subcommand(
      "retry", "Put dead letters back in the queue (attempts start over)");
  auto* as_remove =
      async_cmd->add_subcommand("remove", "Drop queued calls or dead letters");
  as_remove->alias("rm");
  for (auto* sc : {as_list, as_retry}) {
    gw_opt(sc);
    sc->add_option("-n,--namespace", async_sel.ns, "Only this namespace");
    sc->add_option("--function", async_sel.function, "Only this function");
  }
  as_list->add_option("--state", async_sel.state, "queued, callback or dead");
  as_list->add_flag("--dead", async_dead, "Only dead letters");
  as_list->add_option("-o,--output", output, "table or json");
  as_retry->add_option("CALL_ID", call_ids, "Calls to retry");
  as_retry->add_flag("--all", async_all, "Every dead letter selected");
  gw_opt(as_remove);
  as_remove->add_option("CALL_ID", call_ids, "Calls to remove")->required();

  // images
  auto* image_cmd = app.add_subcommand(
      "image", "OCI images without a registry: import, list, remove");
  image_cmd->require_subcommand(1);
  std::string image_file;
  std::vector<std::string> image_names;
  bool image_no_wait = false;
  auto* im_import = image_cmd->add_subcommand(
      "import",
      "Load an image archive (OCI image layout or `docker save` output, "
      "plain or gzipped) into every node");
  gw_opt(im_import);
  im_import->add_option("FILE", image_file, "The archive")->required();
  im_import->add_flag("--no-wait", image_no_wait,
                      "Return once the gateway has it, before the nodes");
  auto* im_list = image_cmd->add_subcommand("list", "List images and nodes");
  im_list->alias("ls");
  gw_opt(im_list);
  im_list->add_option("-o,--output", output, "table or json");
  auto* im_remove =
      image_cmd->add_subcommand("remove", "Remove images from every node");
  im_remove->alias("rm");
  gw_opt(im_remove);
  im_remove->add_option("IMAGE", image_names, "Image names")->required();

  // gpu
  auto* gpu_cmd = app.add_subcommand(
      "gpu", "The nodes' GPUs and GPU proclets; reclaim a node's GPU");
  gpu_cmd->require_subcommand(1);
  auto* gpu_list =
      gpu_cmd->add_subcommand("list",
                              "GPUs, what is allocated on them, and "
                              "the GPU proclets");
  gpu_list->alias("ls");
  gw_opt(gpu_list);
  gpu_list->add_option("-o,--output", output, "table or json");
  auto* gpu_reclaim = gpu_cmd->add_subcommand(
      "reclaim",
      "Move every GPU proclet off a node's GPU (to another GPU with room, "
      "else onto that node's CPU cores); it takes none until released");
  gw_opt(gpu_reclaim);
  gpu_reclaim->add_option("NODE", name, "Node name")->required();
  auto* gpu_release = gpu_cmd->add_subcommand(
      "release", "Give a reclaimed GPU back to placement and the rebalancer");
  gw_opt(gpu_release);
  gpu_release->add_option("NODE", name, "Node name")->required();
  std::string gpu_memory;
  auto* gpu_resize = gpu_cmd->add_subcommand(
      "resize",
      "Set a GPU proclet's allocation (within its function's "
      "com.silt.gpu.min-memory and max-memory); one holding more is asked to "
      "free down to it first");
  gw_opt(gpu_resize);
  gpu_resize->add_option("ID", name, "GPU proclet id (gN, silt gpu list)")
      ->required();
  gpu_resize->add_option("--memory", gpu_memory, "e.g. 256Mi, 2Gi")->required();

  // local
  LocalOptions local_opts;
  auto* local = app.add_subcommand(
      "local", "Run a gateway and an invoker on this machine");
  local
      ->add_option("--data-dir", local_opts.data_dir,
                   "Where everything is kept")
      ->required();
  local
      ->add_option("--listen", local_opts.listen,
                   "Gateway HTTP API address ADDR:PORT (port 0 picks one)")
      ->capture_default_str();
  local->add_option("--grpc-listen", local_opts.grpc_listen,
                    "Gateway gRPC address the invoker connects to (default: "
                    "--listen's host, port 0 = a free one)");
  local->add_option("--metrics-listen", local_opts.metrics_listen,
                    "Gateway /metrics and /healthz address (default: "
                    "--listen's host, port 0 = a free one)");
  local->add_option("--provider-listen", local_opts.provider_listen,
                    "Also serve the faas-provider API here, for an OpenFaaS "
                    "gateway's functions_provider_url (off by default)");
  local->add_flag("--no-auth", local_opts.no_auth, "Disable basic auth");

  bool short_version = false;
  auto* version = app.add_subcommand(
      "version", "Show the CLI's and the gateway's versions");
  gw_opt(version);
  version->add_flag("--short-version", short_version,
                    "Print only the CLI version");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    bool help = dynamic_cast<const CLI::CallForHelp*>(&e) != nullptr ||
                dynamic_cast<const CLI::CallForAllHelp*>(&e) != nullptr;
    if (std::optional<int> code = ReportUnknownWord(app, help)) return *code;
    return app.exit(e);
  }

  try {
    if (*login) {
      Login(gateway, user, password, password_stdin);
    } else if (*logout) {
      Logout(gateway);
    } else if (*list) {
      List(Client{ResolveGateway(gateway), token}, ns, verbose, output);
    } else if (*describe) {
      Describe(Client{ResolveGateway(gateway), token}, name, ns);
    } else if (*nodes_cmd) {
      NodesList(Client{ResolveGateway(gateway), token}, output);
    } else if (*events_cmd || *top_cmd) {
      Client c{ResolveGateway(gateway), token};
      JsonGetter get = [&c](const std::string& path) {
        return GetJson(c, path, "gateway's answer");
      };
      if (*events_cmd) PrintEvents(get, events_follow, output);
      if (*top_cmd)
        Top(get, std::chrono::milliseconds(top_interval_ms), top_frames);
    } else if (*node_cmd) {
      Client c{ResolveGateway(gateway), token};
      PostAndPrint(c, "/system/nodes/" + UrlEncode(name) + "/drain", "{}",
                   [&](const json& j) {
                     for (const auto& m : j.value("moved", json::array()))
                       PrintMigration(m);
                     std::cout << "Drained " << name << ": "
                               << j.value("moved", json::array()).size()
                               << " proclet(s) moved." << std::endl;
                   });
    } else if (*proclets_cmd) {
      Client c{ResolveGateway(gateway), token};
      if (*pl_list) ProcletsList(c, ns, function_filter, output);
      if (*pl_migrate) {
        json body{{"node", target_node}};
        if (!target_backend.empty()) body["backend"] = target_backend;
        PostAndPrint(c, "/system/proclets/" + UrlEncode(name) + "/migrate",
                     body.dump(), [](const json& m) {
                       if (m.value("kind", "") == "gpu")
                         PrintGpuMove(m);
                       else
                         PrintMigration(m);
                     });
      }
    } else if (*state_cmd) {
      Client c{ResolveGateway(gateway), token};
      if (*st_list) StateList(c, ns, output);
      if (*st_inspect)
        std::cout << GetJson(c,
                             "/system/state/" + UrlEncode(name) + NsQuery(ns),
                             "state")
                         .dump(2)
                  << std::endl;
      if (*st_delete) {
        HttpResult r =
            c.Call("DELETE", "/system/state/" + UrlEncode(name) + NsQuery(ns));
        if (r.status != 202)
          Fail(absl::StrCat("error (", r.status, "): ", Trimmed(r.body)));
        std::cout << "Deleted state " << name << "." << std::endl;
      }
    } else if (*snapshot_cmd) {
      Client c{ResolveGateway(gateway), token};
      if (*snap_list) SnapshotList(c, ns, "", false);
      if (*snap_inspect) SnapshotList(c, ns, name, true);
      if (*snap_delete) SnapshotDelete(c, ns, name);
    } else if (*remove) {
      std::vector<std::pair<std::string, std::string>> targets;
      std::string stack_gateway;
      if (!stack_file.empty()) {
        auto stack = LoadStack(stack_file);
        if (!stack.ok()) Fail(stack.status().message());
        stack_gateway = stack->gateway;
        for (const auto& f : stack->functions)
          targets.emplace_back(f.name, ns.empty() ? f.ns : ns);
      }
      for (const auto& n : filter_names) targets.emplace_back(n, ns);
      if (targets.empty()) Fail("give a function NAME or -f stack.yml");
      Client c{ResolveGateway(gateway, stack_gateway), token};
      bool ok = true;
      for (const auto& [n, fns] : targets) ok = RemoveOne(c, n, fns) && ok;
      if (!ok) return 1;
    } else if (*deploy) {
      std::vector<StackFunction> fns;
      std::string stack_gateway;
      if (!image.empty() || !name.empty()) {
        if (image.empty() || name.empty())
          Fail("--image and --name go together");
        StackFunction f;
        f.name = name;
        f.image = image;
        fns.push_back(f);
      } else {
        if (stack_file.empty()) stack_file = "stack.yml";
        auto stack = LoadStack(stack_file, envsubst);
        if (!stack.ok()) Fail(stack.status().message());
        stack_gateway = stack->gateway;
        for (auto& f : stack->functions) {
          if (!filter.empty() && f.name != filter) continue;
          // A function built with `silt build` deploys its bundle.
          if (!f.lang.empty() &&
              f.image.find("@sha256:") == std::string::npos) {
            if (auto b = ReadBuiltBundle(StackDir(stack_file), f); b.ok())
              f.image = BundleImage(f, b->digest);
          }
          fns.push_back(std::move(f));
        }
        if (fns.empty())
          Fail(absl::StrCat("no function named ", filter, " in ", stack_file));
      }
      StringMap extra_env = ParseKeyValues(env, "--env");
      StringMap extra_labels = ParseKeyValues(labels, "--label");
      if (no_snapshot) extra_labels["com.silt.snapshot"] = "false";
      StringMap extra_annotations = ParseKeyValues(annotations, "--annotation");
      Client c{ResolveGateway(gateway, stack_gateway), token};
      int failed = 0;
      for (auto& f : fns) {
        if (!ns.empty()) f.ns = ns;
        if (!fprocess.empty()) f.fprocess = fprocess;
        for (const auto& [k, v] : extra_env) f.environment[k] = v;
        if (!extra_labels.empty()) {
          if (!f.labels) f.labels.emplace();
          for (const auto& [k, v] : extra_labels) (*f.labels)[k] = v;
        }
        if (!extra_annotations.empty()) {
          if (!f.annotations) f.annotations.emplace();
          for (const auto& [k, v] : extra_annotations) (*f.annotations)[k] = v;
        }
        for (const auto& s : secrets) f.secrets.push_back(s);
        for (const auto& s : constraints) f.constraints.push_back(s);
        if (!DeployOne(c, f, replace, update)) ++failed;
      }
      if (failed > 0) {
        std::cerr << "Function '" << failed << "' failed to deploy"
                  << std::endl;
        return 1;
      }
    } else if (*secret) {
      Client c{ResolveGateway(gateway), token};
      if (*secret_list) {
        HttpResult r = c.Call("GET", "/system/secrets" + NsQuery(ns));
        if (r.status != 200)
          Fail(absl::StrCat("server returned unexpected status code: ",
                            r.status, " - ", Trimmed(r.body)));
        json list = json::parse(r.body, nullptr, false);
        if (!list.is_array())
          Fail("cannot parse the secret list from the gateway");
        if (list.empty()) {
          std::cout << "No secrets found." << std::endl;
        } else {
          std::cout << absl::StrFormat("%-20s\t%s\n", "NAME", "NAMESPACE");
          for (const auto& s : list)
            std::cout << absl::StrFormat("%-20s\t%s\n", s.value("name", ""),
                                         s.value("namespace", ""));
        }
      } else if (*secret_remove) {
        json body = {{"name", secret_name}};
        if (!ns.empty()) body["namespace"] = ns;
        HttpResult r = c.Call("DELETE", "/system/secrets", body.dump());
        if (r.status == 404)
          Fail(absl::StrCat("unable to find secret: ", secret_name));
        if (r.status != 200 && r.status != 202 && r.status != 204)
          Fail(absl::StrCat("server returned unexpected status code: ",
                            r.status, " - ", Trimmed(r.body)));
        std::cout << "Removed.. OK." << std::endl;
      } else {
        bool literal_set = false;
        for (auto* cmd : {secret_create, secret_update})
          literal_set = literal_set || cmd->count("--from-literal") > 0;
        std::string value = SecretValue(literal, from_file, literal_set);
        if (value.empty())
          Fail(
              "must provide a non-empty secret via --from-literal, --from-file "
              "or STDIN");
        json body = {{"name", secret_name}, {"value", value}};
        if (!ns.empty()) body["namespace"] = ns;
        bool is_update = secret_update->parsed();
        std::cout << (is_update ? "Updating" : "Creating")
                  << " secret: " << secret_name << "."
                  << (ns.empty() ? kDefaultNamespace : ns) << std::endl;
        HttpResult r =
            c.Call(is_update ? "PUT" : "POST", "/system/secrets", body.dump());
        if (!is_update && r.status == 409 && secret_replace) {
          r = c.Call("PUT", "/system/secrets", body.dump());
        }
        if (r.status == 409) {
          Fail(absl::StrCat("secret with the name \"", secret_name,
                            "\" already exists, use --replace to update it"));
        }
        if (r.status == 404)
          Fail(absl::StrCat("unable to find secret: ", secret_name));
        if (r.status < 200 || r.status > 202)
          Fail(absl::StrCat("server returned unexpected status code: ",
                            r.status, " - ", Trimmed(r.body)));
        std::cout << (is_update ? "Updated" : "Created") << ": " << r.status
                  << " OK" << std::endl;
      }
    } else if (*namespaces) {
      Client c{ResolveGateway(gateway), token};
      if (*ns_create) {
        json body = {{"name", ns_name},
                     {"labels", {{"openfaas", "1"}}},
                     {"annotations", {{"openfaas", "1"}}}};
        HttpResult r = c.Call("POST", "/system/namespace/", body.dump());
        if (r.status != 201 && r.status != 200 && r.status != 202)
          Fail(absl::StrCat("cannot create namespace ", ns_name, ": ",
                            Trimmed(r.body)));
        std::cout << "Namespace created: " << ns_name << std::endl;
      } else if (*ns_remove) {
        HttpResult r =
            c.Call("DELETE", "/system/namespace/" + UrlEncode(ns_name));
        if (r.status != 202 && r.status != 200)
          Fail(absl::StrCat("cannot remove namespace ", ns_name, ": ",
                            Trimmed(r.body)));
        std::cout << "Namespace removed: " << ns_name << std::endl;
      } else {
        HttpResult r = c.Call("GET", "/system/namespaces");
        if (r.status != 200)
          Fail(absl::StrCat("server returned unexpected status code: ",
                            r.status, " - ", Trimmed(r.body)));
        json list = json::parse(r.body, nullptr, false);
        if (!list.is_array())
          Fail("cannot parse the namespace list from the gateway");
        std::cout << "Namespaces:" << std::endl;
        for (const auto& n : list)
          std::cout << " - " << n.get<std::string>() << std::endl;
      }
    } else if (*version) {
      Version(gateway, token, short_version);
    } else if (*build || *push || *up) {
      if (stack_file.empty()) stack_file = "stack.yml";
      auto stack = LoadStack(stack_file);
      if (!stack.ok()) Fail(stack.status().message());
      std::string dir = StackDir(stack_file);
      auto fns = SelectFunctions(*stack, build_filter, stack_file);
      Client c{ResolveGateway(gateway, stack->gateway), token};
      int failed = 0;
      for (auto& f : fns) {
        BuiltBundle b;
        if (*push) {
          auto built = ReadBuiltBundle(dir, f);
          if (!built.ok()) Fail(built.status().message());
          b = *built;
        } else {
          b = BuildOne(dir, f);
        }
        if (*build) continue;
        PushOne(c, f, b);
        if (*up) {
          if (!ns.empty()) f.ns = ns;
          f.image = BundleImage(f, b.digest);
          if (!DeployOne(c, f, false, true)) ++failed;
        }
      }
      if (failed > 0) return 1;
    } else if (*new_cmd) {
      NewFunction(new_name, new_lang,
                  stack_file.empty() ? "stack.yml" : stack_file);
    } else if (*logs) {
      Logs(Client{ResolveGateway(gateway), token}, name, ns, follow, lines,
           since, since_time, log_output);
    } else if (*invoke) {
      if (!callback_url.empty() && !invoke_async)
        Fail("--callback-url needs --async");
      return Invoke(Client{ResolveGateway(gateway), token}, name, ns, method,
                    headers, query, content_type, show_headers, invoke_async,
                    callback_url);
    } else if (*async_cmd) {
      Client c{ResolveGateway(gateway), token};
      Requester send = [&c](const std::string& m, const std::string& path,
                            const std::string& body) {
        return c.Call(m, path, body);
      };
      if (async_dead) async_sel.state = "dead";
      if (*as_list) return AsyncList(send, async_sel, output);
      if (*as_retry) return AsyncRetry(send, call_ids, async_all, async_sel);
      if (*as_remove) return AsyncRemove(send, call_ids);
    } else if (*image_cmd) {
      Client c{ResolveGateway(gateway), token};
      Requester send = [&c](const std::string& m, const std::string& path,
                            const std::string& body) {
        // An import waits for every node to unpack the image.
        return c.Call(m, path, body, true, std::chrono::minutes(10));
      };
      if (*im_import) return ImageImport(send, image_file, !image_no_wait);
      if (*im_list) return ImageList(send, output);
      if (*im_remove) return ImageRemove(send, image_names);
    } else if (*gpu_cmd) {
      Client c{ResolveGateway(gateway), token};
      Requester send = [&c](const std::string& m, const std::string& path,
                            const std::string& body) {
        return c.Call(m, path, body, true, std::chrono::minutes(10));
      };
      if (*gpu_list) return GpuList(send, output);
      if (*gpu_reclaim) return GpuReclaim(send, name);
      if (*gpu_release) return GpuRelease(send, name);
      if (*gpu_resize) return GpuResize(send, name, gpu_memory);
    } else if (*local) {
      return Local(local_opts);
    }
  } catch (const Exit& e) {
    return e.code;
  }
  return 0;
}

}  // namespace silt::deploy
