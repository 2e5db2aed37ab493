// The `silt` command line: every command's flags and what it runs. What
// the commands do is in the *_cmd.cc files; this file only wires them to
// CLI11.
#include "deploy/cli.h"

#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "async_cmd.h"
#include "build_cmd.h"
#include "call_cmd.h"
#include "cli_common.h"
#include "cli_suggest.h"
#include "cluster_cmd.h"
#include "functions_cmd.h"
#include "gpu_cmd.h"
#include "image_cmd.h"
#include "local_cmd.h"
#include "nlohmann/json.hpp"
#include "watch.h"

namespace silt::deploy {
namespace {

using nlohmann::json;

// What the commands share: the gateway and its credentials (-g, -k), the
// namespace (-n) and the output format (-o), each declared by the commands
// that take it.
struct Common : GatewayFlags {
  std::string ns, output;

  void GatewayOptions(CLI::App* cmd) {
    cmd->add_option("-g,--gateway", gateway,
                    "Gateway URL (default $OPENFAAS_URL or " +
                        std::string(kDefaultGateway) + ")");
    cmd->add_option("-k,--token", token,
                    "Bearer token instead of saved credentials");
  }
  void NamespaceOption(CLI::App* cmd) {
    cmd->add_option("-n,--namespace", ns, "Namespace of the function");
  }
  void OutputOption(CLI::App* cmd) {
    cmd->add_option("-o,--output", output, "table or json");
  }
  // For the commands of *_cmd.cc: calls that may take `timeout`.
  Requester MakeRequester(std::chrono::milliseconds timeout) const {
    return [c = MakeClient(), timeout](const std::string& m,
                                       const std::string& path,
                                       const std::string& body) {
      return c.Call(m, path, body, true, timeout);
    };
  }
};

// A top-level command, and what runs when it is the one given: its exit
// code (or Fail).
struct Command {
  CLI::App* app;
  std::function<int()> run;
};
using CommandList = std::vector<Command>;

void AddAuthCommands(CLI::App& app, Common& c, CommandList& out) {
  struct Args {
    std::string user = "admin", password;
    bool password_stdin = false, tls_no_verify = false;
  };
  auto a = std::make_shared<Args>();
  auto* login =
      app.add_subcommand("login", "Save basic-auth credentials for a gateway");
  login->add_option("-g,--gateway", c.gateway, "Gateway URL");
  login->add_option("-u,--username", a->user, "Gateway username")
      ->capture_default_str();
  login->add_option("-p,--password", a->password, "Gateway password");
  login->add_flag("-s,--password-stdin", a->password_stdin,
                  "Read the password from stdin");
  login->add_flag("--tls-no-verify", a->tls_no_verify,
                  "Accepted for faas-cli compatibility");
  out.push_back({login, [&c, a] {
                   Login(c.gateway, a->user, a->password, a->password_stdin);
                   return 0;
                 }});
  auto* logout =
      app.add_subcommand("logout", "Forget the credentials for a gateway");
  logout->add_option("-g,--gateway", c.gateway, "Gateway URL");
  out.push_back({logout, [&c] {
                   Logout(c.gateway);
                   return 0;
                 }});
}

void AddFunctionCommands(CLI::App& app, Common& c, CommandList& out) {
  auto verbose = std::make_shared<bool>(false);
  auto* list = app.add_subcommand("list", "List deployed functions");
  list->alias("ls");
  c.GatewayOptions(list);
  c.NamespaceOption(list);
  list->add_flag("-v,--verbose", *verbose, "Show the image too");
  list->add_option("-o,--output", c.output, "Output format: json")
      ->check(CLI::IsMember({"json"}));
  out.push_back({list, [&c, verbose] {
                   List(c.MakeClient(), c.ns, *verbose, c.output);
                   return 0;
                 }});

  auto name = std::make_shared<std::string>();
  auto* describe = app.add_subcommand("describe", "Show a function's details");
  c.GatewayOptions(describe);
  c.NamespaceOption(describe);
  describe->add_option("NAME", *name, "Function name")->required();
  out.push_back({describe, [&c, name] {
                   Describe(c.MakeClient(), *name, c.ns);
                   return 0;
                 }});

  struct RemoveArgs {
    std::string stack_file;
    std::vector<std::string> names;
  };
  auto r = std::make_shared<RemoveArgs>();
  auto* remove = app.add_subcommand("remove", "Remove deployed functions");
  remove->alias("rm");
  remove->alias("delete");
  c.GatewayOptions(remove);
  c.NamespaceOption(remove);
  remove->add_option("-f,--yaml", r->stack_file,
                     "Stack file whose functions to remove");
  remove->add_option("NAME", r->names, "Function names");
  out.push_back({remove, [&c, r] {
                   std::vector<std::pair<std::string, std::string>> targets;
                   std::string stack_gateway;
                   if (!r->stack_file.empty()) {
                     auto stack = LoadStack(r->stack_file);
                     if (!stack.ok()) Fail(stack.status().message());
                     stack_gateway = stack->gateway;
                     for (const auto& f : stack->functions)
                       targets.emplace_back(f.name, c.ns.empty() ? f.ns : c.ns);
                   }
                   for (const auto& n : r->names) targets.emplace_back(n, c.ns);
                   if (targets.empty())
                     Fail("give a function NAME or -f stack.yml");
                   Client client = c.MakeClient(stack_gateway);
                   bool ok = true;
                   for (const auto& [n, fns] : targets)
                     ok = RemoveOne(client, n, fns) && ok;
                   return ok ? 0 : 1;
                 }});

  auto d = std::make_shared<DeployArgs>();
  auto* deploy = app.add_subcommand(
      "deploy", "Deploy functions from a stack file or flags");
  c.GatewayOptions(deploy);
  c.NamespaceOption(deploy);
  deploy->add_option("-f,--yaml", d->stack_file, "Stack file (stack.yml)");
  deploy->add_option("--filter", d->filter,
                     "Deploy only this function of the stack file");
  deploy->add_option("--image", d->image,
                     "Image (with --name, deploy without a stack file)");
  deploy->add_option("--name", d->name, "Function name (with --image)");
  deploy->add_option("--fprocess", d->fprocess, "Process the watchdog runs");
  deploy->add_option("-e,--env", d->env,
                     "Environment variable KEY=VALUE (repeatable)");
  deploy->add_option("-l,--label", d->labels, "Label KEY=VALUE (repeatable)");
  deploy->add_option("--annotation", d->annotations,
                     "Annotation KEY=VALUE (repeatable)");
  deploy->add_option("--secret", d->secrets, "Secret to mount (repeatable)");
  deploy->add_option("--constraint", d->constraints,
                     "Placement constraint (repeatable)");
  deploy->add_flag("--replace", d->replace,
                   "Remove and re-create existing functions");
  deploy->add_flag("--update,!--no-update", d->update,
                   "Update existing functions in place (default), else create");
  deploy->add_flag("--envsubst,!--no-envsubst", d->envsubst,
                   "Substitute ${VAR} in the stack file (default on)");
  deploy->add_flag("--no-snapshot", d->no_snapshot,
                   "Always boot (label com.silt.snapshot=false): for functions "
                   "whose state must not be cloned");
  out.push_back({deploy, [&c, d] { return Deploy(c, c.ns, *d); }});
}

void AddSnapshotCommands(CLI::App& app, Common& c, CommandList& out) {
  auto name = std::make_shared<std::string>();
  auto* snapshot_cmd =
      app.add_subcommand("snapshot", "Inspect and delete function snapshots");
  snapshot_cmd->require_subcommand(1);
  auto* list = snapshot_cmd->add_subcommand("list", "List snapshots");
  list->alias("ls");
  c.GatewayOptions(list);
  c.NamespaceOption(list);
  auto* inspect = snapshot_cmd->add_subcommand(
      "inspect", "Show a function's snapshots (JSON)");
  c.GatewayOptions(inspect);
  c.NamespaceOption(inspect);
  inspect->add_option("NAME", *name, "Function name")->required();
  auto* del = snapshot_cmd->add_subcommand(
      "delete", "Delete a function's snapshots on every node");
  del->alias("rm");
  c.GatewayOptions(del);
  c.NamespaceOption(del);
  del->add_option("NAME", *name, "Function name")->required();
  out.push_back({snapshot_cmd, [&c, name, list, inspect, del] {
                   Client client = c.MakeClient();
                   if (*list) SnapshotList(client, c.ns, "", false);
                   if (*inspect) SnapshotList(client, c.ns, *name, true);
                   if (*del) SnapshotDelete(client, c.ns, *name);
                   return 0;
                 }});
}

// nodes, events, top, node, proclets, state: the cluster and where the
// pieces of functions are.
void AddClusterCommands(CLI::App& app, Common& c, CommandList& out) {
  auto* nodes_cmd = app.add_subcommand(
      "nodes", "List the invokers: capacity, use and free per resource");
  c.GatewayOptions(nodes_cmd);
  c.OutputOption(nodes_cmd);
  out.push_back({nodes_cmd, [&c] {
                   NodesList(c.MakeClient(), c.output);
                   return 0;
                 }});

  auto follow = std::make_shared<bool>(false);
  auto* events_cmd = app.add_subcommand(
      "events", "Show what the rebalancer moved where, and why");
  c.GatewayOptions(events_cmd);
  events_cmd->add_flag("-f,--follow", *follow, "Keep printing new ones");
  c.OutputOption(events_cmd);
  auto getter = [&c] {
    return JsonGetter([client = c.MakeClient()](const std::string& path) {
      return GetJson(client, path, "gateway's answer");
    });
  };
  out.push_back({events_cmd, [&c, follow, getter] {
                   PrintEvents(getter(), *follow, c.output);
                   return 0;
                 }});

  struct TopArgs {
    int interval_ms = 500, frames = 0;
  };
  auto t = std::make_shared<TopArgs>();
  auto* top_cmd = app.add_subcommand(
      "top", "Watch nodes, their load and the rebalancer's moves live");
  c.GatewayOptions(top_cmd);
  top_cmd->add_option("--interval-ms", t->interval_ms, "Refresh period")
      ->capture_default_str()
      ->check(CLI::Range(50, 60000));
  top_cmd
      ->add_option("-n,--frames", t->frames,
                   "Stop after this many refreshes (0: until Ctrl-C)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  out.push_back({top_cmd, [t, getter] {
                   Top(getter(), std::chrono::milliseconds(t->interval_ms),
                       t->frames);
                   return 0;
                 }});

