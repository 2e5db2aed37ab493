// Host side of the function ABI: loads a bundle's shared object, checks its ABI
// version and calls its init, handler and after-restore hooks.
#ifndef SILT_PROCLETS_FUNCTION_LIBRARY_H_
#define SILT_PROCLETS_FUNCTION_LIBRARY_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "silt/abi.h"

namespace silt::proclets {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct CallContext {
  std::string function_name;
  std::string function_namespace;
  std::string call_id;
  std::string instance_id;
  std::string secrets_dir = "/var/openfaas/secrets";
  // The function's state service (not owned); null: state calls fail as
  // unavailable.
  const silt_state_api* state = nullptr;
};

struct FunctionCall {
  std::string method = "GET";
  std::string path = "/";
  std::string query;
  HeaderList headers;
  std::string body;
};

struct FunctionResult {
  int status = 200;
  HeaderList headers;
  std::string body;  // after a streamed head: the bytes not yet sent
  // The handler flushed: status and headers went out with the first part.
  bool streamed = false;
};

class FunctionLibrary {
 public:
  // dlopen()s `path` and resolves the exports. FailedPrecondition when the
  // bundle was built for another ABI version or lacks silt_handle.
  static absl::StatusOr<std::unique_ptr<FunctionLibrary>> Load(
      const std::string& path);
  ~FunctionLibrary();
  FunctionLibrary(const FunctionLibrary&) = delete;
  FunctionLibrary& operator=(const FunctionLibrary&) = delete;

  // Runs silt_init if the bundle has one.
  absl::Status Init(const CallContext& ctx);
  // Sends a part of a streamed response (the handler flushed): the status and
  // headers (the first time: result.streamed is still false) and the body
  // bytes in result.body. False when the call's connection is gone.
  using PartSink = std::function<bool(const FunctionResult& so_far)>;

  // Runs the handler. A handler failure (non-zero return, exception) is an
  // Internal error carrying the handler's message. With `parts`, a handler
  // may stream its response (silt_response_writer.flush); without, a flush
  // fails. After a streamed head, the result's body holds the rest only.
  absl::StatusOr<FunctionResult> Handle(const CallContext& ctx,
                                        const FunctionCall& call,
                                        const PartSink& parts = {});
  // Runs one compute task (silt_task) on `call` (a silt/state_wire.h
  // TaskCall); its reply: a StateCode byte, then the result or why it failed.
  // FailedPrecondition when the bundle has no silt_task (built by an older
  // SDK).
  absl::StatusOr<std::string> Task(const CallContext& ctx,
                                   std::string_view call);
  // Runs silt_after_restore if the bundle has one.
  void AfterRestore(const CallContext& ctx);

  // How many calls the bundle takes at once (silt_max_concurrency, asked
  // now; 1 when it declares nothing; at most SILT_MAX_CONCURRENCY). Handle
  // and Task may then run on that many threads at once.
  uint32_t MaxConcurrency() const;

  bool has_init() const;
  bool has_after_restore() const;
  const std::string& path() const;

 private:
  struct Impl;
  explicit FunctionLibrary(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace silt::proclets

#endif  // SILT_PROCLETS_FUNCTION_LIBRARY_H_
