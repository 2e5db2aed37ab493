#include "common/gateway_process.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proclets/bundle.h"

namespace silt::testing {

absl::StatusOr<GatewayProcess> GatewayProcess::Start(
    const std::string& data_dir, const std::vector<std::string>& extra,
    const std::string& grpc_listen) {
  std::vector<std::string> argv = {
      SILT_GATEWAY_BIN,   "--listen",    "127.0.0.1:0",
      "--metrics-listen", "127.0.0.1:0", "--grpc-listen",
      grpc_listen,        "--data-dir",  data_dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto p = Process::Start(argv);
  if (!p.ok()) return p.status();
  GatewayProcess g;
  g.process_ = *std::move(p);
  g.data_dir_ = data_dir;
  auto metrics =
      g.process_.WaitForLine("metrics on ", std::chrono::seconds(30));
  if (!metrics.ok()) return metrics.status();
  g.metrics_url_ = "http://" + metrics->substr(11);
  auto grpc =
      g.process_.WaitForLine("invokers connect to ", std::chrono::seconds(30));
  if (!grpc.ok()) return grpc.status();
  g.grpc_address_ = grpc->substr(20);
  if (std::find(extra.begin(), extra.end(), "--provider-listen") !=
      extra.end()) {
    auto provider = g.process_.WaitForLine("faas-provider API on ",
                                           std::chrono::seconds(30));
    if (!provider.ok()) return provider.status();
    g.provider_url_ = "http://" + provider->substr(21);
  }
  auto line = g.process_.WaitForLine("listening on ", std::chrono::seconds(30));
  if (!line.ok()) return line.status();
  g.url_ = "http://" + line->substr(13);
  return g;
}

std::string GatewayProcess::password() const {
  std::ifstream in(data_dir_ + "/secrets/basic-auth-password");
  std::stringstream ss;
  ss << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

std::string GatewayProcess::auth_header() const {
  return "Basic " + absl::Base64Escape("admin:" + password());
}

std::string GatewayProcess::PushTestBundle(const std::string& name) const {
  return PushExecBundle(name, "cat",
                        {{"README", "test bundle " + name + "\n"}});
}

std::string GatewayProcess::PushExecBundle(
    const std::string& name, const std::string& entry,
    const std::vector<std::pair<std::string, std::string>>& files) const {
  proclets::BundleManifest m;
  m.kind = "exec";
  m.entry = entry;
  m.mode = "classic";
  m.name = name;
  std::vector<proclets::BundleFile> contents;
  for (const auto& [path, content] : files)
    contents.push_back({path, content, 0644});
  auto tar = proclets::PackBundle(m, std::move(contents));
  EXPECT_TRUE(tar.ok()) << tar.status();
  std::string digest = proclets::Sha256Digest(*tar);
  auto r = Call("POST", "/system/bundles?digest=" + digest, *tar);
  EXPECT_TRUE(r.status == 201 || r.status == 200) << r.status << " " << r.body;
  return name + "@" + digest;
}

deploy::HttpResult GatewayProcess::Call(const std::string& method,
                                        const std::string& path,
                                        const std::string& body, bool with_auth,
                                        const deploy::Headers& headers) const {
  deploy::HttpCall call;
  call.method = method;
  call.url = url_ + path;
  call.body = body;
  call.headers = headers;
  if (with_auth) call.headers.emplace_back("Authorization", auth_header());
  auto r = deploy::Send(call);
  EXPECT_TRUE(r.ok()) << method << " " << path << ": " << r.status();
  return r.ok() ? *r : deploy::HttpResult{};
}

}  // namespace silt::testing
