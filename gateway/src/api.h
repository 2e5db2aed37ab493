// The OpenFaaS HTTP API of the gateway: routing, auth and every /system,
// /function and /async-function route, over the store. Beast-free: takes and
// returns plain values.
#ifndef SILT_GATEWAY_API_H_
#define SILT_GATEWAY_API_H_

#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "async_queue.h"
#include "auth.h"
#include "bundles.h"
#include "http_types.h"
#include "metrics.h"
#include "nodes.h"
#include "openfaas_types.h"
#include "store/store.h"

namespace silt::gateway {

inline constexpr absl::string_view kDefaultNamespace = "openfaas-fn";

struct ApiOptions {
  bool auth_enabled = true;
  Credentials credentials;
  size_t max_system_body_bytes = 10 << 20;
  size_t max_function_body_bytes = size_t{1} << 30;  // /function/ (streamed)
  size_t max_async_body_bytes = 32 << 20;            // /async-function/
  size_t max_bundle_bytes = 256 << 20;
  size_t max_image_archive_bytes = size_t{8} << 30;  // /system/images
  // How long POST /system/images waits for the nodes to import an archive.
  std::chrono::milliseconds image_timeout{std::chrono::minutes(5)};
  // Longest a function call may take end to end (exec_timeout shortens it per
  // function).
  std::chrono::milliseconds upstream_timeout{std::chrono::seconds(60)};
};

// The one place a Status becomes an HTTP answer.
int HttpStatusFor(const absl::Status& s);
HttpResponse ErrorResponse(const absl::Status& s);

// Function and namespace names: lowercase RFC 1123 labels (what containerd ids
// and Kubernetes accept), at most 63 characters.
absl::Status ValidateName(absl::string_view kind, absl::string_view name);

// Which listener a request came in on: the gateway's own (the OpenFaaS
// gateway's API and Silt's routes) or the provider's (the faas-provider
// contract the OpenFaaS gateway talks to, Options::provider_listen).
enum class Listener { kGateway, kProvider };

class Api {
 public:
  // `async` may be null: /async-function then answers 503; so may `images`
  // (/system/images).
  Api(store::Store* store, Metrics* metrics, BundleStore* bundles,
      NodeRegistry* nodes, ApiOptions options, AsyncQueue* async = nullptr,
      ImageArchives* images = nullptr);

  // The main port (:8080). `reply` may run later, on another thread (function
  // calls).
  void Handle(const HttpRequest& req, Reply reply,
              Listener listener = Listener::kGateway);
  // The metrics port (:8082): /metrics and /healthz.
  HttpResponse HandleMetricsPort(const HttpRequest& req);
  size_t BodyLimit(absl::string_view path) const;

 private:
  // Answers now (a response) or takes over `reply` (nullopt).
  absl::StatusOr<std::optional<HttpResponse>> Route(const HttpRequest& req,
                                                    Listener listener,
                                                    std::string& route,
                                                    Reply& reply);

  absl::StatusOr<HttpResponse> ListFunctions(const HttpRequest& req);
  absl::StatusOr<HttpResponse> DeployFunction(const HttpRequest& req,
                                              bool update);
  absl::StatusOr<HttpResponse> DeleteFunction(const HttpRequest& req);
  absl::StatusOr<HttpResponse> GetFunction(const HttpRequest& req,
                                           absl::string_view name);
  absl::StatusOr<HttpResponse> ScaleFunction(const HttpRequest& req,
                                             absl::string_view name);
  absl::StatusOr<HttpResponse> Info(Listener listener);
  absl::StatusOr<HttpResponse> ListNamespaces();
  absl::StatusOr<HttpResponse> Namespace(const HttpRequest& req,
                                         absl::string_view ns);
  absl::StatusOr<HttpResponse> ListSecrets(const HttpRequest& req);
  absl::StatusOr<HttpResponse> WriteSecret(const HttpRequest& req, bool update);
  absl::StatusOr<HttpResponse> DeleteSecret(const HttpRequest& req);
  absl::StatusOr<HttpResponse> Logs(const HttpRequest& req);
  absl::StatusOr<std::optional<HttpResponse>> Invoke(
      const HttpRequest& req, bool async, absl::string_view name_and_ns,
      Reply& reply);
  absl::StatusOr<HttpResponse> PushBundle(const HttpRequest& req);
  absl::StatusOr<HttpResponse> ListBundles();
  // OCI images (api_images.cc).
  absl::StatusOr<HttpResponse> PushImage(const HttpRequest& req);
  absl::StatusOr<HttpResponse> ListImages();
  absl::StatusOr<HttpResponse> RemoveImage(const HttpRequest& req);
  absl::StatusOr<HttpResponse> ListNodes();
  absl::StatusOr<HttpResponse> ListSnapshots(const HttpRequest& req,
                                             absl::string_view name);
  absl::StatusOr<HttpResponse> DeleteSnapshots(const HttpRequest& req,
                                               absl::string_view name);
  // State and memory proclets (api_state.cc).
  absl::StatusOr<HttpResponse> ListProclets(const HttpRequest& req);
  // GPU proclets (api_gpu.cc): moves, and /system/gpu.
  absl::StatusOr<HttpResponse> MigrateGpuProclet(const HttpRequest& req,
                                                 absl::string_view id);
  absl::StatusOr<HttpResponse> ResizeGpuProclet(const HttpRequest& req,
                                                absl::string_view id);
  absl::StatusOr<HttpResponse> ListGpus();
  absl::StatusOr<HttpResponse> ReclaimGpu(absl::string_view node);
  absl::StatusOr<HttpResponse> ReleaseGpu(absl::string_view node);
  absl::StatusOr<HttpResponse> MigrateProclet(const HttpRequest& req,
                                              absl::string_view id);
  absl::StatusOr<HttpResponse> GetState(const HttpRequest& req,
                                        absl::string_view name);
  absl::StatusOr<HttpResponse> DeleteState(const HttpRequest& req,
                                           absl::string_view name);
  absl::StatusOr<HttpResponse> DrainNode(absl::string_view node);
  // Async calls (api_async.cc): accepting one, and the queue's routes.
  absl::StatusOr<HttpResponse> EnqueueAsync(const HttpRequest& req,
                                            const std::string& ns,
                                            const std::string& name,
                                            const std::string& call_id);
  absl::StatusOr<HttpResponse> ListAsync(const HttpRequest& req);
  absl::StatusOr<HttpResponse> AsyncCallAction(const HttpRequest& req,
                                               absl::string_view arg);
  // The rebalancer's decisions (api_events.cc).
  absl::StatusOr<HttpResponse> ListEvents(const HttpRequest& req);

  // Namespace from the body value, else the ?namespace= query, else the
  // default; it must exist and carry the openfaas=1 label.
  absl::StatusOr<std::string> ResolveNamespace(absl::string_view from_body,
                                               const HttpRequest& req) const;
  absl::Status CheckNamespace(absl::string_view ns) const;
  absl::StatusOr<FunctionDeployment> LoadDeployment(
      const store::FunctionRecord& rec) const;
  nlohmann::ordered_json StatusJson(const store::FunctionRecord& rec,
                                    const FunctionDeployment& d) const;

  store::Store* store_;
  Metrics* metrics_;
  BundleStore* bundles_;
  NodeRegistry* nodes_;
  ApiOptions options_;
  AsyncQueue* async_;
  ImageArchives* images_;
  // Serialises read-check-write sequences (deploy, update, scale, namespace
  // removal).
  std::mutex write_mu_;
};

}  // namespace silt::gateway

#endif  // SILT_GATEWAY_API_H_
