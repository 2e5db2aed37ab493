// OCI images (images.h): POST /system/images takes an image archive (an OCI
// image layout or `docker save` output, plain or gzipped) as the body, keeps
// it, and waits until every connected node imported it (or ?wait=0: not);
// GET lists the images with the nodes that hold them; DELETE ?name= removes
// one from the catalog and from every node.
#include <openssl/evp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "api.h"

namespace silt::gateway {
namespace {

using nlohmann::ordered_json;

// Writes the request's body to `path` as it arrives: its digest and size.
absl::StatusOr<std::pair<std::string, uint64_t>> SaveBody(
    const HttpRequest& req, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), nullptr);
  uint64_t size = 0;
  auto take = [&](const std::string& bytes) {
    EVP_DigestUpdate(md, bytes.data(), bytes.size());
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    size += bytes.size();
  };
  absl::Status status;
  if (req.body_rest) {
    for (bool last = false; !last;) {
      std::promise<absl::StatusOr<BodyStream::Part>> part;
      req.body_rest->Pull([&part](absl::StatusOr<BodyStream::Part> p) {
        part.set_value(std::move(p));
      });
      auto p = part.get_future().get();
      if (!p.ok()) {
        status = p.status();
        break;
      }
      take(p->bytes);
      last = p->last;
    }
  } else {
    take(req.body);
  }
  unsigned char digest[32];
  unsigned len = 0;
  EVP_DigestFinal_ex(md, digest, &len);
  EVP_MD_CTX_free(md);
  out.close();
  if (!status.ok()) return status;
  if (!out) return absl::ResourceExhaustedError("cannot store the archive");
  if (size == 0)
    return absl::InvalidArgumentError(
        "expected an image archive in the body (an OCI image layout or "
        "`docker save` output)");
  std::string hex = "sha256:";
  for (unsigned i = 0; i < len; ++i)
    absl::StrAppend(&hex, absl::Hex(digest[i], absl::kZeroPad2));
  return std::make_pair(hex, size);
}

}  // namespace

absl::StatusOr<HttpResponse> Api::PushImage(const HttpRequest& req) {
  if (images_ == nullptr)
    return absl::UnavailableError("this gateway keeps no images");
  std::string tmp = images_->UploadPath();
  auto saved = SaveBody(req, tmp);
  if (!saved.ok()) {
    std::filesystem::remove(tmp);
    return saved.status();
  }
  auto added = images_->Add(tmp, saved->first, saved->second);
  if (!added.ok()) {
    std::filesystem::remove(tmp);
    return added.status();
  }
  std::set<std::string> nodes = nodes_->ImagesChanged();
  std::map<std::string, ImageArchives::Failure> failures;
  if (req.QueryParam("wait") != "0" && req.QueryParam("wait") != "false") {
    failures = images_->Await(saved->first, nodes, options_.image_timeout);
    // An archive no node can import is refused: it is gone again.
    bool bad = !failures.empty();
    for (const auto& [node, f] : failures) bad = bad && f.bad_archive;
    if (bad) {
      images_->RemoveArchive(saved->first);
      nodes_->ImagesChanged();
      return absl::InvalidArgumentError(failures.begin()->second.message);
    }
  }
  ordered_json out = {{"archive", saved->first},
                      {"size", saved->second},
                      {"images", ordered_json::array()}};
  for (const auto& r : *added) {
    ordered_json held = ordered_json::object();
    for (const auto& [node, image] : images_->Holders(r.name))
      held[node] = image.digest;
    out["images"].push_back({{"name", r.name}, {"nodes", held}});
  }
  ordered_json failed = ordered_json::object();
  for (const auto& [node, f] : failures) failed[node] = f.message;
  out["failed"] = failed;
  return HttpResponse::Json(201, out.dump());
}

absl::StatusOr<HttpResponse> Api::ListImages() {
  if (images_ == nullptr)
    return absl::UnavailableError("this gateway keeps no images");
  ordered_json out = ordered_json::array();
  for (const auto& r : images_->List()) {
    ordered_json nodes = ordered_json::array();
    std::string digest;
    uint64_t size = 0;
    for (const auto& [node, image] : images_->Holders(r.name)) {
      nodes.push_back(node);
      digest = image.digest;
      size = image.size;
    }
    out.push_back(
        {{"name", r.name},
         {"digest", digest},
         {"size", size},
         {"archive", r.archive},
         {"archiveSize", r.archive_size},
         {"created", absl::FormatTime(absl::RFC3339_sec,
                                      absl::FromUnixSeconds(r.created_unix),
                                      absl::UTCTimeZone())},
         {"nodes", nodes}});
  }
  return HttpResponse::Json(200, out.dump());
}

absl::StatusOr<HttpResponse> Api::RemoveImage(const HttpRequest& req) {
  if (images_ == nullptr)
    return absl::UnavailableError("this gateway keeps no images");
  std::string name = req.QueryParam("name");
  if (name.empty()) return absl::InvalidArgumentError("expected ?name=IMAGE");
  if (auto s = images_->Remove(name); !s.ok()) return s;
  nodes_->ImagesChanged();
  return HttpResponse::Empty(200);
}

}  // namespace silt::gateway
