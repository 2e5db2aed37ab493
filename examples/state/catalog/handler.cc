// A product catalog kept in function state: a sharded map shared by every
// instance, placed by Silt on whichever node has memory free.
#include <silt/function.h>

#include <string>

namespace {

std::string Param(std::string_view query, std::string_view key) {
  for (size_t pos = 0; pos <= query.size();) {
    size_t amp = query.find('&', pos);
    std::string_view kv =
        query.substr(pos, amp == query.npos ? query.npos : amp - pos);
    size_t eq = kv.find('=');
    if (kv.substr(0, eq) == key && eq != kv.npos)
      return std::string(kv.substr(eq + 1));
    if (amp == query.npos) break;
    pos = amp + 1;
  }
  return "";
}

silt::Response Handle(const silt::Request& req, silt::Context& ctx) {
  auto catalog = ctx.Map<std::string, std::string>("catalog");
  std::string sku = Param(req.query, "sku");
  if (sku.empty()) {
    auto n = catalog.Size();
    if (!n.ok()) return silt::Response::Text(503, n.message() + "\n");
    return silt::Response::Text(200, std::to_string(*n) + " products\n");
  }
  if (req.method == "PUT" || req.method == "POST") {
    auto s = catalog.Put(sku, std::string(req.body));
    if (!s.ok()) return silt::Response::Text(503, s.message() + "\n");
    return silt::Response::Text(200, "stored " + sku + "\n");
  }
  auto item = catalog.Get(sku);
  if (item.code() == silt::StateCode::kNotFound)
    return silt::Response::Text(404, "no product " + sku + "\n");
  if (!item.ok()) return silt::Response::Text(503, item.message() + "\n");
  return silt::Response::Text(200, *item);
}

}  // namespace

SILT_HANDLER(Handle)
