#include "functions_cmd.h"

#include <fstream>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "build_cmd.h"
#include "deploy/build.h"
#include "deploy/config.h"
#include "silt/version.h"

namespace silt::deploy {
namespace {

using nlohmann::json;

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

}  // namespace

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

int Deploy(const GatewayFlags& g, const std::string& ns, DeployArgs& a) {
  std::vector<StackFunction> fns;
  std::string stack_gateway;
  if (!a.image.empty() || !a.name.empty()) {
    if (a.image.empty() || a.name.empty())
      Fail("--image and --name go together");
    StackFunction f;
    f.name = a.name;
    f.image = a.image;
    fns.push_back(f);
  } else {
    if (a.stack_file.empty()) a.stack_file = "stack.yml";
    auto stack = LoadStack(a.stack_file, a.envsubst);
    if (!stack.ok()) Fail(stack.status().message());
    stack_gateway = stack->gateway;
    for (auto& f : stack->functions) {
      if (!a.filter.empty() && f.name != a.filter) continue;
      // A function built with `silt build` deploys its bundle.
      if (!f.lang.empty() && f.image.find("@sha256:") == std::string::npos) {
        if (auto b = ReadBuiltBundle(StackDir(a.stack_file), f); b.ok())
          f.image = BundleImage(f, b->digest);
      }
      fns.push_back(std::move(f));
    }
    if (fns.empty())
      Fail(absl::StrCat("no function named ", a.filter, " in ", a.stack_file));
  }
  StringMap extra_env = ParseKeyValues(a.env, "--env");
  StringMap extra_labels = ParseKeyValues(a.labels, "--label");
  if (a.no_snapshot) extra_labels["com.silt.snapshot"] = "false";
  StringMap extra_annotations = ParseKeyValues(a.annotations, "--annotation");
  Client client = g.MakeClient(stack_gateway);
  int failed = 0;
  for (auto& f : fns) {
    if (!ns.empty()) f.ns = ns;
    if (!a.fprocess.empty()) f.fprocess = a.fprocess;
    for (const auto& [k, v] : extra_env) f.environment[k] = v;
    if (!extra_labels.empty()) {
      if (!f.labels) f.labels.emplace();
      for (const auto& [k, v] : extra_labels) (*f.labels)[k] = v;
    }
    if (!extra_annotations.empty()) {
      if (!f.annotations) f.annotations.emplace();
      for (const auto& [k, v] : extra_annotations) (*f.annotations)[k] = v;
    }
    for (const auto& s : a.secrets) f.secrets.push_back(s);
    for (const auto& s : a.constraints) f.constraints.push_back(s);
    if (!DeployOne(client, f, a.replace, a.update)) ++failed;
  }
  if (failed > 0) {
    std::cerr << "Function '" << failed << "' failed to deploy" << std::endl;
    return 1;
  }
  return 0;
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

void SecretList(const Client& client, const std::string& ns) {
  HttpResult r = client.Call("GET", "/system/secrets" + NsQuery(ns));
  if (r.status != 200)
    Fail(absl::StrCat("server returned unexpected status code: ", r.status,
                      " - ", Trimmed(r.body)));
  json list = json::parse(r.body, nullptr, false);
  if (!list.is_array()) Fail("cannot parse the secret list from the gateway");
  if (list.empty()) {
    std::cout << "No secrets found." << std::endl;
    return;
  }
  std::cout << absl::StrFormat("%-20s\t%s\n", "NAME", "NAMESPACE");
  for (const auto& s : list)
    std::cout << absl::StrFormat("%-20s\t%s\n", s.value("name", ""),
                                 s.value("namespace", ""));
}

void SecretRemove(const Client& client, const std::string& ns,
                  const std::string& name) {
  json body = {{"name", name}};
  if (!ns.empty()) body["namespace"] = ns;
  HttpResult r = client.Call("DELETE", "/system/secrets", body.dump());
  if (r.status == 404) Fail(absl::StrCat("unable to find secret: ", name));
  if (r.status != 200 && r.status != 202 && r.status != 204)
    Fail(absl::StrCat("server returned unexpected status code: ", r.status,
                      " - ", Trimmed(r.body)));
  std::cout << "Removed.. OK." << std::endl;
}

// Creates (or, `update`, updates) a secret; `literal_set`: --from-literal
// was given (even empty).
void SecretPut(const Client& client, const std::string& ns, const SecretArgs& a,
               bool update, bool literal_set) {
  std::string value = SecretValue(a.literal, a.from_file, literal_set);
  if (value.empty())
    Fail(
        "must provide a non-empty secret via --from-literal, --from-file "
        "or STDIN");
  json body = {{"name", a.name}, {"value", value}};
  if (!ns.empty()) body["namespace"] = ns;
  std::cout << (update ? "Updating" : "Creating") << " secret: " << a.name
            << "." << (ns.empty() ? kDefaultNamespace : ns) << std::endl;
  HttpResult r =
      client.Call(update ? "PUT" : "POST", "/system/secrets", body.dump());
  if (!update && r.status == 409 && a.replace)
    r = client.Call("PUT", "/system/secrets", body.dump());
  if (r.status == 409)
    Fail(absl::StrCat("secret with the name \"", a.name,
                      "\" already exists, use --replace to update it"));
  if (r.status == 404) Fail(absl::StrCat("unable to find secret: ", a.name));
  if (r.status < 200 || r.status > 202)
    Fail(absl::StrCat("server returned unexpected status code: ", r.status,
                      " - ", Trimmed(r.body)));
  std::cout << (update ? "Updated" : "Created") << ": " << r.status << " OK"
            << std::endl;
}

}  // namespace silt::deploy
