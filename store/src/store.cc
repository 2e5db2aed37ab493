#include "store/store.h"

#include <openssl/crypto.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "sealer.h"
#include "store/secrets_key.h"

namespace silt::store {
namespace {

// A value sealed under the store's key, kept in the meta table, by which Open
// tells a wrong key from the right one before any secret is read.
constexpr absl::string_view kKeyCheck = "secrets-key-check";

constexpr absl::string_view kTableNames[kTableCount] = {
    "functions", "secrets",  "namespaces",  "bundles",
    "snapshots", "proclets", "async_queue", "meta"};

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view op,
                       absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat("store: ", op, " ", what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut())
    return absl::UnavailableError(msg);
  if (s.IsIOError()) {
    // RocksDB reports a lock held by another process as an IO error.
    if (s.ToString().find("lock") != std::string::npos)
      return absl::FailedPreconditionError(
          absl::StrCat(msg, " (is another process using this data dir?)"));
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

template <typename Record, typename Decode>
absl::StatusOr<std::vector<Record>> DecodeAll(
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> rows,
    Decode decode) {
  if (!rows.ok()) return rows.status();
  std::vector<Record> out;
  out.reserve(rows->size());
  for (const auto& [key, value] : *rows) {
    auto r = decode(value);
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return out;
}

// Secrets written before values were sealed are plain CBOR records: a CBOR
// map's first byte is 0xa0-0xbf, never kSealedV1.
bool IsPlainSecret(absl::string_view row) {
  return !row.empty() && (static_cast<uint8_t>(row[0]) & 0xe0) == 0xa0;
}

// The namespace and name of a NamespacedKey.
std::pair<std::string, std::string> SplitNamespacedKey(absl::string_view key) {
  size_t nul = key.find('\0');
  if (nul == absl::string_view::npos) return {"", std::string(key)};
  return {std::string(key.substr(0, nul)), std::string(key.substr(nul + 1))};
}

}  // namespace

absl::string_view TableName(Table t) {
  return kTableNames[static_cast<int>(t)];
}

std::string NamespacedKey(absl::string_view ns, absl::string_view name) {
  std::string key;
  key.reserve(ns.size() + 1 + name.size());
  key.append(ns.data(), ns.size());
  key.push_back('\0');
  key.append(name.data(), name.size());
  return key;
}

// ---- WriteBatch ----

WriteBatch::WriteBatch() = default;
WriteBatch::~WriteBatch() = default;
WriteBatch::WriteBatch(WriteBatch&&) noexcept = default;
WriteBatch& WriteBatch::operator=(WriteBatch&&) noexcept = default;

void WriteBatch::Put(Table table, absl::string_view key,
                     absl::string_view value) {
  ops_.push_back({table, false, std::string(key), std::string(value)});
}
void WriteBatch::Delete(Table table, absl::string_view key) {
  ops_.push_back({table, true, std::string(key), {}});
}
void WriteBatch::PutFunction(const FunctionRecord& f) {
  Put(Table::kFunctions, NamespacedKey(f.ns, f.name), Encode(f));
}
void WriteBatch::DeleteFunction(absl::string_view ns, absl::string_view name) {
  Delete(Table::kFunctions, NamespacedKey(ns, name));
}
void WriteBatch::PutSecret(const SecretRecord& s) {
  ops_.push_back({Table::kSecrets, false, NamespacedKey(s.ns, s.name), s.value,
                  /*seal=*/true});
}
void WriteBatch::DeleteSecret(absl::string_view ns, absl::string_view name) {
  Delete(Table::kSecrets, NamespacedKey(ns, name));
}
void WriteBatch::PutNamespace(const NamespaceRecord& n) {
  Put(Table::kNamespaces, n.name, Encode(n));
}
void WriteBatch::DeleteNamespace(absl::string_view name) {
  Delete(Table::kNamespaces, name);
}

// ---- Store ----

struct Store::Impl {
  Options options;  // secrets_key cleared: the sealer holds the key
  std::unique_ptr<Sealer> sealer;
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs;  // indexed by Table

  ~Impl() {
    for (auto* cf : cfs) {
      if (cf != nullptr)
        db->DestroyColumnFamilyHandle(cf).PermitUncheckedError();
    }
    if (db) db->Close().PermitUncheckedError();
  }
  rocksdb::ColumnFamilyHandle* cf(Table t) const {
    return cfs[static_cast<int>(t)];
  }

  absl::Status OpenDb();
  absl::StatusOr<SecretRecord> OpenSecret(absl::string_view key,
                                          absl::string_view row) const;
  // Rewrites the secrets table's files so that none keeps an overwritten
  // value.
  absl::Status CompactSecrets();
};

namespace {

// Creates the database directory (owner-only when Open makes it).
absl::Status MakeStoreDir(const std::string& path) {
  std::error_code ec;
  bool created = std::filesystem::create_directories(path, ec);
  if (!ec && created) {
    std::filesystem::permissions(path, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, ec);
  }
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("store: cannot create ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// Seals kKeyCheck under a new store's key, or checks that the key opens it.
absl::Status CheckSecretsKey(Store& store, const Sealer& sealer) {
  auto row = store.Get(Table::kMeta, kKeyCheck);
  if (absl::IsNotFound(row.status())) {
    auto sealed = sealer.Seal(kKeyCheck, "silt");
    if (!sealed.ok()) return sealed.status();
    WriteBatch b;
    b.Put(Table::kMeta, kKeyCheck, *sealed);
    return store.Write(b);
  }
  if (!row.ok()) return row.status();
  if (!sealer.Open(kKeyCheck, *row).ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store: the secrets key does not open the secrets in ", store.path(),
        ": they were sealed with another key (use the key file the store "
        "was first opened with)"));
  }
  return absl::OkStatus();
}

// Seals every secret still in the plain format; how many there were.
absl::StatusOr<size_t> SealPlainSecrets(Store& store) {
  auto rows = store.Scan(Table::kSecrets, "");
  if (!rows.ok()) return rows.status();
  WriteBatch b;
  for (const auto& [key, row] : *rows) {
    if (!IsPlainSecret(row)) continue;
    auto r = DecodeSecret(row);
    if (!r.ok()) return r.status();
    auto [ns, name] = SplitNamespacedKey(key);
    b.PutSecret({std::move(ns), std::move(name), std::move(r->value)});
  }
  if (auto s = store.Write(b); !s.ok()) return s;
  return b.size();
}

}  // namespace

absl::Status Store::Impl::OpenDb() {
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.paranoid_checks = true;
  db_options.max_background_jobs = 2;
  db_options.keep_log_file_num = 4;
  db_options.max_log_file_size = 4 << 20;

  rocksdb::ColumnFamilyOptions cf_options;
  cf_options.write_buffer_size = 4 << 20;
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  descriptors.emplace_back(rocksdb::kDefaultColumnFamilyName, cf_options);
  for (absl::string_view name : kTableNames) {
    descriptors.emplace_back(std::string(name), cf_options);
  }

  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      rocksdb::DB::Open(db_options, options.path, descriptors, &handles, &raw);
  if (!s.ok()) return FromRocks(s, "open", options.path);
  db.reset(raw);
  // handles[0] is the default family; Silt keeps nothing there.
  db->DestroyColumnFamilyHandle(handles[0]).PermitUncheckedError();
  cfs.assign(handles.begin() + 1, handles.end());
  return absl::OkStatus();
}

absl::StatusOr<SecretRecord> Store::Impl::OpenSecret(
    absl::string_view key, absl::string_view row) const {
  auto [ns, name] = SplitNamespacedKey(key);
  SecretRecord r{ns, name, ""};
  if (IsPlainSecret(row)) {
    auto plain = DecodeSecret(row);
    if (!plain.ok()) return plain.status();
    r.value = std::move(plain->value);
    return r;
  }
  auto value = sealer->Open(key, row);
  if (!value.ok()) {
    return absl::Status(value.status().code(),
                        absl::StrCat("secret ", name, " in namespace ", ns,
                                     ": ", value.status().message()));
  }
  r.value = *std::move(value);
  return r;
}

absl::Status Store::Impl::CompactSecrets() {
  rocksdb::CompactRangeOptions o;
  o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  return FromRocks(db->CompactRange(o, cf(Table::kSecrets), nullptr, nullptr),
                   "compact", TableName(Table::kSecrets));
}

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const Options& options) {
  if (options.path.empty())
    return absl::InvalidArgumentError("store: empty database path");
  if (options.secrets_key.size() != kSecretsKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store: the secrets key must be ", kSecretsKeyBytes,
                     " bytes, not ", options.secrets_key.size()));
  }
  if (auto s = MakeStoreDir(options.path); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->sealer = std::make_unique<Sealer>(options.secrets_key);
  OPENSSL_cleanse(impl->options.secrets_key.data(),
                  impl->options.secrets_key.size());
  impl->options.secrets_key.clear();
  if (auto s = impl->OpenDb(); !s.ok()) return s;

  Impl& opened = *impl;
  std::unique_ptr<Store> store(new Store(std::move(impl)));
  if (auto s = CheckSecretsKey(*store, *opened.sealer); !s.ok()) return s;
  auto sealed = SealPlainSecrets(*store);
  if (!sealed.ok()) return sealed.status();
  if (*sealed > 0) {
    if (auto s = opened.CompactSecrets(); !s.ok()) return s;
  }
  return store;
}

const std::string& Store::path() const { return impl_->options.path; }

absl::Status Store::Write(const WriteBatch& batch, Durability durability) {
  if (batch.empty()) return absl::OkStatus();
  rocksdb::WriteBatch wb;
  for (const auto& op : batch.ops_) {
    absl::StatusOr<std::string> sealed;
    if (op.seal) {
      sealed = impl_->sealer->Seal(op.key, op.value);
      if (!sealed.ok()) return sealed.status();
    }
    const std::string& value = op.seal ? *sealed : op.value;
    rocksdb::Status s = op.is_delete
                            ? wb.Delete(impl_->cf(op.table), op.key)
                            : wb.Put(impl_->cf(op.table), op.key, value);
    if (!s.ok()) return FromRocks(s, "batch", TableName(op.table));
  }
  rocksdb::WriteOptions wo;
  wo.sync = impl_->options.sync_writes && durability == Durability::kSynced;
  return FromRocks(impl_->db->Write(wo, &wb), "write",
                   absl::StrCat(batch.size(), " ops"));
}

absl::StatusOr<std::string> Store::Get(Table table,
                                       absl::string_view key) const {
  std::string value;
  rocksdb::Status s =
      impl_->db->Get(rocksdb::ReadOptions(), impl_->cf(table),
                     rocksdb::Slice(key.data(), key.size()), &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(
        absl::StrCat(TableName(table), " key not found"));
  }
  if (!s.ok()) return FromRocks(s, "get", TableName(table));
  return value;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Store::Scan(
    Table table, absl::string_view prefix) const {
  rocksdb::ReadOptions ro;
  std::unique_ptr<rocksdb::Iterator> it(
      impl_->db->NewIterator(ro, impl_->cf(table)));
  std::vector<std::pair<std::string, std::string>> out;
  rocksdb::Slice p(prefix.data(), prefix.size());
  for (it->Seek(p); it->Valid() && it->key().starts_with(p); it->Next()) {
    out.emplace_back(it->key().ToString(), it->value().ToString());
  }
  if (!it->status().ok())
    return FromRocks(it->status(), "scan", TableName(table));
  return out;
}

absl::StatusOr<FunctionRecord> Store::GetFunction(
    absl::string_view ns, absl::string_view name) const {
  auto v = Get(Table::kFunctions, NamespacedKey(ns, name));
  if (!v.ok()) {
    if (absl::IsNotFound(v.status()))
      return absl::NotFoundError(
          absl::StrCat("function ", name, ".", ns, " not found"));
    return v.status();
  }
  return DecodeFunction(*v);
}

absl::StatusOr<std::vector<FunctionRecord>> Store::ListFunctions(
    absl::string_view ns) const {
  std::string prefix = ns.empty() ? std::string() : NamespacedKey(ns, "");
  return DecodeAll<FunctionRecord>(Scan(Table::kFunctions, prefix),
                                   DecodeFunction);
}

absl::StatusOr<SecretRecord> Store::GetSecret(absl::string_view ns,
                                              absl::string_view name) const {
  std::string key = NamespacedKey(ns, name);
  auto v = Get(Table::kSecrets, key);
  if (!v.ok()) {
    if (absl::IsNotFound(v.status()))
      return absl::NotFoundError(
          absl::StrCat("secret ", name, " not found in namespace ", ns));
    return v.status();
  }
  return impl_->OpenSecret(key, *v);
}

absl::Status Store::FindSecret(absl::string_view ns,
                               absl::string_view name) const {
  auto v = Get(Table::kSecrets, NamespacedKey(ns, name));
  if (absl::IsNotFound(v.status()))
    return absl::NotFoundError(
        absl::StrCat("secret ", name, " not found in namespace ", ns));
  return v.status();
}

absl::StatusOr<std::vector<SecretRecord>> Store::ListSecrets(
    absl::string_view ns) const {
  std::string prefix = ns.empty() ? std::string() : NamespacedKey(ns, "");
  auto rows = Scan(Table::kSecrets, prefix);
  if (!rows.ok()) return rows.status();
  std::vector<SecretRecord> out;
  out.reserve(rows->size());
  for (const auto& [key, row] : *rows) {
    auto [r_ns, r_name] = SplitNamespacedKey(key);
    out.push_back({std::move(r_ns), std::move(r_name), ""});
  }
  return out;
}

absl::StatusOr<NamespaceRecord> Store::GetNamespace(
    absl::string_view name) const {
  auto v = Get(Table::kNamespaces, name);
  if (!v.ok()) {
    if (absl::IsNotFound(v.status()))
      return absl::NotFoundError(
          absl::StrCat("namespace ", name, " not found"));
    return v.status();
  }
  return DecodeNamespace(*v);
}

absl::StatusOr<std::vector<NamespaceRecord>> Store::ListNamespaces() const {
  return DecodeAll<NamespaceRecord>(Scan(Table::kNamespaces, ""),
                                    DecodeNamespace);
}

}  // namespace silt::store
