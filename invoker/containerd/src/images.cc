// Images: import of OCI image layouts and `docker save` archives into
// containerd's content store, unpacked layer by layer by its overlayfs
// snapshotter through the Diff service (as containerd's own unpacker does),
// kept from its garbage collector by the labels its client sets.
#include <openssl/evp.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "archive_names.h"
#include "client_impl.h"
#include "random_id.h"
#include "tar_reader.h"

namespace silt::containerd {
namespace {

using nlohmann::json;

constexpr char kOciManifest[] = "application/vnd.oci.image.manifest.v1+json";
constexpr char kOciIndex[] = "application/vnd.oci.image.index.v1+json";
constexpr char kOciConfig[] = "application/vnd.oci.image.config.v1+json";
constexpr char kDockerManifest[] =
    "application/vnd.docker.distribution.manifest.v2+json";
constexpr char kDockerList[] =
    "application/vnd.docker.distribution.manifest.list.v2+json";
constexpr char kLayerTar[] = "application/vnd.oci.image.layer.v1.tar";
constexpr char kLayerTarGzip[] = "application/vnd.oci.image.layer.v1.tar+gzip";
// Manifests, indexes and configs are read whole; layers are streamed.
constexpr uint64_t kMaxMetadata = 4 << 20;
constexpr size_t kWriteChunk = 1 << 20;

absl::Status Invalid(absl::string_view what) { return BadArchive(what); }

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr);
  }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  void Update(const char* p, size_t n) { EVP_DigestUpdate(ctx_, p, n); }
  std::string Digest() {
    unsigned char md[32];
    unsigned len = 0;
    EVP_DigestFinal_ex(ctx_, md, &len);
    static const char* hex = "0123456789abcdef";
    std::string s = "sha256:";
    for (unsigned i = 0; i < len; ++i) {
      s += hex[md[i] >> 4];
      s += hex[md[i] & 15];
    }
    return s;
  }

 private:
  EVP_MD_CTX* ctx_;
};

std::string Sha256Of(absl::string_view bytes) {
  Sha256 h;
  h.Update(bytes.data(), bytes.size());
  return h.Digest();
}

