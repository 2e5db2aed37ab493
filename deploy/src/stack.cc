#include "deploy/stack.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace silt::deploy {
namespace {

// The offset of the first byte that is not part of well-formed UTF-8, or
// npos.
size_t NotUtf8At(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80           ? 1
               : (c >> 5) == 0x6  ? 2
               : (c >> 4) == 0xe  ? 3
               : (c >> 3) == 0x1e ? 4
                                  : 0;
    if (n == 0 || i + n > s.size()) return i;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return i;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and beyond U+10FFFF.
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) ||
        (n == 4 && cp < 0x10000) || (cp >= 0xd800 && cp <= 0xdfff) ||
        cp > 0x10ffff)
      return i;
    i += n;
  }
  return absl::string_view::npos;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  // A regular file only: a device (/dev/zero) or a fifo would never end.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": not a regular file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Reads a scalar/map/sequence with a message naming the field on a type
// mismatch.
absl::Status ReadMap(const YAML::Node& n, const std::string& field,
                     StringMap& out) {
  if (!n || n.IsNull()) return absl::OkStatus();
  if (!n.IsMap())
    return absl::InvalidArgumentError(absl::StrCat(field, " must be a map"));
  for (const auto& kv : n) {
    out[kv.first.as<std::string>()] =
        kv.second.IsNull() ? "" : kv.second.as<std::string>();
  }
  return absl::OkStatus();
}

absl::Status ReadList(const YAML::Node& n, const std::string& field,
                      std::vector<std::string>& out) {
  if (!n || n.IsNull()) return absl::OkStatus();
  if (!n.IsSequence())
    return absl::InvalidArgumentError(absl::StrCat(field, " must be a list"));
  for (const auto& v : n) out.push_back(v.as<std::string>());
  return absl::OkStatus();
}

absl::Status ReadResources(const YAML::Node& n, const std::string& field,
                           StackResources& r) {
  if (!n || n.IsNull()) return absl::OkStatus();
  if (!n.IsMap())
    return absl::InvalidArgumentError(absl::StrCat(field, " must be a map"));
  if (n["memory"]) r.memory = n["memory"].as<std::string>();
  if (n["cpu"]) r.cpu = n["cpu"].as<std::string>();
  return absl::OkStatus();
}

std::string Scalar(const YAML::Node& n) {
  return n && !n.IsNull() ? n.as<std::string>() : std::string();
}

}  // namespace

std::string EnvSubst(
    absl::string_view text,
    const std::function<std::optional<std::string>(const std::string&)>&
        lookup) {
  auto get = [&](const std::string& name) -> std::optional<std::string> {
    if (lookup) return lookup(name);
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '{') {
      size_t close = text.find('}', i + 2);
      if (close != absl::string_view::npos) {
        std::string expr(text.substr(i + 2, close - i - 2));
        std::string name = expr, fallback;
        bool has_default = false;
        if (size_t d = expr.find(":-"); d != std::string::npos) {
          name = expr.substr(0, d);
          fallback = expr.substr(d + 2);
          has_default = true;
        }
        auto v = get(name);
        if (v && (!v->empty() || !has_default)) {
          out += *v;
        } else if (has_default) {
          out += fallback;
        }
        i = close;
        continue;
      }
    }
    out.push_back(text[i]);
  }
  return out;
}

