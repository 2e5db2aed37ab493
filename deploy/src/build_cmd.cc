#include "build_cmd.h"

#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "deploy/build.h"
#include "functions_cmd.h"

namespace silt::deploy {
namespace {

using nlohmann::json;

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

}  // namespace

std::string StackDir(const std::string& stack_file) {
  std::string dir = std::filesystem::path(stack_file).parent_path().string();
  return dir.empty() ? "." : dir;
}

// The image a built function deploys as: NAME@sha256:<digest>.
std::string BundleImage(const StackFunction& f, const std::string& digest) {
  std::string base = f.image.empty() ? f.name : f.image;
  if (size_t at = base.find('@'); at != std::string::npos)
    base = base.substr(0, at);
  return base + "@" + digest;
}

int BuildPushUp(const GatewayFlags& g, const std::string& ns,
                std::string stack_file, const std::string& filter,
                BuildStep step) {
  if (stack_file.empty()) stack_file = "stack.yml";
  auto stack = LoadStack(stack_file);
  if (!stack.ok()) Fail(stack.status().message());
  std::string dir = StackDir(stack_file);
  auto fns = SelectFunctions(*stack, filter, stack_file);
  Client client = g.MakeClient(stack->gateway);
  int failed = 0;
  for (auto& f : fns) {
    BuiltBundle b;
    if (step == BuildStep::kPush) {
      auto built = ReadBuiltBundle(dir, f);
      if (!built.ok()) Fail(built.status().message());
      b = *built;
    } else {
      b = BuildOne(dir, f);
    }
    if (step == BuildStep::kBuild) continue;
    PushOne(client, f, b);
    if (step == BuildStep::kUp) {
      if (!ns.empty()) f.ns = ns;
      f.image = BundleImage(f, b.digest);
      if (!DeployOne(client, f, false, true)) ++failed;
    }
  }
  return failed > 0 ? 1 : 0;
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

}  // namespace silt::deploy