bool IsDigest(absl::string_view d) {
  if (!absl::ConsumePrefix(&d, "sha256:") || d.size() != 64) return false;
  return std::all_of(d.begin(), d.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

// A file of the archive, uploaded to the content store as it was read.
struct Blob {
  std::string digest;
  uint64_t size = 0;
  bool gzip = false;  // starts with gzip's magic
  std::string data;   // kept when small enough to be metadata
};

struct Descriptor {
  std::string media_type, digest;
  uint64_t size = 0;
};

absl::StatusOr<Descriptor> ParseDescriptor(const json& j,
                                           absl::string_view what) {
  Descriptor d;
  if (!j.is_object() || !j.contains("digest") || !j["digest"].is_string())
    return Invalid(absl::StrCat(what, " has no digest"));
  d.digest = j["digest"].get<std::string>();
  if (!IsDigest(d.digest))
    return Invalid(
        absl::StrCat(what, " digest ", d.digest, " is not sha256:<64 hex>"));
  if (!j.contains("size") || !j["size"].is_number_unsigned())
    return Invalid(absl::StrCat(what, " has no size"));
  d.size = j["size"].get<uint64_t>();
  if (j.contains("mediaType") && j["mediaType"].is_string())
    d.media_type = j["mediaType"].get<std::string>();
  return d;
}

// j[key] when it is a string, else `fallback` (json::value throws for a
// member of another type).
std::string StrOr(const json& j, const char* key, const char* fallback) {
  if (j.is_object() && j.contains(key) && j[key].is_string())
    return j[key].get<std::string>();
  return fallback;
}

std::vector<std::string> Strings(const json& config, const char* key) {
  std::vector<std::string> out;
  if (config.contains(key) && config[key].is_array())
    for (const auto& v : config[key])
      if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

}  // namespace

// One import: its lease, the archive's files, the images it names.
class Importer {
 public:
  explicit Importer(Client::Impl* impl) : impl_(impl) {}

  absl::Status Begin() {
    // Should the invoker die mid-import, containerd drops what it left;
    // what no image holds is gone when Import returns.
    lease_holder_ = std::make_unique<Lease>(impl_, "silt-import-",
                                            absl::Hours(1), /*sync=*/true);
    if (!lease_holder_->status().ok()) return lease_holder_->status();
    lease_ = lease_holder_->id();
    return absl::OkStatus();
  }

  // Reads the archive, uploading its files as they come.
  absl::Status ReadArchive(const std::string& path) {
    auto tar = TarReader::Open(path);
    if (!tar.ok()) return tar.status();
    TarReader::Entry e;
    for (;;) {
      auto more = (*tar)->Next(&e);
      if (!more.ok()) return more.status();
      if (!*more) break;
      if (!e.regular) continue;
      if (e.name == "index.json" || e.name == "manifest.json" ||
          e.name == "oci-layout" || e.name == "repositories") {
        if (e.size > kMaxMetadata)
          return Invalid(absl::StrCat(e.name, " is ", e.size, " bytes"));
        std::string data(e.size, '\0');
        auto n = (*tar)->Read(data.data(), data.size());
        if (!n.ok()) return n.status();
        meta_[e.name] = std::move(data);
        continue;
      }
      std::string expected;
      if (absl::string_view hex = e.name;
          absl::ConsumePrefix(&hex, "blobs/sha256/")) {
        expected = absl::StrCat("sha256:", hex);
        if (!IsDigest(expected))
          return Invalid(absl::StrCat(e.name, " is not named by a digest"));
      }
      auto blob = Upload(**tar, e, expected);
      if (!blob.ok()) return blob.status();
      by_digest_[blob->digest] = e.name;
      files_[e.name] = *std::move(blob);
    }
    return absl::OkStatus();
  }

  // The images the archive names: name → manifest.
  absl::StatusOr<std::vector<std::pair<std::string, Descriptor>>> Images() {
    std::vector<std::pair<std::string, Descriptor>> out;
    if (meta_.count("manifest.json")) return DockerImages();
    if (!meta_.count("index.json"))
      return Invalid(
          "neither an OCI image layout (index.json) nor a `docker save` "
          "archive (manifest.json)");
    json index = json::parse(meta_["index.json"], nullptr, false);
    if (!index.is_object() || !index.contains("manifests") ||
        !index["manifests"].is_array())
      return Invalid("index.json lists no manifests");
    for (const auto& m : index["manifests"]) {
      auto d = ParseDescriptor(m, "a manifest of index.json");
      if (!d.ok()) return d.status();
      auto name = OciEntryName(m);
      if (!name.ok()) return name.status();
      auto manifest = PlatformManifest(*d);
      if (!manifest.ok()) return manifest.status();
      out.emplace_back(*name, *manifest);
    }
    if (out.empty()) return Invalid("index.json lists no manifests");
    return out;
  }

  // Unpacks the image and records it under `name`.
  absl::StatusOr<Image> Store(
      const std::string& name, const Descriptor& manifest_desc,
      const std::map<std::string, std::string>& record_labels) {
    auto manifest_bytes = Metadata(manifest_desc.digest, "the manifest");
    if (!manifest_bytes.ok()) return manifest_bytes.status();
    json manifest = json::parse(*manifest_bytes, nullptr, false);
    if (!manifest.is_object() || !manifest.contains("layers") ||
        !manifest["layers"].is_array())
      return Invalid(absl::StrCat("manifest ", manifest_desc.digest,
                                  " is not an image manifest"));
    auto config_desc = ParseDescriptor(
        manifest.contains("config") ? manifest["config"] : json(),
        "the manifest's config");
    if (!config_desc.ok()) return config_desc.status();
    auto config_bytes = Metadata(config_desc->digest, "the config");
    if (!config_bytes.ok()) return config_bytes.status();
    json config = json::parse(*config_bytes, nullptr, false);
    if (!config.is_object())
      return Invalid(
          absl::StrCat("config ", config_desc->digest, " is not JSON"));
    if (StrOr(config, "os", "linux") != "linux" ||
        StrOr(config, "architecture", "amd64") != "amd64")
      return Invalid(absl::StrCat(name, " is for ", StrOr(config, "os", "?"),
                                  "/", StrOr(config, "architecture", "?"),
                                  ", this node runs linux/amd64"));
    std::vector<std::string> diff_ids;
    if (config.contains("rootfs") && config["rootfs"].is_object())
      diff_ids = Strings(config["rootfs"], "diff_ids");
    const json& layers = manifest["layers"];
    if (diff_ids.size() != layers.size() || layers.empty())
      return Invalid(absl::StrCat(name, ": ", layers.size(), " layers but ",
                                  diff_ids.size(), " diff_ids in its config"));
    uint64_t total = manifest_desc.size + config_desc->size;
    std::string parent;
    for (size_t i = 0; i < layers.size(); ++i) {
      auto layer = ParseDescriptor(layers[i], absl::StrCat("layer ", i));
      if (!layer.ok()) return layer.status();
      if (!by_digest_.count(layer->digest))
        return Invalid(
            absl::StrCat("layer ", layer->digest, " is not in the archive"));
      total += layer->size;
      std::string chain =
          parent.empty() ? diff_ids[i]
                         : Sha256Of(absl::StrCat(parent, " ", diff_ids[i]));
      if (auto s = Unpack(*layer, diff_ids[i], parent, chain); !s.ok())
        return s;
      parent = chain;
    }
    // What keeps the image's blobs and root alive once the lease is gone.
    std::map<std::string, std::string> manifest_labels = {
        {"containerd.io/gc.ref.content.config", config_desc->digest}};
    for (size_t i = 0; i < layers.size(); ++i)
      manifest_labels[absl::StrCat("containerd.io/gc.ref.content.l.", i)] =
          layers[i]["digest"].get<std::string>();
    if (auto s = Label(manifest_desc.digest, manifest_labels); !s.ok())
      return s;
    if (auto s = Label(
            config_desc->digest,
            {{absl::StrCat("containerd.io/gc.ref.snapshot.", kSnapshotter),
              parent}});
        !s.ok())
      return s;
    images_v1::Image record;
    record.set_name(name);
    for (const auto& [k, v] : record_labels) (*record.mutable_labels())[k] = v;
    record.mutable_target()->set_media_type(manifest_desc.media_type.empty()
                                                ? kOciManifest
                                                : manifest_desc.media_type);
    record.mutable_target()->set_digest(manifest_desc.digest);
    record.mutable_target()->set_size(static_cast<int64_t>(manifest_desc.size));
    {
      images_v1::CreateImageRequest req;
      *req.mutable_image() = record;
      images_v1::CreateImageResponse res;
      auto ctx = impl_->Context(std::chrono::seconds(30), lease_);
      grpc::Status s = impl_->images->Create(ctx.get(), req, &res);
      if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
        images_v1::UpdateImageRequest up;
        *up.mutable_image() = record;
        images_v1::UpdateImageResponse ures;
        auto uctx = impl_->Context(std::chrono::seconds(30), lease_);
        s = impl_->images->Update(uctx.get(), up, &ures);
      }
      if (auto st = FromGrpc(s, "cannot record image " + name); !st.ok())
        return st;
    }
    Image image = ImageFrom(name, manifest_desc.digest, total, parent, config);
    image.record_labels = record_labels;
    return image;
  }

 private:
  // Streams the entry's data into the content store.
  absl::StatusOr<Blob> Upload(TarReader& tar, const TarReader::Entry& e,
                              const std::string& expected) {
    Blob blob;
    blob.size = e.size;
    std::string ref = absl::StrCat(lease_, "-", files_.size());
    auto ctx = impl_->Context(std::chrono::minutes(30), lease_);
    auto stream = impl_->content->Write(ctx.get());
    content_v1::WriteContentRequest req;
    content_v1::WriteContentResponse res;
    // Known content (a digest-named blob already stored) is not sent again.
    req.set_action(content_v1::STAT);
    req.set_ref(ref);
    req.set_total(static_cast<int64_t>(e.size));
    req.set_expected(expected);
    bool exists = false;
    if (!stream->Write(req) || !stream->Read(&res)) {
      grpc::Status s = stream->Finish();
      if (s.error_code() != grpc::StatusCode::ALREADY_EXISTS)
        return FromGrpc(s, "cannot write " + e.name + " to containerd");
      exists = true;
    }
    Sha256 hash;
    std::string chunk(std::min<uint64_t>(e.size, kWriteChunk), '\0');
    uint64_t offset = 0;
    for (;;) {
      auto n = tar.Read(chunk.data(), chunk.size());
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      hash.Update(chunk.data(), *n);
      if (offset == 0 && *n >= 2)
        blob.gzip = static_cast<unsigned char>(chunk[0]) == 0x1f &&
                    static_cast<unsigned char>(chunk[1]) == 0x8b;
      if (e.size <= kMaxMetadata) blob.data.append(chunk.data(), *n);
      if (!exists) {
        req.Clear();
        req.set_action(content_v1::WRITE);
        req.set_ref(ref);
        req.set_offset(static_cast<int64_t>(offset));
        req.set_data(chunk.data(), *n);
        if (!stream->Write(req) || !stream->Read(&res))
          return FromGrpc(stream->Finish(),
                          "cannot write " + e.name + " to containerd");
      }
      offset += *n;
    }
    blob.digest = hash.Digest();
    if (!expected.empty() && blob.digest != expected)
      return Invalid(absl::StrCat(e.name, " does not match its digest (it is ",
                                  blob.digest, ")"));
    if (exists) return blob;
    req.Clear();
    req.set_action(content_v1::COMMIT);
    req.set_ref(ref);
    // (An offset of 0 would truncate what was written.)
    req.set_offset(static_cast<int64_t>(offset));
    req.set_total(static_cast<int64_t>(e.size));
    req.set_expected(blob.digest);
    if (!stream->Write(req) || !stream->Read(&res)) {
      grpc::Status s = stream->Finish();
      if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) return blob;
      return FromGrpc(s, "cannot commit " + e.name + " to containerd");
    }
    if (auto s = Close(*stream, "cannot commit " + e.name); !s.ok()) return s;
    return blob;
  }

  // Ends a Write stream: the server's status once every reply is read (a
  // sync stream's Finish waits for unread ones).
  using WriteStream =
      grpc::ClientReaderWriter<content_v1::WriteContentRequest,
                               content_v1::WriteContentResponse>;
  static absl::Status Close(WriteStream& stream, const std::string& what) {
    stream.WritesDone();
    content_v1::WriteContentResponse res;
    while (stream.Read(&res)) {
    }
    return FromGrpc(stream.Finish(), what);
  }

  absl::StatusOr<std::string> Metadata(const std::string& digest,
                                       absl::string_view what) {
    auto it = by_digest_.find(digest);
    if (it == by_digest_.end())
      return Invalid(absl::StrCat(what, " ", digest, " is not in the archive"));
    const Blob& b = files_[it->second];
    if (b.size > kMaxMetadata)
      return Invalid(absl::StrCat(what, " ", digest, " is ", b.size, " bytes"));
    return b.data;
  }

  // The manifest for linux/amd64 that a descriptor names (itself, or one of
  // the index it names).
  absl::StatusOr<Descriptor> PlatformManifest(const Descriptor& d) {
    if (d.media_type != kOciIndex && d.media_type != kDockerList) return d;
    auto bytes = Metadata(d.digest, "the index");
    if (!bytes.ok()) return bytes.status();
    json index = json::parse(*bytes, nullptr, false);
    if (!index.is_object() || !index.contains("manifests") ||
        !index["manifests"].is_array())
      return Invalid(absl::StrCat("index ", d.digest, " lists no manifests"));
    for (const auto& m : index["manifests"]) {
      const json p = m.contains("platform") ? m["platform"] : json::object();
      if (!p.is_object() || StrOr(p, "os", "linux") != "linux" ||
          StrOr(p, "architecture", "amd64") != "amd64")
        continue;
      auto md = ParseDescriptor(m, "a manifest of an index");
      if (!md.ok()) return md.status();
      if (md->media_type == kOciIndex || md->media_type == kDockerList)
        continue;
      return *md;
    }
    return Invalid(
        absl::StrCat("index ", d.digest, " has no image for linux/amd64"));
  }

  // `docker save`'s manifest.json, each entry made an OCI manifest.
  absl::StatusOr<std::vector<std::pair<std::string, Descriptor>>>
  DockerImages() {
    json list = json::parse(meta_["manifest.json"], nullptr, false);
    if (!list.is_array() || list.empty())
      return Invalid("manifest.json lists no images");
    std::vector<std::pair<std::string, Descriptor>> out;
    for (const auto& entry : list) {
      if (!entry.is_object() || !entry.contains("Config") ||
          !entry["Config"].is_string())
        return Invalid("an image of manifest.json has no Config");
      auto file = [&](const std::string& path) -> const Blob* {
        auto it = files_.find(path);
        return it == files_.end() ? nullptr : &it->second;
      };
      const Blob* config = file(entry["Config"].get<std::string>());
      if (config == nullptr)
        return Invalid(absl::StrCat(entry["Config"].get<std::string>(),
                                    " is not in the archive"));
      json layers = json::array();
      for (const std::string& path : Strings(entry, "Layers")) {
        const Blob* layer = file(path);
        if (layer == nullptr)
          return Invalid(absl::StrCat(path, " is not in the archive"));
        layers.push_back(
            {{"mediaType", layer->gzip ? kLayerTarGzip : kLayerTar},
             {"digest", layer->digest},
             {"size", layer->size}});
      }
      json manifest = {{"schemaVersion", 2},
                       {"mediaType", kOciManifest},
                       {"config",
                        {{"mediaType", kOciConfig},
                         {"digest", config->digest},
                         {"size", config->size}}},
                       {"layers", layers}};
      std::string bytes = manifest.dump();
      auto stored = UploadBytes(bytes);
      if (!stored.ok()) return stored.status();
      Descriptor d{kOciManifest, *stored, bytes.size()};
      auto names = DockerEntryNames(entry);
      if (!names.ok()) return names.status();
      for (const std::string& name : *names) out.emplace_back(name, d);
    }
    return out;
  }

  // Stores bytes made here (a manifest): their digest.
  absl::StatusOr<std::string> UploadBytes(const std::string& bytes) {
    std::string digest = Sha256Of(bytes);
    auto ctx = impl_->Context(std::chrono::seconds(30), lease_);
    auto stream = impl_->content->Write(ctx.get());
    content_v1::WriteContentRequest req;
    content_v1::WriteContentResponse res;
    req.set_action(content_v1::COMMIT);
    req.set_ref(absl::StrCat(lease_, "-m", files_.size(), "-", ++made_));
    req.set_total(static_cast<int64_t>(bytes.size()));
    req.set_expected(digest);
    req.set_data(bytes);
    if (!stream->Write(req) || !stream->Read(&res)) {
      grpc::Status s = stream->Finish();
      if (s.error_code() != grpc::StatusCode::ALREADY_EXISTS)
        return FromGrpc(s, "cannot store a manifest in containerd");
    } else {
      if (auto s = Close(*stream, "cannot store a manifest"); !s.ok()) return s;
    }
    Blob b;
    b.digest = digest;
    b.size = bytes.size();
    b.data = bytes;
    std::string path = "(made) " + digest;
    by_digest_[digest] = path;
    files_[path] = std::move(b);
    return digest;
  }

  // Makes snapshot `chain` of `layer` on `parent` unless it exists.
  absl::Status Unpack(const Descriptor& layer, const std::string& diff_id,
                      const std::string& parent, const std::string& chain) {
    {
      snapshots_v1::StatSnapshotRequest req;
      req.set_snapshotter(kSnapshotter);
      req.set_key(chain);
      snapshots_v1::StatSnapshotResponse res;
      auto ctx = impl_->Context(std::chrono::seconds(30), lease_);
      if (impl_->snapshots->Stat(ctx.get(), req, &res).ok())
        return absl::OkStatus();
    }
    std::string key =
        absl::StrCat("silt-unpack-", invoker::RandomId(12), " ", chain);
    snapshots_v1::PrepareSnapshotRequest prep;
    prep.set_snapshotter(kSnapshotter);
    prep.set_key(key);
    prep.set_parent(parent);
    snapshots_v1::PrepareSnapshotResponse mounts;
    {
      auto ctx = impl_->Context(std::chrono::seconds(30), lease_);
      if (auto s =
              FromGrpc(impl_->snapshots->Prepare(ctx.get(), prep, &mounts),
                       "cannot prepare a snapshot for layer " + layer.digest);
          !s.ok())
        return s;
    }
    auto remove = [&] {
      snapshots_v1::RemoveSnapshotRequest req;
      req.set_snapshotter(kSnapshotter);
      req.set_key(key);
      google::protobuf::Empty res;
      auto ctx = impl_->Context(std::chrono::seconds(30), lease_);
      impl_->snapshots->Remove(ctx.get(), req, &res);
    };
    diff_v1::ApplyRequest apply;
    apply.mutable_diff()->set_media_type(
        layer.media_type.empty() ? kLayerTarGzip : layer.media_type);
    apply.mutable_diff()->set_digest(layer.digest);
    apply.mutable_diff()->set_size(static_cast<int64_t>(layer.size));
    *apply.mutable_mounts() = mounts.mounts();
    diff_v1::ApplyResponse applied;
    {
      auto ctx = impl_->Context(std::chrono::minutes(30), lease_);
      if (auto s = FromGrpc(impl_->diff->Apply(ctx.get(), apply, &applied),
                            "cannot unpack layer " + layer.digest);
          !s.ok()) {
        remove();
        return s.code() == absl::StatusCode::kUnknown ? Invalid(s.message())
                                                      : s;
      }
    }
    if (applied.applied().digest() != diff_id) {
      remove();
      return Invalid(absl::StrCat("layer ", layer.digest, " unpacks to ",
                                  applied.applied().digest(),
                                  ", its config says ", diff_id));
    }
    snapshots_v1::CommitSnapshotRequest commit;
    commit.set_snapshotter(kSnapshotter);
    commit.set_name(chain);
    commit.set_key(key);
    google::protobuf::Empty empty;
    auto ctx = impl_->Context(std::chrono::seconds(30), lease_);
    grpc::Status s = impl_->snapshots->Commit(ctx.get(), commit, &empty);
    if (!s.ok()) remove();
    // Another import may have made the same layer meanwhile.
    if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS)
      return absl::OkStatus();
    return FromGrpc(s, "cannot commit the snapshot of layer " + layer.digest);
  }

  absl::Status Label(const std::string& digest,
                     const std::map<std::string, std::string>& labels) {
    content_v1::InfoRequest ireq;
    ireq.set_digest(digest);
    content_v1::InfoResponse info;
    {
      auto ctx = impl_->Context(std::chrono::seconds(30), lease_);
      if (auto s = FromGrpc(impl_->content->Info(ctx.get(), ireq, &info),
                            "cannot find " + digest + " in containerd");
          !s.ok())
        return s;
    }
    content_v1::UpdateRequest req;
    *req.mutable_info() = info.info();
    for (const auto& [k, v] : labels) {
      (*req.mutable_info()->mutable_labels())[k] = v;
      req.mutable_update_mask()->add_paths("labels." + k);
    }
    content_v1::UpdateResponse res;
    auto ctx = impl_->Context(std::chrono::seconds(30), lease_);
    return FromGrpc(impl_->content->Update(ctx.get(), req, &res),
                    "cannot label " + digest);
  }

 public:
  static Image ImageFrom(const std::string& name, const std::string& digest,
                         uint64_t size, const std::string& chain_id,
                         const json& config) {
    Image image;
    image.name = name;
    image.digest = digest;
    image.size = size;
    image.chain_id = chain_id;
    if (config.contains("config") && config["config"].is_object()) {
      const json& c = config["config"];
      image.entrypoint = Strings(c, "Entrypoint");
      image.cmd = Strings(c, "Cmd");
      image.env = Strings(c, "Env");
      if (c.contains("WorkingDir") && c["WorkingDir"].is_string())
        image.working_dir = c["WorkingDir"].get<std::string>();
      if (c.contains("User") && c["User"].is_string())
        image.user = c["User"].get<std::string>();
      if (c.contains("ExposedPorts") && c["ExposedPorts"].is_object())
        for (const auto& [port, _] : c["ExposedPorts"].items())
          image.exposed_ports.push_back(port);
      if (c.contains("Labels") && c["Labels"].is_object())
        for (const auto& [k, v] : c["Labels"].items())
          if (v.is_string()) image.labels[k] = v.get<std::string>();
    }
    return image;
  }

 private:
  Client::Impl* impl_;
  std::unique_ptr<Lease> lease_holder_;
  std::string lease_;                             // its id
  std::map<std::string, std::string> meta_;       // index.json, manifest.json
  std::map<std::string, Blob> files_;             // by path in the archive
  std::map<std::string, std::string> by_digest_;  // → path
  int made_ = 0;
};