  auto node = std::make_shared<std::string>();
  auto* node_cmd = app.add_subcommand("node", "Operate on one node");
  node_cmd->require_subcommand(1);
  auto* drain = node_cmd->add_subcommand(
      "drain", "Move every memory proclet off a node (live)");
  c.GatewayOptions(drain);
  drain->add_option("NAME", *node, "Node name")->required();
  out.push_back({node_cmd, [&c, node] {
                   PostAndPrint(
                       c.MakeClient(),
                       "/system/nodes/" + UrlEncode(*node) + "/drain", "{}",
                       [&](const json& j) {
                         for (const auto& m : j.value("moved", json::array()))
                           PrintMigration(m);
                         std::cout << "Drained " << *node << ": "
                                   << j.value("moved", json::array()).size()
                                   << " proclet(s) moved." << std::endl;
                       });
                   return 0;
                 }});

  struct ProcletArgs {
    std::string function, id, to, backend;
  };
  auto p = std::make_shared<ProcletArgs>();
  auto* proclets_cmd =
      app.add_subcommand("proclets", "List and move memory and GPU proclets");
  proclets_cmd->require_subcommand(1);
  auto* pl_list = proclets_cmd->add_subcommand("list", "List proclets");
  pl_list->alias("ls");
  c.GatewayOptions(pl_list);
  c.NamespaceOption(pl_list);
  pl_list->add_option("--function", p->function,
                      "Only the state this function uses");
  c.OutputOption(pl_list);
  auto* pl_migrate = proclets_cmd->add_subcommand(
      "migrate", "Move a proclet to another node while it keeps serving");
  c.GatewayOptions(pl_migrate);
  pl_migrate->add_option("ID", p->id, "Proclet id (silt proclets list)")
      ->required();
  pl_migrate->add_option("--to", p->to, "Target node")->required();
  pl_migrate
      ->add_option("--backend", p->backend,
                   "A GPU proclet's backend there: cuda (its GPU) or host "
                   "(its CPU cores); default: its GPU if it has one")
      ->check(CLI::IsMember({"cuda", "host"}));
  out.push_back({proclets_cmd, [&c, p, pl_list, pl_migrate] {
                   Client client = c.MakeClient();
                   if (*pl_list)
                     ProcletsList(client, c.ns, p->function, c.output);
                   if (*pl_migrate) {
                     json body{{"node", p->to}};
                     if (!p->backend.empty()) body["backend"] = p->backend;
                     PostAndPrint(
                         client,
                         "/system/proclets/" + UrlEncode(p->id) + "/migrate",
                         body.dump(), [](const json& m) {
                           if (m.value("kind", "") == "gpu")
                             PrintGpuMove(m);
                           else
                             PrintMigration(m);
                         });
                   }
                   return 0;
                 }});

