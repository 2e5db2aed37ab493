// The smallest Silt function: says hello to whoever calls it.
#include <silt/function.h>

#include <string>

static silt::Response Handle(const silt::Request& req, silt::Context&) {
  std::string who = req.body.empty() ? "world" : std::string(req.body);
  return silt::Response::Text(200, "Hello, " + who + "!\n");
}

SILT_HANDLER(Handle)