absl::StatusOr<Stack> ParseStack(absl::string_view yaml, const std::string& dir,
                                 bool envsubst) {
  if (size_t bad = NotUtf8At(yaml); bad != absl::string_view::npos)
    return absl::InvalidArgumentError(absl::StrCat(
        "stack file is not UTF-8 text (byte ", bad, "): save it as UTF-8"));
  std::string text = envsubst ? EnvSubst(yaml) : std::string(yaml);
  Stack stack;
  try {
    YAML::Node root = YAML::Load(text);
    if (!root.IsMap())
      return absl::InvalidArgumentError("stack file must be a YAML map");
    if (root["version"]) {
      std::string v = root["version"].as<std::string>();
      if (v != "1.0")
        return absl::InvalidArgumentError(absl::StrCat(
            "stack file version \"", v, "\" is not supported: use 1.0"));
    }
    YAML::Node provider = root["provider"];
    if (provider && provider.IsMap()) {
      stack.provider_name = Scalar(provider["name"]);
      stack.gateway = Scalar(provider["gateway"]);
    }
    if (stack.provider_name != "openfaas") {
      return absl::InvalidArgumentError(
          absl::StrCat("['openfaas'] is the only valid \"provider.name\" for "
                       "the OpenFaaS CLI, but you "
                       "gave: ",
                       stack.provider_name));
    }
    YAML::Node functions = root["functions"];
    if (!functions || !functions.IsMap() || functions.size() == 0)
      return absl::InvalidArgumentError("stack file has no functions");
    for (const auto& kv : functions) {
      StackFunction f;
      f.name = kv.first.as<std::string>();
      const YAML::Node& n = kv.second;
      if (!n.IsMap())
        return absl::InvalidArgumentError(
            absl::StrCat("function ", f.name, " must be a map"));
      std::string where = absl::StrCat("functions.", f.name, ".");
      f.lang = Scalar(n["lang"]);
      if (f.lang == "Dockerfile") f.lang = "dockerfile";
      f.handler = Scalar(n["handler"]);
      f.image = Scalar(n["image"]);
      f.fprocess = Scalar(n["fprocess"]);
      f.ns = Scalar(n["namespace"]);
      if (n["skip_build"]) f.skip_build = n["skip_build"].as<bool>();
      if (n["readonly_root_filesystem"])
        f.readonly_root_filesystem = n["readonly_root_filesystem"].as<bool>();
      std::vector<std::string> env_files;
      for (absl::Status s :
           {ReadList(n["environment_file"], where + "environment_file",
                     env_files),
            ReadList(n["secrets"], where + "secrets", f.secrets),
            ReadList(n["constraints"], where + "constraints", f.constraints),
            ReadResources(n["limits"], where + "limits", f.limits),
            ReadResources(n["requests"], where + "requests", f.requests)}) {
        if (!s.ok()) return s;
      }
      for (const auto& file : env_files) {
        std::string path = std::filesystem::path(dir) / file;
        auto content = ReadFile(path);
        if (!content.ok()) return content.status();
        YAML::Node env = YAML::Load(envsubst ? EnvSubst(*content) : *content);
        if (auto s = ReadMap(env["environment"], path + ": environment",
                             f.environment);
            !s.ok())
          return s;
      }
      if (auto s =
              ReadMap(n["environment"], where + "environment", f.environment);
          !s.ok())
        return s;
      if (n["labels"]) {
        f.labels.emplace();
        if (auto s = ReadMap(n["labels"], where + "labels", *f.labels); !s.ok())
          return s;
      }
      if (n["annotations"]) {
        f.annotations.emplace();
        if (auto s = ReadMap(n["annotations"], where + "annotations",
                             *f.annotations);
            !s.ok())
          return s;
      }
      stack.functions.push_back(std::move(f));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid stack file: ", e.what()));
  }
  return stack;
}

absl::StatusOr<Stack> LoadStack(const std::string& path, bool envsubst) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  auto stack = ParseStack(*text, dir, envsubst);
  if (!stack.ok())
    return absl::Status(stack.status().code(),
                        absl::StrCat(path, ": ", stack.status().message()));
  return stack;
}

std::string DeploymentJson(const StackFunction& f) {
  nlohmann::ordered_json j;
  j["service"] = f.name;
  j["image"] = f.image;
  if (!f.ns.empty()) j["namespace"] = f.ns;
  if (!f.fprocess.empty()) j["envProcess"] = f.fprocess;
  if (!f.environment.empty()) j["envVars"] = f.environment;
  if (!f.constraints.empty()) j["constraints"] = f.constraints;
  if (!f.secrets.empty()) j["secrets"] = f.secrets;
  j["labels"] =
      f.labels ? nlohmann::ordered_json(*f.labels) : nlohmann::ordered_json();
  j["annotations"] = f.annotations ? nlohmann::ordered_json(*f.annotations)
                                   : nlohmann::ordered_json();
  auto resources = [](const StackResources& r) {
    nlohmann::ordered_json o = nlohmann::ordered_json::object();
    if (!r.memory.empty()) o["memory"] = r.memory;
    if (!r.cpu.empty()) o["cpu"] = r.cpu;
    return o;
  };
  if (!f.limits.empty()) j["limits"] = resources(f.limits);
  if (!f.requests.empty()) j["requests"] = resources(f.requests);
  if (f.readonly_root_filesystem) j["readOnlyRootFilesystem"] = true;
  // An environment file's bytes are not checked: never throw on them.
  return j.dump(-1, ' ', false,
                nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace silt::deploy
