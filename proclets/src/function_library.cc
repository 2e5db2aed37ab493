#include "proclets/function_library.h"

#include <dlfcn.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "silt/abi.h"

namespace silt::proclets {
namespace {

silt_str Str(const std::string& s) { return {s.data(), s.size()}; }

// Where no state service is attached (unit tests, tools): every state call
// fails as unreachable.
int NoStateCall(void*, const char*, size_t, void*,
                void (*)(void*, const char*, size_t)) {
  return -1;
}
constexpr silt_state_api kNoState = {nullptr, NoStateCall};

silt_context MakeContext(const CallContext& c) {
  return {Str(c.function_name), Str(c.function_namespace),
          Str(c.call_id),       Str(c.instance_id),
          Str(c.secrets_dir),   c.state != nullptr ? c.state : &kNoState};
}

}  // namespace

struct FunctionLibrary::Impl {
  std::string path;
  void* handle = nullptr;
  silt_init_fn init = nullptr;
  silt_handle_fn handle_fn = nullptr;
  silt_after_restore_fn after_restore = nullptr;
  silt_task_fn task = nullptr;
  silt_max_concurrency_fn max_concurrency = nullptr;
  ~Impl() {
    if (handle != nullptr) dlclose(handle);
  }
};

FunctionLibrary::FunctionLibrary(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
FunctionLibrary::~FunctionLibrary() = default;

absl::StatusOr<std::unique_ptr<FunctionLibrary>> FunctionLibrary::Load(
    const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (impl->handle == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load function bundle ", path, ": ", dlerror()));
  }
  auto version = reinterpret_cast<silt_abi_version_fn>(
      dlsym(impl->handle, "silt_abi_version"));
  if (version == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path,
                     " is not a Silt function: it exports no silt_abi_version "
                     "(build it with "
                     "silt/function.h and SILT_HANDLER)"));
  }
  uint32_t v = version();
  if (v < SILT_ABI_MIN_VERSION || v > SILT_ABI_VERSION) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " was built for Silt function ABI version ", v,
        ", but this worker runs versions ", SILT_ABI_MIN_VERSION, " to ",
        SILT_ABI_VERSION,
        ": rebuild the function with this Silt's SDK (silt build)"));
  }
  impl->handle_fn =
      reinterpret_cast<silt_handle_fn>(dlsym(impl->handle, "silt_handle"));
  if (impl->handle_fn == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " exports no silt_handle: add SILT_HANDLER(YourHandler)"));
  }
  impl->init = reinterpret_cast<silt_init_fn>(dlsym(impl->handle, "silt_init"));
  impl->after_restore = reinterpret_cast<silt_after_restore_fn>(
      dlsym(impl->handle, "silt_after_restore"));
  impl->task = reinterpret_cast<silt_task_fn>(dlsym(impl->handle, "silt_task"));
  impl->max_concurrency = reinterpret_cast<silt_max_concurrency_fn>(
      dlsym(impl->handle, "silt_max_concurrency"));
  return std::unique_ptr<FunctionLibrary>(new FunctionLibrary(std::move(impl)));
}

uint32_t FunctionLibrary::MaxConcurrency() const {
  if (impl_->max_concurrency == nullptr) return 1;
  return std::clamp(impl_->max_concurrency(), 1u, SILT_MAX_CONCURRENCY);
}

absl::Status FunctionLibrary::Init(const CallContext& ctx) {
  if (impl_->init == nullptr) return absl::OkStatus();
  silt_context c = MakeContext(ctx);
  char error[1024] = {0};
  if (impl_->init(&c, error, sizeof(error)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("init of ", ctx.function_name,
                     " failed: ", error[0] ? error : "no reason given"));
  }
  return absl::OkStatus();
}

absl::StatusOr<FunctionResult> FunctionLibrary::Handle(const CallContext& ctx,
                                                       const FunctionCall& call,
                                                       const PartSink& parts) {
  silt_context c = MakeContext(ctx);
  std::vector<silt_header> headers;
  headers.reserve(call.headers.size());
  for (const auto& [k, v] : call.headers) headers.push_back({Str(k), Str(v)});
  silt_request req{Str(call.method), Str(call.path), Str(call.query),
                   headers.data(),   headers.size(), Str(call.body)};
  struct Host {
    FunctionResult result;
    const PartSink* parts;
    bool broken = false;  // the sink refused a part: flush fails from now on
  } host{{}, &parts};
  silt_response_writer out{
      &host,
      [](void* h, int status) {
        auto* self = static_cast<Host*>(h);
        if (!self->result.streamed) self->result.status = status;
      },
      [](void* h, silt_str k, silt_str v) {
        auto* self = static_cast<Host*>(h);
        if (!self->result.streamed)
          self->result.headers.emplace_back(std::string(k.data, k.len),
                                            std::string(v.data, v.len));
      },
      [](void* h, const char* data, size_t len) {
        static_cast<Host*>(h)->result.body.append(data, len);
      },
      [](void* h) {
        auto* self = static_cast<Host*>(h);
        if (self->broken || !*self->parts) return -1;
        self->broken = !(*self->parts)(self->result);
        self->result.streamed = true;
        self->result.body.clear();
        return self->broken ? -1 : 0;
      }};
  char error[1024] = {0};
  if (impl_->handle_fn(&c, &req, &out, error, sizeof(error)) != 0) {
    return absl::InternalError(
        absl::StrCat("function ", ctx.function_name,
                     " failed: ", error[0] ? error : "no reason given"));
  }
  return std::move(host.result);
}

absl::StatusOr<std::string> FunctionLibrary::Task(const CallContext& ctx,
                                                  std::string_view call) {
  if (impl_->task == nullptr)
    return absl::FailedPreconditionError(
        absl::StrCat("function ", ctx.function_name,
                     " has no compute tasks: its bundle was built by an older "
                     "SDK (rebuild it with silt build)"));
  silt_context c = MakeContext(ctx);
  std::string reply;
  if (impl_->task(&c, call.data(), call.size(), &reply,
                  [](void* out, const char* data, size_t len) {
                    static_cast<std::string*>(out)->append(data, len);
                  }) != 0 ||
      reply.empty())
    return absl::InternalError("the task call could not be read");
  return reply;
}

void FunctionLibrary::AfterRestore(const CallContext& ctx) {
  if (impl_->after_restore == nullptr) return;
  silt_context c = MakeContext(ctx);
  impl_->after_restore(&c);
}

bool FunctionLibrary::has_init() const { return impl_->init != nullptr; }
bool FunctionLibrary::has_after_restore() const {
  return impl_->after_restore != nullptr;
}
const std::string& FunctionLibrary::path() const { return impl_->path; }

}  // namespace silt::proclets