  auto name = std::make_shared<std::string>();
  auto* state_cmd = app.add_subcommand(
      "state", "Inspect and delete function state (maps, vectors, queues)");
  state_cmd->require_subcommand(1);
  auto* st_list = state_cmd->add_subcommand("list", "List state structures");
  st_list->alias("ls");
  c.GatewayOptions(st_list);
  c.NamespaceOption(st_list);
  c.OutputOption(st_list);
  auto* st_inspect = state_cmd->add_subcommand(
      "inspect", "Show one structure and its shards (JSON)");
  c.GatewayOptions(st_inspect);
  c.NamespaceOption(st_inspect);
  st_inspect->add_option("NAME", *name, "Structure name")->required();
  auto* st_delete = state_cmd->add_subcommand(
      "delete", "Delete a structure and all its data");
  st_delete->alias("rm");
  c.GatewayOptions(st_delete);
  c.NamespaceOption(st_delete);
  st_delete->add_option("NAME", *name, "Structure name")->required();
  out.push_back(
      {state_cmd, [&c, name, st_list, st_inspect, st_delete] {
         Client client = c.MakeClient();
         const std::string path =
             "/system/state/" + UrlEncode(*name) + NsQuery(c.ns);
         if (*st_list) StateList(client, c.ns, c.output);
         if (*st_inspect)
           std::cout << GetJson(client, path, "state").dump(2) << std::endl;
         if (*st_delete) {
           HttpResult r = client.Call("DELETE", path);
           if (r.status != 202)
             Fail(absl::StrCat("error (", r.status, "): ", Trimmed(r.body)));
           std::cout << "Deleted state " << *name << "." << std::endl;
         }
         return 0;
       }});
}

