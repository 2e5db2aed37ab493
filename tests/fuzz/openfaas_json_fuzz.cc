// The OpenFaaS JSON bodies the gateway accepts from anyone with a token:
// every parser must answer a value or an error, never crash or throw, and a
// deployment it accepts must come back unchanged from its own JSON.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "openfaas_types.h"

using namespace silt::gateway;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view body(reinterpret_cast<const char*>(data), size);
  (void)ParseSecret(body);
  (void)ParseFunctionNamespace(body);
  (void)ParseDeleteFunctionRequest(body);
  (void)ParseJsonObject(body);
  auto d = ParseFunctionDeployment(body);
  if (!d.ok()) return 0;
  std::string text = JsonText(ToJson(*d));
  auto again = ParseFunctionDeployment(text);
  if (!again.ok() || JsonText(ToJson(*again)) != text) abort();
  (void)JsonText(ToStatusJson(*d, FunctionStatusExtra{}));
  return 0;
}