absl::StatusOr<std::vector<Image>> Client::Import(
    const std::string& archive,
    const std::map<std::string, std::string>& record_labels) {
  Importer importer(impl_.get());
  if (auto s = importer.Begin(); !s.ok()) return s;
  if (auto s = importer.ReadArchive(archive); !s.ok()) return s;
  auto named = importer.Images();
  if (!named.ok()) return named.status();
  std::vector<Image> images;
  for (const auto& [name, manifest] : *named) {
    auto image = importer.Store(name, manifest, record_labels);
    if (!image.ok()) {
      // All or nothing: the archive's images stored so far go too.
      for (const Image& done : images) RemoveImage(done.name).IgnoreError();
      return image.status();
    }
    images.push_back(*std::move(image));
  }
  return images;
}

namespace {

// A blob of the content store, whole (metadata: at most kMaxMetadata).
absl::StatusOr<std::string> ReadBlob(Client::Impl* impl,
                                     const std::string& digest) {
  content_v1::ReadContentRequest req;
  req.set_digest(digest);
  auto ctx = impl->Context();
  auto stream = impl->content->Read(ctx.get(), req);
  std::string data;
  content_v1::ReadContentResponse res;
  while (stream->Read(&res)) {
    if (data.size() + res.data().size() > kMaxMetadata) {
      ctx->TryCancel();
      stream->Finish();
      return absl::FailedPreconditionError(
          absl::StrCat(digest, " is too large to be an image's metadata"));
    }
    data += res.data();
  }
  if (auto s = FromGrpc(stream->Finish(), "cannot read " + digest); !s.ok())
    return s;
  return data;
}

// An image as its record, manifest and config say.
absl::StatusOr<Image> Describe(Client::Impl* impl,
                               const images_v1::Image& record) {
  const std::string& name = record.name();
  auto manifest_bytes = ReadBlob(impl, record.target().digest());
  if (!manifest_bytes.ok()) return manifest_bytes.status();
  json manifest = json::parse(*manifest_bytes, nullptr, false);
  auto broken = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("image ", name, " ", why, ": import it again"));
  };
  if (!manifest.is_object() || !manifest.contains("layers") ||
      !manifest["layers"].is_array() || !manifest.contains("config"))
    return broken("has no manifest");
  auto config_desc = ParseDescriptor(manifest["config"], "config");
  if (!config_desc.ok()) return broken("has a manifest without config");
  auto config_bytes = ReadBlob(impl, config_desc->digest);
  if (!config_bytes.ok()) return config_bytes.status();
  json config = json::parse(*config_bytes, nullptr, false);
  if (!config.is_object() || !config.contains("rootfs") ||
      !config["rootfs"].is_object())
    return broken("has no config");
  uint64_t size = record.target().size() + config_desc->size;
  for (const auto& l : manifest["layers"]) {
    auto d = ParseDescriptor(l, "layer");
    if (!d.ok()) return broken("has a layer without digest");
    size += d->size;
  }
  std::string chain;
  for (const std::string& diff_id : Strings(config["rootfs"], "diff_ids"))
    chain =
        chain.empty() ? diff_id : Sha256Of(absl::StrCat(chain, " ", diff_id));
  if (chain.empty()) return broken("has no layers");
  Image image =
      Importer::ImageFrom(name, record.target().digest(), size, chain, config);
  for (const auto& [k, v] : record.labels()) image.record_labels[k] = v;
  return image;
}

}  // namespace