void AddSecretCommands(CLI::App& app, Common& c, CommandList& out) {
  auto a = std::make_shared<SecretArgs>();
  auto* secret = app.add_subcommand("secret", "Manage secrets");
  secret->require_subcommand(1);
  auto sub = [&](const char* n, const char* d, bool value) {
    auto* s = secret->add_subcommand(n, d);
    c.GatewayOptions(s);
    c.NamespaceOption(s);
    if (std::string(n) != "list")
      s->add_option("NAME", a->name, "Secret name")->required();
    if (value) {
      s->add_option("--from-literal", a->literal, "Secret value");
      s->add_option("--from-file", a->from_file, "Read the value from a file");
    }
    return s;
  };
  auto* create =
      sub("create", "Create a secret (value from stdin by default)", true);
  create->add_flag("--replace", a->replace, "Update the secret if it exists");
  auto* update = sub("update", "Update a secret's value", true);
  auto* list = sub("list", "List secrets (names only)", false);
  list->alias("ls");
  auto* remove = sub("remove", "Remove a secret", false);
  remove->alias("rm");
  out.push_back({secret, [&c, a, create, update, list, remove] {
                   Client client = c.MakeClient();
                   if (*list) {
                     SecretList(client, c.ns);
                   } else if (*remove) {
                     SecretRemove(client, c.ns, a->name);
                   } else {
                     const bool literal_set =
                         create->count("--from-literal") > 0 ||
                         update->count("--from-literal") > 0;
                     SecretPut(client, c.ns, *a, update->parsed(), literal_set);
                   }
                   return 0;
                 }});
}

