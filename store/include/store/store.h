// Typed persistence for Silt over one embedded RocksDB instance.
//
// One Store object owns one RocksDB database. Each kind of record lives in its
// own column family (a Table). Reads return absl::NotFoundError for a missing
// key. Every write goes through a WriteBatch, which commits atomically across
// tables and, by default, is fsync'd before Write() returns: a deployment the
// gateway acknowledged survives a crash.
//
// Secret values are sealed at rest (AES-256-GCM under Options::secrets_key;
// the format is in src/sealer.h): only GetSecret opens one. A store refuses to
// open under a key other than the one it was first opened with.
#ifndef SILT_STORE_STORE_H_
#define SILT_STORE_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "store/records.h"

namespace silt::store {

enum class Table : int {
  kFunctions = 0,
  kSecrets,
  kNamespaces,
  kBundles,
  kSnapshots,
  kProclets,
  kAsyncQueue,
  kMeta,
};
inline constexpr int kTableCount = 8;
absl::string_view TableName(Table t);

struct Options {
  // Directory of the database; created if missing.
  std::string path;
  // The kSecretsKeyBytes key that seals secret values (store/secrets_key.h
  // reads and creates key files). Required.
  std::string secrets_key;
  // fsync the write-ahead log on every WriteBatch. Only tests that measure or
  // that simulate power loss differently turn this off.
  bool sync_writes = true;
};

// How far a write must have gone before Store::Write returns.
enum class Durability : uint8_t {
  // On disk (the write-ahead log fsynced, when Options::sync_writes): it
  // survives the machine losing power.
  kSynced,
  // In the operating system's page cache: it survives the process crashing
  // but not the machine. For records that can be rebuilt from elsewhere
  // (the proclet directory's locations, which the nodes report), where an
  // fsync would sit in a latency that matters.
  kBuffered,
};

// A set of writes applied atomically by Store::Write.
class WriteBatch {
 public:
  WriteBatch();
  ~WriteBatch();
  WriteBatch(WriteBatch&&) noexcept;
  WriteBatch& operator=(WriteBatch&&) noexcept;

  void Put(Table table, absl::string_view key, absl::string_view value);
  void Delete(Table table, absl::string_view key);

  void PutFunction(const FunctionRecord& f);
  void DeleteFunction(absl::string_view ns, absl::string_view name);
  // The value is sealed when the batch is written, never kept in the clear on
  // disk; a record in the older plain format becomes sealed this way too.
  void PutSecret(const SecretRecord& s);
  void DeleteSecret(absl::string_view ns, absl::string_view name);
  void PutNamespace(const NamespaceRecord& n);
  void DeleteNamespace(absl::string_view name);

  size_t size() const { return ops_.size(); }
  bool empty() const { return ops_.empty(); }

 private:
  friend class Store;
  struct Op {
    Table table;
    bool is_delete;
    std::string key;
    std::string value;
    bool seal = false;  // value is a secret's plain value: Write seals it
  };
  std::vector<Op> ops_;
};

class Store {
 public:
  // Opens (or creates) the database. Secrets still in the older plain format
  // are sealed here, and the secrets table compacted so that no live file
  // keeps their plain values. FailedPrecondition when options.secrets_key is
  // not the key this store's secrets are sealed with.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const Options& options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  absl::Status Write(const WriteBatch& batch,
                     Durability durability = Durability::kSynced);

  // Raw access by table and key. Scan returns (key, value) pairs in key order.
  absl::StatusOr<std::string> Get(Table table, absl::string_view key) const;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(
      Table table, absl::string_view prefix) const;

  absl::StatusOr<FunctionRecord> GetFunction(absl::string_view ns,
                                             absl::string_view name) const;
  // All functions of one namespace, or of every namespace when ns is empty.
  absl::StatusOr<std::vector<FunctionRecord>> ListFunctions(
      absl::string_view ns) const;

  // The secret with its value opened: for handing it to an invoker. A record
  // that does not authenticate (another key, altered on disk) is DataLoss.
  absl::StatusOr<SecretRecord> GetSecret(absl::string_view ns,
                                         absl::string_view name) const;
  // OK when the secret exists, NotFound when not; opens nothing (for checks
  // that need no value, and that must not fail on a record that does not
  // authenticate, so that it can still be replaced or deleted).
  absl::Status FindSecret(absl::string_view ns, absl::string_view name) const;
  // Names only: every value is left empty and nothing is decrypted.
  absl::StatusOr<std::vector<SecretRecord>> ListSecrets(
      absl::string_view ns) const;

  absl::StatusOr<NamespaceRecord> GetNamespace(absl::string_view name) const;
  absl::StatusOr<std::vector<NamespaceRecord>> ListNamespaces() const;

  const std::string& path() const;

 private:
  struct Impl;
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Key of a record that belongs to a namespace: the namespace, a NUL, then the
// name, so that a prefix scan over "ns\0" lists exactly one namespace.
std::string NamespacedKey(absl::string_view ns, absl::string_view name);

}  // namespace silt::store

#endif  // SILT_STORE_STORE_H_