absl::StatusOr<Image> Client::GetImage(const std::string& name) {
  auto normalized = NormalizeImageName(name);
  if (!normalized.ok()) return normalized.status();
  images_v1::GetImageRequest req;
  req.set_name(*normalized);
  images_v1::GetImageResponse res;
  auto ctx = impl_->Context();
  if (auto s = FromGrpc(impl_->images->Get(ctx.get(), req, &res),
                        "no image " + *normalized);
      !s.ok())
    return s;
  return Describe(impl_.get(), res.image());
}

absl::StatusOr<std::vector<Image>> Client::ListImages() {
  images_v1::ListImagesRequest req;
  images_v1::ListImagesResponse res;
  auto ctx = impl_->Context();
  if (auto s = FromGrpc(impl_->images->List(ctx.get(), req, &res),
                        "cannot list images");
      !s.ok())
    return s;
  std::vector<Image> images;
  for (const auto& record : res.images()) {
    auto image = Describe(impl_.get(), record);
    if (!image.ok()) return image.status();
    images.push_back(*std::move(image));
  }
  return images;
}

absl::Status Client::RemoveImage(const std::string& name) {
  auto normalized = NormalizeImageName(name);
  if (!normalized.ok()) return normalized.status();
  images_v1::DeleteImageRequest req;
  req.set_name(*normalized);
  req.set_sync(true);  // collected before this returns
  google::protobuf::Empty res;
  auto ctx = impl_->Context();
  return FromGrpc(impl_->images->Delete(ctx.get(), req, &res),
                  "cannot remove image " + *normalized);
}