void AddNamespaceCommands(CLI::App& app, Common& c, CommandList& out) {
  auto name = std::make_shared<std::string>();
  auto* namespaces = app.add_subcommand("namespace", "Manage namespaces");
  namespaces->alias("namespaces");
  namespaces->alias("ns");
  auto* list = namespaces->add_subcommand("list", "List namespaces");
  list->alias("ls");
  c.GatewayOptions(list);
  auto* create = namespaces->add_subcommand("create", "Create a namespace");
  c.GatewayOptions(create);
  create->add_option("NAME", *name, "Namespace")->required();
  auto* remove =
      namespaces->add_subcommand("remove", "Remove an empty namespace");
  remove->alias("rm");
  c.GatewayOptions(remove);
  remove->add_option("NAME", *name, "Namespace")->required();
  c.GatewayOptions(namespaces);
  out.push_back({namespaces, [&c, name, create, remove] {
                   Client client = c.MakeClient();
                   if (*create) {
                     json body = {{"name", *name},
                                  {"labels", {{"openfaas", "1"}}},
                                  {"annotations", {{"openfaas", "1"}}}};
                     HttpResult r =
                         client.Call("POST", "/system/namespace/", body.dump());
                     if (r.status != 201 && r.status != 200 && r.status != 202)
                       Fail(absl::StrCat("cannot create namespace ", *name,
                                         ": ", Trimmed(r.body)));
                     std::cout << "Namespace created: " << *name << std::endl;
                   } else if (*remove) {
                     HttpResult r = client.Call(
                         "DELETE", "/system/namespace/" + UrlEncode(*name));
                     if (r.status != 202 && r.status != 200)
                       Fail(absl::StrCat("cannot remove namespace ", *name,
                                         ": ", Trimmed(r.body)));
                     std::cout << "Namespace removed: " << *name << std::endl;
                   } else {
                     HttpResult r = client.Call("GET", "/system/namespaces");
                     if (r.status != 200)
                       Fail(absl::StrCat(
                           "server returned unexpected status code: ", r.status,
                           " - ", Trimmed(r.body)));
                     json list = json::parse(r.body, nullptr, false);
                     if (!list.is_array())
                       Fail("cannot parse the namespace list from the gateway");
                     std::cout << "Namespaces:" << std::endl;
                     for (const auto& n : list)
                       std::cout << " - " << n.get<std::string>() << std::endl;
                   }
                   return 0;
                 }});
}

