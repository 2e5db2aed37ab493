// A work queue in function state: any instance submits, any instance works.
// Results go to a map so that callers can look them up.
#include <silt/function.h>

#include <algorithm>
#include <chrono>
#include <string>

namespace {

silt::Response Handle(const silt::Request& req, silt::Context& ctx) {
  auto jobs = ctx.Queue<std::string>("jobs");
  auto results = ctx.Map<std::string, std::string>("results");
  std::string_view q = req.query;
  if (q == "op=submit") {
    auto s = jobs.Push(std::string(req.body));
    if (!s.ok()) return silt::Response::Text(503, s.message() + "\n");
    return silt::Response::Text(202, "queued\n");
  }
  if (q == "op=work") {
    auto job = jobs.Pop(std::chrono::seconds(1));
    if (job.code() == silt::StateCode::kTimeout)
      return silt::Response::Text(204, "");
    if (!job.ok()) return silt::Response::Text(503, job.message() + "\n");
    std::string out = *job;  // the "work": upper-case the payload
    std::transform(out.begin(), out.end(), out.begin(), ::toupper);
    results.Put(*job, out);
    return silt::Response::Text(200, out + "\n");
  }
  auto n = jobs.Size();
  return silt::Response::Text(
      200, std::to_string(n.value_or(0)) + " job(s) waiting\n");
}

}  // namespace

SILT_HANDLER(Handle)