absl::StatusOr<Client::Usage> Client::CountUsage() {
  Usage u;
  if (auto c = List(); c.ok())
    u.containers = c->size();
  else
    return c.status();
  {
    images_v1::ListImagesRequest req;
    images_v1::ListImagesResponse res;
    auto ctx = impl_->Context();
    if (auto s = FromGrpc(impl_->images->List(ctx.get(), req, &res),
                          "cannot list images");
        !s.ok())
      return s;
    u.images = res.images_size();
  }
  {
    content_v1::ListContentRequest req;
    auto ctx = impl_->Context();
    auto stream = impl_->content->List(ctx.get(), req);
    content_v1::ListContentResponse res;
    while (stream->Read(&res)) u.content_blobs += res.info_size();
    if (auto s = FromGrpc(stream->Finish(), "cannot list content"); !s.ok())
      return s;
  }
  {
    snapshots_v1::ListSnapshotsRequest req;
    req.set_snapshotter(kSnapshotter);
    auto ctx = impl_->Context();
    auto stream = impl_->snapshots->List(ctx.get(), req);
    snapshots_v1::ListSnapshotsResponse res;
    while (stream->Read(&res)) u.snapshots += res.info_size();
    if (auto s = FromGrpc(stream->Finish(), "cannot list snapshots"); !s.ok())
      return s;
  }
  {
    leases_v1::ListRequest req;
    leases_v1::ListResponse res;
    auto ctx = impl_->Context();
    if (auto s = FromGrpc(impl_->leases->List(ctx.get(), req, &res),
                          "cannot list leases");
        !s.ok())
      return s;
    u.leases = res.leases_size();
  }
  return u;
}

}  // namespace silt::containerd