void AddBuildCommands(CLI::App& app, Common& c, CommandList& out) {
  struct Args {
    std::string stack_file, filter;
  };
  auto a = std::make_shared<Args>();
  auto* build = app.add_subcommand(
      "build", "Build functions of a stack file into bundles");
  build->add_option("-f,--yaml", a->stack_file, "Stack file")
      ->capture_default_str();
  build->add_option("--filter", a->filter, "Only this function");
  auto* push =
      app.add_subcommand("push", "Upload built bundles to the gateway");
  c.GatewayOptions(push);
  push->add_option("-f,--yaml", a->stack_file, "Stack file");
  push->add_option("--filter", a->filter, "Only this function");
  auto* up = app.add_subcommand("up", "Build, push and deploy a stack file");
  c.GatewayOptions(up);
  c.NamespaceOption(up);
  up->add_option("-f,--yaml", a->stack_file, "Stack file");
  up->add_option("--filter", a->filter, "Only this function");
  for (const auto& step :
       {std::pair{build, BuildStep::kBuild}, std::pair{push, BuildStep::kPush},
        std::pair{up, BuildStep::kUp}})
    out.push_back({step.first, [&c, a, s = step.second] {
                     return BuildPushUp(c, c.ns, a->stack_file, a->filter, s);
                   }});

  struct NewArgs {
    std::string name, lang = "cpp", stack_file;
  };
  auto n = std::make_shared<NewArgs>();
  auto* new_cmd =
      app.add_subcommand("new", "Create a function from a starter template");
  new_cmd->add_option("NAME", n->name, "Function name")->required();
  new_cmd->add_option("--lang", n->lang, "cpp, python or exec")
      ->capture_default_str();
  new_cmd->add_option("-f,--yaml", n->stack_file,
                      "Stack file to add it to (default stack.yml)");
  out.push_back({new_cmd, [n] {
                   NewFunction(
                       n->name, n->lang,
                       n->stack_file.empty() ? "stack.yml" : n->stack_file);
                   return 0;
                 }});
}

void AddCallCommands(CLI::App& app, Common& c, CommandList& out) {
  struct LogArgs {
    std::string name, since, since_time, output = "plain";
    bool follow = false;
    int lines = 0;
  };
  auto l = std::make_shared<LogArgs>();
  auto* logs = app.add_subcommand("logs", "Show a function's log lines");
  c.GatewayOptions(logs);
  c.NamespaceOption(logs);
  logs->add_option("NAME", l->name, "Function name")->required();
  logs->add_flag("-t,--tail,--follow", l->follow, "Keep streaming new lines");
  logs->add_option("--lines", l->lines, "Only the last N lines");
  logs->add_option("--since", l->since,
                   "Only lines newer than this (30s, 5m, 1h)");
  logs->add_option("--since-time", l->since_time,
                   "Only lines newer than this RFC 3339 time");
  logs->add_option("-o,--output", l->output, "plain, raw or json")
      ->check(CLI::IsMember({"plain", "raw", "json"}));
  out.push_back({logs, [&c, l] {
                   Logs(c.MakeClient(), l->name, c.ns, l->follow, l->lines,
                        l->since, l->since_time, l->output);
                   return 0;
                 }});

  struct InvokeArgs {
    std::string name, method = "POST", content_type = "text/plain",
                      callback_url;
    std::vector<std::string> headers, query;
    bool show_headers = false, async = false;
  };
  auto i = std::make_shared<InvokeArgs>();
  auto* invoke =
      app.add_subcommand("invoke", "Call a function (body from stdin)");
  c.GatewayOptions(invoke);
  c.NamespaceOption(invoke);
  invoke->add_option("NAME", i->name, "Function name")->required();
  invoke->add_option("-m,--method", i->method, "HTTP method")
      ->capture_default_str();
  invoke->add_option("-H,--header", i->headers,
                     "Header KEY=VALUE (repeatable)");
  invoke->add_option("--query", i->query, "Query KEY=VALUE (repeatable)");
  invoke->add_option("--content-type", i->content_type, "Content-Type")
      ->capture_default_str();
  invoke->add_flag("-v,--verbose", i->show_headers,
                   "Print the response status and headers to stderr");
  invoke->add_flag("-a,--async", i->async,
                   "Queue the call (POST /async-function): prints its call id");
  invoke->add_option("--callback-url", i->callback_url,
                     "With --async: where the result is POSTed");
  out.push_back({invoke, [&c, i] {
                   if (!i->callback_url.empty() && !i->async)
                     Fail("--callback-url needs --async");
                   return Invoke(c.MakeClient(), i->name, c.ns, i->method,
                                 i->headers, i->query, i->content_type,
                                 i->show_headers, i->async, i->callback_url);
                 }});
}

