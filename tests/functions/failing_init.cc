#include <silt/function.h>

#include <stdexcept>

static void Init(silt::Context&) {
  throw std::runtime_error("model file missing");
}
static silt::Response Handle(const silt::Request&, silt::Context&) {
  return {};
}

SILT_INIT(Init)
SILT_HANDLER(Handle)
