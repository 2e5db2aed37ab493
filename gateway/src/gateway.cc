#include "gateway/gateway.h"

#include <sys/stat.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>  // Boost 1.74 Asio under C++20 + GCC 12 needs this first.
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "api.h"
#include "autoscaler.h"
#include "http_server.h"
#include "store/secrets_key.h"
#include "store/store.h"

namespace silt::gateway {

struct Gateway::Impl {
  Options options;
  std::unique_ptr<store::Store> store;
  Metrics metrics;
  std::unique_ptr<BundleStore> bundles;
  std::unique_ptr<ImageArchives> images;
  std::unique_ptr<Api> api;
  Credentials credentials;
  std::string secrets_key_file;
  bool secrets_key_generated = false;
  // Reset first by ~Impl: its thread calls into the registry.
  std::unique_ptr<Autoscaler> autoscaler;

  // One io_context per thread, as nginx runs a worker per core: a
  // connection's request, its call to the node and the answer all run on one
  // thread, with no lock and no handoff in between.
  std::vector<std::unique_ptr<boost::asio::io_context>> iocs;
  std::vector<boost::asio::io_context*> contexts;  // iocs, as pointers
  // Destroyed before the io_contexts: it fails in-flight function calls,
  // whose replies are queued onto the (stopped) io_contexts.
  std::unique_ptr<NodeRegistry> nodes;
  // Before the registry: stops dispatching before the nodes go.
  std::unique_ptr<AsyncQueue> async;
  std::unique_ptr<HttpServer> server;
  std::unique_ptr<HttpServer> metrics_server;
  std::unique_ptr<HttpServer> provider_server;  // Options::provider_listen
  std::vector<std::thread> threads;
  // Runs every API request but function calls: those may block (store
  // writes, migrations, drains, log streams), and on a connection's own
  // thread they would hold up every other connection dealt to it.
  std::unique_ptr<boost::asio::thread_pool> admin;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;

  ~Impl() {
    autoscaler.reset();
    if (server) server->Close();
    if (metrics_server) metrics_server->Close();
    if (provider_server) provider_server->Close();
    for (auto& ioc : iocs) ioc->stop();
    for (auto& t : threads) t.join();
    if (admin) {
      admin->stop();  // what has not started is dropped
      admin->join();
    }
  }
};

namespace {

// Threads for API requests other than function calls (see Impl::admin).
constexpr int kAdminThreads = 8;

// Takes group and other access away from `path` when it has any; whether it
// did. A mode that cannot be changed refuses the start.
absl::StatusOr<bool> MakeOwnerOnly(const std::string& path, mode_t* was) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    return absl::PermissionDeniedError(
        absl::StrCat("cannot stat ", path, ": ", strerror(errno)));
  }
  *was = st.st_mode & 07777;
  if ((st.st_mode & 077) == 0) return false;
  if (chmod(path.c_str(), st.st_mode & 0700) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s is mode %04o, open to group or others, and chmod failed (%s): run "
        "`chmod go= %s` as its owner",
        path, *was, strerror(errno), path));
  }
  return true;
}

// The data dir and what the gateway keeps in it (the store, the credentials,
// the bundles, and the files directly in each) end up owner-only: directories
// tightened are named on stderr, files counted. A shared directory (others may
// write it, or it is sticky, like /tmp) is refused rather than tightened.
absl::Status SecureDataDir(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) == 0 && (st.st_mode & (S_ISVTX | S_IWOTH))) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "data dir %s is shared (mode %04o): give the gateway a directory of "
        "its own",
        dir, st.st_mode & 07777));
  }
  size_t files = 0;
  for (std::string d : {dir, dir + "/store", dir + "/secrets", dir + "/bundles",
                        dir + "/images"}) {
    mode_t was = 0;
    auto changed = MakeOwnerOnly(d, &was);
    if (!changed.ok()) return changed.status();
    if (*changed) {
      fprintf(stderr, "silt-gateway: %s was mode %04o; now %04o (owner only)\n",
              d.c_str(), was, was & 0700);
    }
    if (d == dir) continue;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(d, ec)) {
      if (e.is_symlink() || e.is_directory()) continue;
      auto f = MakeOwnerOnly(e.path().string(), &was);
      if (!f.ok()) return f.status();
      files += *f;
    }
  }
  if (files > 0) {
    fprintf(stderr,
            "silt-gateway: %zu files under %s were open to group or others; "
            "now owner only\n",
            files, dir.c_str());
  }
  return absl::OkStatus();
}