void AddAsyncCommands(CLI::App& app, Common& c, CommandList& out) {
  struct Args {
    AsyncSelection sel;
    std::vector<std::string> ids;
    bool all = false, dead = false;
  };
  auto a = std::make_shared<Args>();
  auto* async_cmd =
      app.add_subcommand("async", "List, retry and remove queued async calls");
  async_cmd->require_subcommand(1);
  auto* list = async_cmd->add_subcommand(
      "list", "Calls waiting, running, or given up on (dead letters)");
  list->alias("ls");
  auto* retry = async_cmd->add_subcommand(
      "retry", "Put dead letters back in the queue (attempts start over)");
  auto* remove =
      async_cmd->add_subcommand("remove", "Drop queued calls or dead letters");
  remove->alias("rm");
  for (auto* sc : {list, retry}) {
    c.GatewayOptions(sc);
    sc->add_option("-n,--namespace", a->sel.ns, "Only this namespace");
    sc->add_option("--function", a->sel.function, "Only this function");
  }
  list->add_option("--state", a->sel.state, "queued, callback or dead");
  list->add_flag("--dead", a->dead, "Only dead letters");
  c.OutputOption(list);
  retry->add_option("CALL_ID", a->ids, "Calls to retry");
  retry->add_flag("--all", a->all, "Every dead letter selected");
  c.GatewayOptions(remove);
  remove->add_option("CALL_ID", a->ids, "Calls to remove")->required();
  out.push_back({async_cmd, [&c, a, list, retry, remove] {
                   Requester send = c.MakeRequester(std::chrono::seconds(60));
                   if (a->dead) a->sel.state = "dead";
                   if (*list) return AsyncList(send, a->sel, c.output);
                   if (*retry) return AsyncRetry(send, a->ids, a->all, a->sel);
                   return AsyncRemove(send, a->ids);
                 }});
}

void AddImageCommands(CLI::App& app, Common& c, CommandList& out) {
  struct Args {
    std::string file;
    std::vector<std::string> names;
    bool no_wait = false;
  };
  auto a = std::make_shared<Args>();
  auto* image_cmd = app.add_subcommand(
      "image", "OCI images without a registry: import, list, remove");
  image_cmd->require_subcommand(1);
  auto* import = image_cmd->add_subcommand(
      "import",
      "Load an image archive (OCI image layout or `docker save` output, "
      "plain or gzipped) into every node");
  c.GatewayOptions(import);
  import->add_option("FILE", a->file, "The archive")->required();
  import->add_flag("--no-wait", a->no_wait,
                   "Return once the gateway has it, before the nodes");
  auto* list = image_cmd->add_subcommand("list", "List images and nodes");
  list->alias("ls");
  c.GatewayOptions(list);
  c.OutputOption(list);
  auto* remove =
      image_cmd->add_subcommand("remove", "Remove images from every node");
  remove->alias("rm");
  c.GatewayOptions(remove);
  remove->add_option("IMAGE", a->names, "Image names")->required();
  out.push_back({image_cmd, [&c, a, import, list] {
                   // An import waits for every node to unpack the image.
                   Requester send = c.MakeRequester(std::chrono::minutes(10));
                   if (*import) return ImageImport(send, a->file, !a->no_wait);
                   if (*list) return ImageList(send, c.output);
                   return ImageRemove(send, a->names);
                 }});
}

