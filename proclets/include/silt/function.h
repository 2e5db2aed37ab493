// The Silt function SDK. A function is a C++ handler compiled into a bundle:
//
//   #include <silt/function.h>
//
//   static std::vector<int> table;
//   void Init(silt::Context& ctx) { table = BuildTable(); }       // once per
//   instance silt::Response Handle(const silt::Request& req, silt::Context&
//   ctx) {
//     ctx.Log("called with " + std::to_string(req.body.size()) + " bytes");
//     return silt::Response::Text(200, "hello " + req.body);
//   }
//   SILT_INIT(Init)
//   SILT_HANDLER(Handle)
//
// Init runs once per instance before the first request: put expensive set-up
// there, it is what snapshots capture. SILT_AFTER_RESTORE(fn) runs in every
// instance restored or forked from a snapshot, before its first request (Lambda
// SnapStart's afterRestore): re-create anything that must be unique per
// instance.
//
// Header-only; the exported symbols are the C ABI of silt/abi.h.
#ifndef SILT_FUNCTION_H_
#define SILT_FUNCTION_H_

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "silt/abi.h"
#include "silt/state.h"

namespace silt {

using Headers = std::vector<std::pair<std::string, std::string>>;

inline bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

struct Request {
  std::string_view method;
  std::string_view path;
  std::string_view query;
  std::vector<std::pair<std::string_view, std::string_view>> headers;
  std::string_view body;

  // First value of a header (case-insensitive), or empty.
  std::string_view Header(std::string_view name) const {
    for (const auto& [k, v] : headers) {
      if (EqualsIgnoreCase(k, name)) return v;
    }
    return {};
  }
};

struct Response {
  int status = 200;
  Headers headers;
  std::string body;

  static Response Text(int status, std::string body) {
    return {status,
            {{"Content-Type", "text/plain; charset=utf-8"}},
            std::move(body)};
  }
  static Response Json(int status, std::string body) {
    return {status, {{"Content-Type", "application/json"}}, std::move(body)};
  }
};

class Context {
 public:
  explicit Context(const silt_context* c) : c_(c) {}

  std::string_view function_name() const { return View(c_->function_name); }
  std::string_view function_namespace() const {
    return View(c_->function_namespace);
  }
  std::string_view call_id() const { return View(c_->call_id); }
  std::string_view instance_id() const { return View(c_->instance_id); }

  // The secret's bytes, read from the instance's secrets directory; nullopt if
  // absent.
  std::optional<std::string> Secret(std::string_view name) const {
    if (name.find('/') != std::string_view::npos) return std::nullopt;
    std::string path =
        std::string(View(c_->secrets_dir)) + "/" + std::string(name);
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // The function namespace's state structures (see silt/state.h): handles
  // are cheap; the structure is created on first use.
  template <typename K, typename V>
  silt::Map<K, V> Map(std::string name, StateOptions options = {}) const {
    return silt::Map<K, V>(c_->state, std::move(name), options);
  }
  template <typename T>
  silt::Vector<T> Vector(std::string name, StateOptions options = {}) const {
    return silt::Vector<T>(c_->state, std::move(name), options);
  }
  template <typename T>
  silt::Queue<T> Queue(std::string name, StateOptions options = {}) const {
    return silt::Queue<T>(c_->state, std::move(name), options);
  }

  // One line to the instance's stdout / stderr (what `silt logs` shows).
  void Log(std::string_view line) const { WriteLine(stdout, line); }
  void Error(std::string_view line) const { WriteLine(stderr, line); }

 private:
  static std::string_view View(silt_str s) { return {s.data, s.len}; }
  static void WriteLine(FILE* f, std::string_view line) {
    fwrite(line.data(), 1, line.size(), f);
    fputc('\n', f);
    fflush(f);
  }
  const silt_context* c_;
};

namespace internal {

inline void CopyError(std::string_view msg, char* error, size_t cap) {
  if (error == nullptr || cap == 0) return;
  size_t n = msg.size() < cap - 1 ? msg.size() : cap - 1;
  memcpy(error, msg.data(), n);
  error[n] = '\0';
}

inline int RunHandler(Response (*fn)(const Request&, Context&),
                      const silt_context* c, const silt_request* r,
                      const silt_response_writer* out, char* error,
                      size_t cap) {
  Request req;
  req.method = {r->method.data, r->method.len};
  req.path = {r->path.data, r->path.len};
  req.query = {r->query.data, r->query.len};
  req.body = {r->body.data, r->body.len};
  req.headers.reserve(r->header_count);
  for (size_t i = 0; i < r->header_count; ++i) {
    req.headers.emplace_back(
        std::string_view(r->headers[i].name.data, r->headers[i].name.len),
        std::string_view(r->headers[i].value.data, r->headers[i].value.len));
  }
  Context ctx(c);
  try {
    Response res = fn(req, ctx);
    out->set_status(out->host, res.status);
    for (const auto& [k, v] : res.headers) {
      out->add_header(out->host, {k.data(), k.size()}, {v.data(), v.size()});
    }
    out->append_body(out->host, res.body.data(), res.body.size());
    return 0;
  } catch (const std::exception& e) {
    CopyError(e.what(), error, cap);
  } catch (...) {
    CopyError("handler threw a non-standard exception", error, cap);
  }
  return 1;
}

inline int RunInit(void (*fn)(Context&), const silt_context* c, char* error,
                   size_t cap) {
  Context ctx(c);
  try {
    fn(ctx);
    return 0;
  } catch (const std::exception& e) {
    CopyError(e.what(), error, cap);
  } catch (...) {
    CopyError("init threw a non-standard exception", error, cap);
  }
  return 1;
}

}  // namespace internal
}  // namespace silt

#define SILT_HANDLER(fn)                                                       \
  extern "C" __attribute__((visibility("default"))) uint32_t silt_abi_version( \
      void) {                                                                  \
    return SILT_ABI_VERSION;                                                   \
  }                                                                            \
  extern "C" __attribute__((visibility("default"))) int silt_handle(           \
      const silt_context* c, const silt_request* r,                            \
      const silt_response_writer* out, char* error, size_t cap) {              \
    return ::silt::internal::RunHandler(fn, c, r, out, error, cap);            \
  }

#define SILT_INIT(fn)                                              \
  extern "C" __attribute__((visibility("default"))) int silt_init( \
      const silt_context* c, char* error, size_t cap) {            \
    return ::silt::internal::RunInit(fn, c, error, cap);           \
  }

#define SILT_AFTER_RESTORE(fn)                                               \
  extern "C" __attribute__((visibility("default"))) void silt_after_restore( \
      const silt_context* c) {                                               \
    ::silt::Context ctx(c);                                                  \
    fn(ctx);                                                                 \
  }

#endif  // SILT_FUNCTION_H_