// Creates the data dir owner-only; an existing one is checked by
// SecureDataDir.
absl::Status MakeDataDir(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::create_directories(dir, ec)) {
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, ec);
  }
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create data dir ", dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// The store's secrets key: the operator's file, or DATA_DIR/secrets.key,
// created when missing.
absl::StatusOr<std::string> LoadSecretsKey(const Options& options,
                                           std::string* path, bool* created) {
  *created = false;
  if (!options.secrets_key_file.empty()) {
    *path = options.secrets_key_file;
    return store::ReadSecretsKeyFile(*path);
  }
  *path = options.data_dir + "/secrets.key";
  return store::LoadOrCreateSecretsKeyFile(*path, created);
}

// Opens DATA_DIR/store with the secrets key, once the data dir is secured.
absl::StatusOr<std::unique_ptr<store::Store>> OpenStore(const Options& options,
                                                        std::string* key_file,
                                                        bool* key_created) {
  auto key = LoadSecretsKey(options, key_file, key_created);
  if (!key.ok()) return key.status();
  if (auto s = SecureDataDir(options.data_dir); !s.ok()) return s;
  return store::Store::Open(
      {.path = options.data_dir + "/store", .secrets_key = *key});
}

}  // namespace

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gateway::~Gateway() = default;

absl::StatusOr<std::unique_ptr<Gateway>> Gateway::Start(
    const Options& options) {
  if (options.data_dir.empty())
    return absl::InvalidArgumentError("--data-dir is required");
  auto impl = std::make_unique<Impl>();
  impl->options = options;

  if (auto s = MakeDataDir(options.data_dir); !s.ok()) return s;
  auto store =
      OpenStore(options, &impl->secrets_key_file, &impl->secrets_key_generated);
  if (!store.ok()) return store.status();
  impl->store = *std::move(store);

  ApiOptions api_options;
  api_options.auth_enabled = options.auth;
  api_options.max_system_body_bytes = options.max_system_body_bytes;
  api_options.max_function_body_bytes = options.max_function_body_bytes;
  api_options.max_async_body_bytes = options.max_async_body_bytes;
  if (options.auth) {
    auto creds = LoadOrCreateCredentials(options.data_dir + "/secrets");
    if (!creds.ok()) return creds.status();
    impl->credentials = *creds;
    api_options.credentials = *std::move(creds);
  }
  api_options.upstream_timeout = options.upstream_timeout;
  impl->bundles = std::make_unique<BundleStore>(impl->store.get(),
                                                options.data_dir + "/bundles");
  impl->images = std::make_unique<ImageArchives>(impl->store.get(),
                                                 options.data_dir + "/images");
  NodeRegistryOptions node_options{.listen = options.grpc_listen,
                                   .node_timeout = options.node_timeout};
  node_options.rebalancer.enabled = options.rebalance;
  node_options.instance_leases = options.instance_leases;
  node_options.rebalancer.cpu_high = options.cpu_high;
  node_options.rebalancer.cpu_low = std::max(0.05, options.cpu_high - 0.2);
  node_options.rebalancer.memory_high = options.memory_high;
  node_options.rebalancer.memory_low =
      std::max(0.05, options.memory_high - 0.1);
  if (options.shard_split_bytes)
    node_options.directory.default_max_shard_bytes = options.shard_split_bytes;
  int threads =
      options.threads > 0
          ? options.threads
          : std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  for (int i = 0; i < threads; ++i) {
    impl->iocs.push_back(std::make_unique<boost::asio::io_context>(1));
    impl->contexts.push_back(impl->iocs.back().get());
  }
  auto nodes = NodeRegistry::Start(node_options, impl->contexts,
                                   impl->store.get(), impl->bundles.get(),
                                   impl->images.get(), &impl->metrics);
  if (!nodes.ok()) return nodes.status();
  impl->nodes = *std::move(nodes);
  AsyncQueueOptions async_options;
  async_options.max_attempts = options.async_max_attempts;
  async_options.initial_backoff = options.async_initial_backoff;
  async_options.max_backoff = options.async_max_backoff;
  async_options.max_inflight_per_function = options.async_max_inflight;
  async_options.call_timeout = options.upstream_timeout;
  auto async =
      AsyncQueue::Start(async_options, impl->store.get(), impl->nodes.get());
  if (!async.ok()) return async.status();
  impl->async = *std::move(async);
  impl->api = std::make_unique<Api>(
      impl->store.get(), &impl->metrics, impl->bundles.get(), impl->nodes.get(),
      std::move(api_options), impl->async.get(), impl->images.get());

  Api* api = impl->api.get();
  HttpServerOptions http;
  http.body_limit = [api](absl::string_view path) {
    return api->BodyLimit(path);
  };
  http.streams = [](absl::string_view path) {
    return absl::StartsWith(path, "/function/") || path == "/system/images";
  };
  http.header_timeout = options.read_timeout;
  http.body_timeout = options.read_timeout;
  http.write_timeout = options.write_timeout;
  impl->admin = std::make_unique<boost::asio::thread_pool>(kAdminThreads);
  boost::asio::thread_pool* admin = impl->admin.get();
  // A request's handler on `listener`: a synchronous function call waits on
  // nothing here, so it stays on the connection's thread, with its call to
  // the node; the rest run on the admin pool.
  auto serve = [api, admin](Listener listener) {
    return [api, admin, listener](HttpRequest req, Reply reply) {
      if (absl::StartsWith(req.path, "/function/"))
        return api->Handle(req, std::move(reply), listener);
      boost::asio::post(*admin, [api, listener, req = std::move(req),
                                 reply = std::move(reply)]() mutable {
        Reply last = reply;  // answers once: the first answer wins
        try {
          api->Handle(req, std::move(reply), listener);
        } catch (const std::exception& e) {
          fprintf(stderr, "silt-gateway: %s %s: %s\n", req.method.c_str(),
                  req.path.c_str(), e.what());
          last(HttpResponse::Text(500, "internal error"));
        } catch (...) {
          fprintf(stderr, "silt-gateway: %s %s: unknown exception\n",
                  req.method.c_str(), req.path.c_str());
          last(HttpResponse::Text(500, "internal error"));
        }
      });
    };
  };
  auto server = HttpServer::Listen(impl->contexts, options.listen, http,
                                   serve(Listener::kGateway));
  if (!server.ok()) return server.status();
  impl->server = *std::move(server);
  if (!options.provider_listen.empty()) {
    HttpServerOptions provider_http = http;
    provider_http.streams = [](absl::string_view path) {
      return absl::StartsWith(path, "/function/");
    };
    auto provider =
        HttpServer::Listen(impl->contexts, options.provider_listen,
                           provider_http, serve(Listener::kProvider));
    if (!provider.ok()) return provider.status();
    impl->provider_server = *std::move(provider);
  }

  HttpServerOptions metrics_http = http;
  metrics_http.body_limit = [](absl::string_view) -> size_t {
    return 64 << 10;
  };
  auto metrics_server =
      HttpServer::Listen(impl->contexts, options.metrics_listen, metrics_http,
                         [api](HttpRequest req, Reply reply) {
                           reply(api->HandleMetricsPort(req));
                         });
  if (!metrics_server.ok()) return metrics_server.status();
  impl->metrics_server = *std::move(metrics_server);

  if (options.autoscale) {
    NodeRegistry* reg = impl->nodes.get();
    Autoscaler::Hooks hooks;
    hooks.loads = [reg] { return reg->FunctionLoads(); };
    hooks.set_desired = [reg](const std::string& ns, const std::string& name,
                              std::optional<uint64_t> n) {
      reg->SetDesiredReplicas(ns, name, n);
    };
    hooks.log = [reg](const std::string& ns, const std::string& name,
                      const std::string& text) {
      reg->GatewayLog(ns, name, text);
    };
    AutoscalerOptions scale;
    scale.interval = absl::FromChrono(options.autoscale_interval);
    scale.window = absl::FromChrono(options.autoscale_window);
    scale.scale_down_delay = absl::FromChrono(options.scale_down_delay);
    auto autoscaler = Autoscaler::Start(scale, std::move(hooks),
                                        impl->store.get(), &impl->metrics);
    if (!autoscaler.ok()) return autoscaler.status();
    impl->autoscaler = *std::move(autoscaler);
  }

  for (auto* ioc : impl->contexts)
    impl->threads.emplace_back([ioc] {
      auto work = boost::asio::make_work_guard(*ioc);  // until stop()
      ioc->run();
    });
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

std::string Gateway::listen_address() const {
  return FormatEndpoint(impl_->server->local_endpoint());
}
std::string Gateway::metrics_address() const {
  return FormatEndpoint(impl_->metrics_server->local_endpoint());
}
std::string Gateway::provider_address() const {
  return impl_->provider_server
             ? FormatEndpoint(impl_->provider_server->local_endpoint())
             : "";
}
std::string Gateway::grpc_address() const { return impl_->nodes->address(); }
std::string Gateway::password_file() const {
  return impl_->credentials.password_file;
}
bool Gateway::credentials_generated() const {
  return impl_->credentials.generated;
}
std::string Gateway::secrets_key_file() const {
  return impl_->secrets_key_file;
}
bool Gateway::secrets_key_generated() const {
  return impl_->secrets_key_generated;
}

void Gateway::Wait() {
  std::unique_lock<std::mutex> l(impl_->mu);
  impl_->cv.wait(l, [this] { return impl_->stopping; });
}

void Gateway::Shutdown() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
}

}  // namespace silt::gateway