void AddGpuCommands(CLI::App& app, Common& c, CommandList& out) {
  struct Args {
    std::string name, memory;
  };
  auto a = std::make_shared<Args>();
  auto* gpu_cmd = app.add_subcommand(
      "gpu", "The nodes' GPUs and GPU proclets; reclaim a node's GPU");
  gpu_cmd->require_subcommand(1);
  auto* list =
      gpu_cmd->add_subcommand("list",
                              "Show each node's GPUs, what is allocated on "
                              "them, and the GPU proclets");
  list->alias("ls");
  c.GatewayOptions(list);
  c.OutputOption(list);
  auto* reclaim = gpu_cmd->add_subcommand(
      "reclaim",
      "Move every GPU proclet off a node's GPU (to another GPU with room, "
      "else onto that node's CPU cores); it takes none until released");
  c.GatewayOptions(reclaim);
  reclaim->add_option("NODE", a->name, "Node name")->required();
  auto* release = gpu_cmd->add_subcommand(
      "release", "Give a reclaimed GPU back to placement and the rebalancer");
  c.GatewayOptions(release);
  release->add_option("NODE", a->name, "Node name")->required();
  auto* resize = gpu_cmd->add_subcommand(
      "resize",
      "Set a GPU proclet's allocation (within its function's "
      "com.silt.gpu.min-memory and max-memory); one holding more is asked to "
      "free down to it first");
  c.GatewayOptions(resize);
  resize->add_option("ID", a->name, "GPU proclet id (gN, silt gpu list)")
      ->required();
  resize->add_option("--memory", a->memory, "e.g. 256Mi, 2Gi")->required();
  out.push_back({gpu_cmd, [&c, a, list, reclaim, release] {
                   Requester send = c.MakeRequester(std::chrono::minutes(10));
                   if (*list) return GpuList(send, c.output);
                   if (*reclaim) return GpuReclaim(send, a->name);
                   if (*release) return GpuRelease(send, a->name);
                   return GpuResize(send, a->name, a->memory);
                 }});
}

void AddLocalCommand(CLI::App& app, CommandList& out) {
  auto o = std::make_shared<LocalOptions>();
  auto* local = app.add_subcommand(
      "local", "Run a gateway and an invoker on this machine");
  local->add_option("--data-dir", o->data_dir, "Where everything is kept")
      ->required();
  local
      ->add_option("--listen", o->listen,
                   "Gateway HTTP API address ADDR:PORT (port 0 picks one)")
      ->capture_default_str();
  local->add_option("--grpc-listen", o->grpc_listen,
                    "Gateway gRPC address the invoker connects to (default: "
                    "--listen's host, port 0 = a free one)");
  local->add_option("--metrics-listen", o->metrics_listen,
                    "Gateway /metrics and /healthz address (default: "
                    "--listen's host, port 0 = a free one)");
  local->add_option("--provider-listen", o->provider_listen,
                    "Also serve the faas-provider API here, for an OpenFaaS "
                    "gateway's functions_provider_url (off by default)");
  local->add_flag("--no-auth", o->no_auth, "Disable basic auth");
  local->add_flag("--no-instance-leases", o->no_instance_leases,
                  "Send every call through the invoker's call port (warm "
                  "calls otherwise go straight to instances it lends the "
                  "gateway)");
  out.push_back({local, [o] { return Local(*o); }});
}

}  // namespace

int RunCli(int argc, char** argv) {
  CLI::App app{
      "silt: deploy and manage functions on Silt (or any OpenFaaS gateway)"};
  app.require_subcommand(1);
  Common common;
  CommandList commands;
  AddAuthCommands(app, common, commands);
  AddFunctionCommands(app, common, commands);
  AddSnapshotCommands(app, common, commands);
  AddClusterCommands(app, common, commands);
  AddSecretCommands(app, common, commands);
  AddNamespaceCommands(app, common, commands);
  AddBuildCommands(app, common, commands);
  AddCallCommands(app, common, commands);
  AddAsyncCommands(app, common, commands);
  AddImageCommands(app, common, commands);
  AddGpuCommands(app, common, commands);
  AddLocalCommand(app, commands);
  bool short_version = false;
  auto* version = app.add_subcommand(
      "version", "Show the CLI's and the gateway's versions");
  common.GatewayOptions(version);
  version->add_flag("--short-version", short_version,
                    "Print only the CLI version");
  commands.push_back({version, [&] {
                        Version(common.gateway, common.token, short_version);
                        return 0;
                      }});

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    bool help = dynamic_cast<const CLI::CallForHelp*>(&e) != nullptr ||
                dynamic_cast<const CLI::CallForAllHelp*>(&e) != nullptr;
    if (std::optional<int> code = ReportUnknownWord(app, help)) return *code;
    return app.exit(e);
  }
  try {
    for (const Command& c : commands)
      if (*c.app) return c.run();
  } catch (const Exit& e) {
    return e.code;
  }
  return 0;
}

}  // namespace silt::deploy
