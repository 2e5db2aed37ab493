#include "store/store.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace silt::store {
namespace {

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
  Put(Table::kSecrets, NamespacedKey(s.ns, s.name), Encode(s));
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
  Options options;
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
};

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const Options& options) {
  if (options.path.empty())
    return absl::InvalidArgumentError("store: empty database path");
  std::error_code ec;
  std::filesystem::create_directories(options.path, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat(
        "store: cannot create ", options.path, ": ", ec.message()));
  }

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

  auto impl = std::make_unique<Impl>();
  impl->options = options;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s =
      rocksdb::DB::Open(db_options, options.path, descriptors, &handles, &db);
  if (!s.ok()) return FromRocks(s, "open", options.path);
  impl->db.reset(db);
  // handles[0] is the default family; Silt keeps nothing there.
  db->DestroyColumnFamilyHandle(handles[0]).PermitUncheckedError();
  impl->cfs.assign(handles.begin() + 1, handles.end());
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

const std::string& Store::path() const { return impl_->options.path; }

absl::Status Store::Write(const WriteBatch& batch, Durability durability) {
  if (batch.empty()) return absl::OkStatus();
  rocksdb::WriteBatch wb;
  for (const auto& op : batch.ops_) {
    rocksdb::Status s = op.is_delete
                            ? wb.Delete(impl_->cf(op.table), op.key)
                            : wb.Put(impl_->cf(op.table), op.key, op.value);
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
  auto v = Get(Table::kSecrets, NamespacedKey(ns, name));
  if (!v.ok()) {
    if (absl::IsNotFound(v.status()))
      return absl::NotFoundError(
          absl::StrCat("secret ", name, " not found in namespace ", ns));
    return v.status();
  }
  return DecodeSecret(*v);
}

absl::StatusOr<std::vector<SecretRecord>> Store::ListSecrets(
    absl::string_view ns) const {
  std::string prefix = ns.empty() ? std::string() : NamespacedKey(ns, "");
  return DecodeAll<SecretRecord>(Scan(Table::kSecrets, prefix), DecodeSecret);
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
