#include "image_cmd.h"

#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace silt::deploy {
namespace {

using nlohmann::json;

int Error(const HttpResult& r) {
  std::cerr << "error (" << r.status
            << "): " << absl::StripTrailingAsciiWhitespace(r.body) << std::endl;
  return 1;
}

std::string Size(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30))
    return absl::StrFormat("%.1f GiB", bytes / double(1 << 30));
  if (bytes >= (1 << 20))
    return absl::StrFormat("%.1f MiB", bytes / double(1 << 20));
  return absl::StrFormat("%.1f KiB", bytes / 1024.0);
}

std::string Short(const std::string& digest) {
  return digest.size() > 19 ? digest.substr(0, 19) : digest;
}

}  // namespace

int ImageImport(const Requester& send, const std::string& file, bool wait) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::cerr << "cannot read " << file << std::endl;
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  HttpResult r =
      send("POST", wait ? "/system/images" : "/system/images?wait=0", ss.str());
  if (r.status != 201) return Error(r);
  json out = json::parse(r.body, nullptr, false);
  if (!out.is_object() || !out.contains("images") ||
      !out["images"].is_array()) {
    std::cerr << "cannot parse the gateway's answer" << std::endl;
    return 1;
  }
  for (const auto& image : out["images"]) {
    std::string name = image.value("name", "");
    size_t nodes = image.contains("nodes") && image["nodes"].is_object()
                       ? image["nodes"].size()
                       : 0;
    std::cout << "Imported " << name;
    if (wait) std::cout << " on " << nodes << (nodes == 1 ? " node" : " nodes");
    std::cout << std::endl;
  }
  int code = 0;
  if (out.contains("failed") && out["failed"].is_object())
    for (const auto& [node, why] : out["failed"].items()) {
      std::cerr << "node " << node << " could not import it: "
                << (why.is_string() ? why.get<std::string>() : why.dump())
                << std::endl;
      code = 1;
    }
  return code;
}

int ImageList(const Requester& send, const std::string& output) {
  HttpResult r = send("GET", "/system/images", "");
  if (r.status != 200) return Error(r);
  json list = json::parse(r.body, nullptr, false);
  if (!list.is_array()) {
    std::cerr << "cannot parse the image list from the gateway" << std::endl;
    return 1;
  }
  if (output == "json") {
    std::cout << list.dump(2) << std::endl;
    return 0;
  }
  std::cout << absl::StrFormat("%-48s %-20s %-10s %s\n", "IMAGE", "DIGEST",
                               "SIZE", "NODES");
  for (const auto& i : list) {
    std::string nodes;
    if (i.contains("nodes") && i["nodes"].is_array())
      for (const auto& n : i["nodes"])
        if (n.is_string())
          absl::StrAppend(&nodes, nodes.empty() ? "" : ",",
                          n.get<std::string>());
    uint64_t size = i.contains("size") && i["size"].is_number_unsigned()
                        ? i["size"].get<uint64_t>()
                        : 0;
    std::cout << absl::StrFormat("%-48s %-20s %-10s %s\n", i.value("name", ""),
                                 Short(i.value("digest", "")),
                                 size ? Size(size) : "-",
                                 nodes.empty() ? "-" : nodes);
  }
  return 0;
}

int ImageRemove(const Requester& send, const std::vector<std::string>& names) {
  int code = 0;
  for (const std::string& name : names) {
    HttpResult r = send("DELETE", "/system/images?name=" + UrlEncode(name), "");
    if (r.status != 200) {
      code = Error(r);
      continue;
    }
    std::cout << "Removed " << name << std::endl;
  }
  return code;
}

}  // namespace silt::deploy
