#include "deploy/build.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proclets/bundle.h"
#include "silt/abi.h"
#include "silt/state_wire.h"

namespace silt::deploy {
namespace fs = std::filesystem;
namespace {

absl::StatusOr<std::string> ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", p.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool IsCppSource(const fs::path& p) {
  std::string ext = p.extension().string();
  return ext == ".cc" || ext == ".cpp" || ext == ".cxx";
}

// Runs argv, capturing stdout+stderr into *out; returns the exit code.
int RunCapture(const std::vector<std::string>& argv, std::string* out) {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    fprintf(stderr, "cannot run %s\n", args[0]);
    _exit(127);
  }
  close(p[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof(buf))) > 0)
    out->append(buf, static_cast<size_t>(n));
  close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

// nvcc: $NVCC, on PATH, or where the CUDA Toolkit installs it; empty if none.
std::string FindNvcc() {
  if (const char* e = std::getenv("NVCC"); e && *e) return e;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':'))
      if (!dir.empty() && access((dir + "/nvcc").c_str(), X_OK) == 0)
        return dir + "/nvcc";
  }
  if (access("/usr/local/cuda/bin/nvcc", X_OK) == 0)
    return "/usr/local/cuda/bin/nvcc";
  return {};
}

// Each <module>.cu of a C++ function, built twice (silt/gpu_kernel.h): to
// PTX with nvcc, which the CUDA backend loads on any GPU model, and to a host
// library, which the host backend runs on CPU cores. Both go into the bundle
// as kernels/<module>.ptx and kernels/<module>.host.so.
absl::Status BuildKernels(const std::string& fn_name,
                          const std::vector<std::string>& kernels,
                          const std::string& sdk, const fs::path& handler,
                          const fs::path& out_dir,
                          std::vector<proclets::BundleFile>* files,
                          std::string* log) {
  if (kernels.empty()) return absl::OkStatus();
  const std::string nvcc = FindNvcc();
  if (nvcc.empty() && log)
    *log +=
        "no nvcc (install the CUDA Toolkit or set NVCC): the kernels run "
        "only on nodes' CPU cores (the host backend)\n";
  fs::create_directories(out_dir / "kernels");
  const char* cxx = std::getenv("CXX");
  for (const auto& source : kernels) {
    const std::string module = fs::path(source).stem().string();
    if (!wire::ValidStructureName(module))
      return absl::InvalidArgumentError(absl::StrCat(
          "function ", fn_name, ": kernel file ", source,
          ": name it <module>.cu with <module> of [a-z0-9._-] (it names the "
          "module in ctx.Gpu().Load)"));
    struct Output {
      std::string suffix;
      std::vector<std::string> argv;
    };
    std::vector<Output> outputs;
    const std::string host =
        (out_dir / "kernels" / (module + ".host.so")).string();
    outputs.push_back(
        {".host.so",
         {cxx && *cxx ? cxx : "c++", "-std=c++20", "-O2", "-fPIC", "-shared",
          "-fvisibility=hidden", "-x", "c++", "-I" + sdk,
          "-I" + handler.string(), "-o", host, source}});
    if (!nvcc.empty()) {
      const std::string ptx =
          (out_dir / "kernels" / (module + ".ptx")).string();
      // PTX for compute capability 7.5 and up: the driver JIT-compiles it
      // for whatever GPU the proclet lands on.
      outputs.push_back({".ptx",
                         {nvcc, "-ptx", "-arch=compute_75", "-O3", "-I" + sdk,
                          "-I" + handler.string(), "-o", ptx, source}});
    }
    for (const auto& o : outputs) {
      if (log) *log += absl::StrJoin(o.argv, " ") + "\n";
      std::string output;
      int rc = RunCapture(o.argv, &output);
      if (log) *log += output;
      if (rc != 0)
        return absl::InvalidArgumentError(
            absl::StrCat("compiling the kernels of ", fn_name, " (", source,
                         ") failed (exit ", rc, "):\n", output));
      auto content = ReadFile(o.argv[o.argv.size() - 2]);
      if (!content.ok()) return content.status();
      files->push_back(
          {"kernels/" + module + o.suffix, *std::move(content), 0644u});
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string BundlePath(const std::string& stack_dir, const StackFunction& fn) {
  return (fs::path(stack_dir) / "build" / (fn.name + ".bundle")).string();
}

absl::StatusOr<std::string> SdkIncludeDir() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("SILT_SDK_INCLUDE"); env && *env)
    candidates.push_back(env);
  candidates.push_back(SILT_SOURCE_SDK_INCLUDE);
  candidates.push_back("/usr/local/include");
  for (const auto& c : candidates) {
    if (fs::exists(fs::path(c) / "silt" / "function.h")) return c;
  }
  return absl::NotFoundError(
      absl::StrCat("the Silt SDK (silt/function.h) is not in any of: ",
                   absl::StrJoin(candidates, ", "), "; set SILT_SDK_INCLUDE"));
}

absl::StatusOr<BuiltBundle> BuildFunction(const std::string& stack_dir,
                                          const StackFunction& fn,
                                          std::string* log) {
  std::string lang = fn.lang.empty() ? "exec" : fn.lang;
  if (lang != "cpp" && lang != "exec" && lang != "python") {
    return absl::InvalidArgumentError(
        absl::StrCat("function ", fn.name, ": lang \"", fn.lang,
                     "\" is not supported: use cpp, python or exec"));
  }
  if (fn.handler.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("function ", fn.name, " has no handler directory"));
  fs::path handler = fs::path(stack_dir) / fn.handler;
  if (!fs::is_directory(handler)) {
    return absl::NotFoundError(absl::StrCat("function ", fn.name,
                                            ": handler directory ",
                                            handler.string(), " not found"));
  }

  // Every regular file of the handler directory travels in the bundle (sources
  // excepted for C++, which become handler.so).
  std::vector<proclets::BundleFile> files;
  std::vector<std::string> sources, kernels;
  for (auto it = fs::recursive_directory_iterator(handler);
       it != fs::recursive_directory_iterator(); ++it) {
    if (!it->is_regular_file()) continue;
    std::string rel = fs::relative(it->path(), handler).string();
    if (absl::StartsWith(rel, "build/") || absl::StartsWith(rel, ".")) continue;
    if (lang == "cpp" &&
        (IsCppSource(it->path()) || it->path().extension() == ".h" ||
         it->path().extension() == ".cu" || it->path().extension() == ".cuh")) {
      if (IsCppSource(it->path())) sources.push_back(it->path().string());
      if (it->path().extension() == ".cu")
        kernels.push_back(it->path().string());
      continue;
    }
    auto content = ReadFile(it->path());
    if (!content.ok()) return content.status();
    auto perms = it->status().permissions();
    bool exec = (perms & fs::perms::owner_exec) != fs::perms::none;
    files.push_back({rel, *std::move(content), exec ? 0755u : 0644u});
  }

  proclets::BundleManifest m;
  m.name = fn.name;
  m.lang = lang;
  if (lang == "cpp") {
    std::sort(sources.begin(), sources.end());
    if (sources.empty())
      return absl::InvalidArgumentError(absl::StrCat(
          "function ", fn.name, ": no .cc/.cpp sources in ", handler.string()));
    auto sdk = SdkIncludeDir();
    if (!sdk.ok()) return sdk.status();
    fs::path out_dir = fs::path(stack_dir) / "build" / fn.name;
    fs::create_directories(out_dir);
    fs::path so = out_dir / "handler.so";
    const char* cxx = std::getenv("CXX");
    std::vector<std::string> argv = {cxx && *cxx ? cxx : "c++",
                                     "-std=c++20",
                                     "-O2",
                                     "-fPIC",
                                     "-shared",
                                     "-fvisibility=hidden",
                                     "-I" + *sdk,
                                     "-I" + handler.string(),
                                     "-o",
                                     so.string()};
    argv.insert(argv.end(), sources.begin(), sources.end());
    if (log) *log += absl::StrJoin(argv, " ") + "\n";
    std::string output;
    int rc = RunCapture(argv, &output);
    if (log) *log += output;
    if (rc != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compiling ", fn.name, " failed (exit ", rc, "):\n", output));
    }
    auto content = ReadFile(so);
    if (!content.ok()) return content.status();
    files.push_back({"handler.so", *std::move(content), 0755});
    std::sort(kernels.begin(), kernels.end());
    if (auto s =
            BuildKernels(fn.name, kernels, *sdk, handler, out_dir, &files, log);
        !s.ok())
      return s;
    m.kind = "native";
    m.abi = SILT_ABI_VERSION;
    m.entry = "handler.so";
  } else {
    std::string fprocess = fn.fprocess;
    if (fprocess.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("function ", fn.name, ": lang ", lang,
                       " needs fprocess (the command to run)"));
    }
    m.kind = "exec";
    m.entry = fprocess;
    auto mode = fn.environment.find("mode");
    m.mode = mode == fn.environment.end() ? "classic" : mode->second;
    if (m.mode == "streaming" || m.mode == "serializing") m.mode = "classic";
    if (m.mode != "classic" && m.mode != "http") {
      return absl::InvalidArgumentError(
          absl::StrCat("function ", fn.name, ": mode \"", m.mode,
                       "\" is not supported: use classic or http"));
    }
    if (m.mode == "http") {
      auto up = fn.environment.find("upstream_url");
      m.upstream_url =
          up == fn.environment.end() ? "http://127.0.0.1:5000" : up->second;
    }
  }
  auto tar = proclets::PackBundle(m, std::move(files));
  if (!tar.ok()) return tar.status();
  BuiltBundle b;
  b.path = BundlePath(stack_dir, fn);
  b.digest = proclets::Sha256Digest(*tar);
  b.kind = m.kind;
  b.size = tar->size();
  fs::create_directories(fs::path(b.path).parent_path());
  std::ofstream(b.path, std::ios::binary) << *tar;
  return b;
}

absl::StatusOr<BuiltBundle> ReadBuiltBundle(const std::string& stack_dir,
                                            const StackFunction& fn) {
  BuiltBundle b;
  b.path = BundlePath(stack_dir, fn);
  auto tar = ReadFile(b.path);
  if (!tar.ok()) {
    return absl::NotFoundError(absl::StrCat("function ", fn.name,
                                            " is not built (no ", b.path,
                                            "): run silt build first"));
  }
  auto m = proclets::ReadBundleManifest(*tar);
  if (!m.ok()) return m.status();
  b.digest = proclets::Sha256Digest(*tar);
  b.kind = m->kind;
  b.size = tar->size();
  return b;
}

}  // namespace silt::deploy
