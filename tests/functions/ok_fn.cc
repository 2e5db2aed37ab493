// A test bundle: state built in init, visible to every call.
#include <silt/function.h>

#include <stdexcept>
#include <string>

static std::string greeting;
static int restores = 0;

static void Init(silt::Context& ctx) {
  greeting = "hello from " + std::string(ctx.function_name());
}

static void AfterRestore(silt::Context&) { ++restores; }

static silt::Response Handle(const silt::Request& req, silt::Context& ctx) {
  if (req.path == "/throw") throw std::runtime_error("asked to throw");
  if (req.path == "/stream") {
    if (!ctx.BeginResponse(202, {{"Content-Type", "text/event-stream"}}))
      return silt::Response::Text(500, "no streaming here");
    ctx.Write("one;");
    ctx.Write("two;");
    return {299, {{"X-Ignored", "1"}}, "three"};
  }
  silt::Response res =
      silt::Response::Text(201, greeting + ": " + std::string(req.body));
  res.headers.emplace_back("X-Path", std::string(req.path));
  res.headers.emplace_back("X-Query", std::string(req.query));
  res.headers.emplace_back("X-Echo", std::string(req.Header("x-input")));
  res.headers.emplace_back("X-Call", std::string(ctx.call_id()));
  res.headers.emplace_back("X-Restores", std::to_string(restores));
  res.headers.emplace_back("X-Secret", ctx.Secret("token").value_or("<none>"));
  return res;
}

SILT_INIT(Init)
SILT_HANDLER(Handle)
SILT_AFTER_RESTORE(AfterRestore)
