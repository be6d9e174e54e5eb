#include "storage/nvme_catalog.h"

#include <fmt/format.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <filesystem>
#include <system_error>

#include "storage/storage_log.h"

namespace tierkv::storage {
namespace {

constexpr char kFormatKey[] =
    "\x00"
    "format";
constexpr std::string_view kFormatMagic = "tierkv-nvme-catalog";
constexpr uint8_t kFormatVersion = 1;
constexpr char kNamespacePrefix = '\x01';
constexpr char kSegmentPrefix = '\x02';
constexpr size_t kSegmentKeyBytes = 1 + 4 + 8 + 8 + 2 + 1;
constexpr uint8_t kEntryVersion = 1;
constexpr size_t kEntryV1Bytes = 1 + 5 * 8;

std::string_view FormatKey() { return {kFormatKey, sizeof(kFormatKey) - 1}; }

std::string FormatValue() {
  std::string v(kFormatMagic);
  v.push_back(static_cast<char>(kFormatVersion));
  return v;
}

void PutBigEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i)
    out.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t GetBigEndian(std::string_view in, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v = (v << 8) | static_cast<uint8_t>(in[pos + i]);
  return v;
}
void PutLittleEndian64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t GetLittleEndian64(std::string_view in, size_t pos) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in[pos + i]);
  return v;
}

std::string SegmentDbKey(uint32_t ns_id, const SegmentKey& key) {
  std::string k;
  k.reserve(kSegmentKeyBytes);
  k.push_back(kSegmentPrefix);
  PutBigEndian(k, ns_id, 4);
  PutBigEndian(k, key.page.hi, 8);
  PutBigEndian(k, key.page.lo, 8);
  PutBigEndian(k, key.layer, 2);
  PutBigEndian(k, key.part, 1);
  return k;
}

bool ParseSegmentDbKey(std::string_view k, uint32_t* ns_id, SegmentKey* key) {
  if (k.size() != kSegmentKeyBytes || k[0] != kSegmentPrefix) return false;
  *ns_id = static_cast<uint32_t>(GetBigEndian(k, 1, 4));
  key->page.hi = GetBigEndian(k, 5, 8);
  key->page.lo = GetBigEndian(k, 13, 8);
  key->layer = static_cast<uint16_t>(GetBigEndian(k, 21, 2));
  key->part = static_cast<uint8_t>(GetBigEndian(k, 23, 1));
  return true;
}

// RocksDB status -> tierkv Status, keeping RocksDB's text.
Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::OK();
  const std::string msg = fmt::format("catalog {}: {}", what, s.ToString());
  if (s.IsCorruption()) return Status::Corruption(msg);
  if (s.IsNotFound()) return Status::NotFound(msg);
  if (s.IsInvalidArgument() &&
      s.ToString().find("does not exist") != std::string::npos) {
    return Status::NotFound(msg);
  }
  if (s.IsInvalidArgument() || s.IsNotSupported())
    return Status::Corruption(msg);
  return Status::IOError(msg);
}

Result<std::unique_ptr<rocksdb::DB>> OpenDb(const NvmeCatalogOptions& options) {
  rocksdb::Options db_options;
  db_options.create_if_missing = options.create_if_missing;
  db_options.paranoid_checks = true;
  db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  db_options.keep_log_file_num = 2;
  db_options.max_manifest_file_size = 64 << 20;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, options.path, &raw);
  if (!s.ok()) return FromRocks(s, fmt::format("open {}", options.path));
  std::unique_ptr<rocksdb::DB> db(raw);

  // A fresh database gets the format marker; an existing one must have ours.
  std::string marker;
  s = db->Get(rocksdb::ReadOptions(), FormatKey(), &marker);
  if (s.IsNotFound()) {
    std::unique_ptr<rocksdb::Iterator> it(
        db->NewIterator(rocksdb::ReadOptions()));
    it->SeekToFirst();
    if (it->Valid()) {
      return Status::Corruption(fmt::format(
          "catalog {}: database has data but no tierkv format marker",
          options.path));
    }
    TIERKV_RETURN_IF_ERROR(FromRocks(it->status(), "scan"));
    rocksdb::WriteOptions wo;
    wo.sync = true;
    s = db->Put(wo, FormatKey(), FormatValue());
    TIERKV_RETURN_IF_ERROR(FromRocks(s, "write format marker"));
  } else if (!s.ok()) {
    return FromRocks(s, "read format marker");
  } else if (marker != FormatValue()) {
    return Status::Corruption(fmt::format(
        "catalog {}: unsupported format marker (not a tierkv v{} catalog)",
        options.path, kFormatVersion));
  }
  return db;
}

}  // namespace

std::string EncodeCatalogEntry(const CatalogEntry& e) {
  std::string v;
  v.reserve(kEntryV1Bytes);
  v.push_back(static_cast<char>(kEntryVersion));
  PutLittleEndian64(v, e.offset);
  PutLittleEndian64(v, e.length);
  PutLittleEndian64(v, e.checksum);
  PutLittleEndian64(v, e.layout_fingerprint);
  PutLittleEndian64(v, e.generation);
  return v;
}

Result<CatalogEntry> DecodeCatalogEntry(std::string_view v) {
  if (v.empty()) return Status::Corruption("catalog entry: empty value");
  const auto version = static_cast<uint8_t>(v[0]);
  if (version != kEntryVersion) {
    return Status::Corruption(
        fmt::format("catalog entry: unsupported version {}", version));
  }
  if (v.size() < kEntryV1Bytes) {
    return Status::Corruption(fmt::format(
        "catalog entry: {} bytes, v1 needs {}", v.size(), kEntryV1Bytes));
  }
  CatalogEntry e;
  e.offset = GetLittleEndian64(v, 1);
  e.length = GetLittleEndian64(v, 9);
  e.checksum = GetLittleEndian64(v, 17);
  e.layout_fingerprint = GetLittleEndian64(v, 25);
  e.generation = GetLittleEndian64(v, 33);
  return e;
}

Status NvmeCatalogOptions::Validate() const {
  if (path.empty()) return Status::InvalidArgument("catalog: path is empty");
  return Status::OK();
}

// ---- Batch ----

NvmeCatalog::Batch::Batch() : batch_(std::make_unique<rocksdb::WriteBatch>()) {}
NvmeCatalog::Batch::~Batch() = default;
NvmeCatalog::Batch::Batch(Batch&&) noexcept = default;
NvmeCatalog::Batch& NvmeCatalog::Batch::operator=(Batch&&) noexcept = default;

void NvmeCatalog::Batch::Put(uint32_t ns_id, const SegmentKey& key,
                             const CatalogEntry& entry) {
  batch_->Put(SegmentDbKey(ns_id, key), EncodeCatalogEntry(entry))
      .PermitUncheckedError();
  ++count_;
}

void NvmeCatalog::Batch::Delete(uint32_t ns_id, const SegmentKey& key) {
  batch_->Delete(SegmentDbKey(ns_id, key)).PermitUncheckedError();
  ++count_;
}

void NvmeCatalog::Batch::Clear() {
  batch_->Clear();
  count_ = 0;
}

// ---- NvmeCatalog ----

NvmeCatalog::NvmeCatalog(const NvmeCatalogOptions& options,
                         std::unique_ptr<rocksdb::DB> db)
    : options_(options), db_(std::move(db)) {}

NvmeCatalog::~NvmeCatalog() {
  if (db_) db_->Close().PermitUncheckedError();
}

Result<std::unique_ptr<NvmeCatalog>> NvmeCatalog::Open(
    const NvmeCatalogOptions& options) {
  TIERKV_RETURN_IF_ERROR(options.Validate());
  auto db = OpenDb(options);
  Status recreate_reason;
  if (!db.ok() && options.recreate_if_damaged &&
      db.status().code() == StatusCode::kCorruption) {
    recreate_reason = db.status();
    StorageLog().warn("tierkv nvme catalog: {}; recreating an empty catalog",
                      recreate_reason.ToString());
    rocksdb::Status destroyed =
        rocksdb::DestroyDB(options.path, rocksdb::Options());
    if (!destroyed.ok()) {
      // DestroyDB needs a readable manifest; a wrecked directory goes whole.
      std::error_code ec;
      std::filesystem::remove_all(options.path, ec);
      if (ec) {
        return Status::IOError(fmt::format("catalog: cannot remove {}: {}",
                                           options.path, ec.message()));
      }
    }
    NvmeCatalogOptions fresh = options;
    fresh.create_if_missing = true;
    db = OpenDb(fresh);
  }
  if (!db.ok()) return db.status();
  std::unique_ptr<NvmeCatalog> catalog(
      new NvmeCatalog(options, std::move(db).value()));
  catalog->recreated_ = !recreate_reason.ok();
  catalog->recreate_reason_ = recreate_reason;
  TIERKV_RETURN_IF_ERROR(catalog->LoadNamespaces());
  return catalog;
}

Status NvmeCatalog::LoadNamespaces() {
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions()));
  const std::string prefix(1, kNamespacePrefix);
  MutexLock lock(&ns_mu_);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix);
       it->Next()) {
    const rocksdb::Slice value = it->value();
    if (value.size() != 4) {
      return Status::Corruption("catalog: malformed namespace record");
    }
    uint32_t id = 0;
    for (int i = 3; i >= 0; --i)
      id = (id << 8) | static_cast<uint8_t>(value[i]);
    std::string name = it->key().ToString().substr(1);
    namespaces_[name] = id;
    next_ns_id_ = std::max(next_ns_id_, id + 1);
  }
  return FromRocks(it->status(), "load namespaces");
}

Result<uint32_t> NvmeCatalog::GetOrCreateNamespace(std::string_view name) {
  if (name.empty())
    return Status::InvalidArgument("catalog: empty namespace name");
  {
    MutexLock lock(&ns_mu_);
    if (auto it = namespaces_.find(name); it != namespaces_.end())
      return it->second;
  }
  MutexLock write_lock(&write_mu_);
  MutexLock lock(&ns_mu_);
  if (auto it = namespaces_.find(name); it != namespaces_.end())
    return it->second;
  const uint32_t id = next_ns_id_;
  std::string value;
  for (int i = 0; i < 4; ++i) value.push_back(static_cast<char>(id >> (8 * i)));
  std::string key(1, kNamespacePrefix);
  key.append(name);
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  TIERKV_RETURN_IF_ERROR(
      FromRocks(db_->Put(wo, key, value), "create namespace"));
  namespaces_.emplace(std::string(name), id);
  ++next_ns_id_;
  return id;
}

Result<uint32_t> NvmeCatalog::FindNamespace(std::string_view name) const {
  MutexLock lock(&ns_mu_);
  if (auto it = namespaces_.find(name); it != namespaces_.end())
    return it->second;
  return Status::NotFound(fmt::format("catalog: unknown namespace '{}'", name));
}

std::map<std::string, uint32_t, std::less<>> NvmeCatalog::Namespaces() const {
  MutexLock lock(&ns_mu_);
  return namespaces_;
}

Status NvmeCatalog::SyncWal() {
  if (!options_.sync_writes) return Status::OK();
  Status s = FromRocks(db_->SyncWAL(), "sync WAL");
  if (!s.ok() && s.code() != StatusCode::kIOError) {
    return Status::IOError(s.message());
  }
  return s;
}

Status NvmeCatalog::Write(Batch& batch, bool sync) {
  if (batch.empty()) return Status::OK();
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes && sync;
  MutexLock write_lock(&write_mu_);
  Status s = FromRocks(db_->Write(wo, batch.batch_.get()), "write");
  // A failed write applied nothing; report every failure as IOError so the
  // caller treats it as a device problem (the database may be unusable).
  if (!s.ok() && s.code() != StatusCode::kIOError) {
    return Status::IOError(s.message());
  }
  return s;
}

Result<CatalogEntry> NvmeCatalog::Get(uint32_t ns_id,
                                      const SegmentKey& key) const {
  std::string value;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), SegmentDbKey(ns_id, key), &value);
  if (s.IsNotFound()) return Status::NotFound("catalog: no such segment");
  TIERKV_RETURN_IF_ERROR(FromRocks(s, "get"));
  return DecodeCatalogEntry(value);
}

Result<NvmeCatalog::ScanStats> NvmeCatalog::ForEach(const Visitor& visitor,
                                                    bool delete_malformed) {
  ScanStats stats;
  Batch garbage;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  const std::string prefix(1, kSegmentPrefix);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix);
       it->Next()) {
    uint32_t ns_id = 0;
    SegmentKey key;
    const std::string_view raw_key(it->key().data(), it->key().size());
    Result<CatalogEntry> entry =
        DecodeCatalogEntry({it->value().data(), it->value().size()});
    if (!ParseSegmentDbKey(raw_key, &ns_id, &key) || !entry.ok()) {
      ++stats.malformed;
      if (delete_malformed) {
        garbage.batch_->Delete(it->key()).PermitUncheckedError();
        ++garbage.count_;
      }
      continue;
    }
    ++stats.entries;
    visitor(ns_id, key, *entry);
  }
  TIERKV_RETURN_IF_ERROR(FromRocks(it->status(), "scan"));
  TIERKV_RETURN_IF_ERROR(Write(garbage));
  return stats;
}

Result<uint64_t> NvmeCatalog::CountEntries() {
  auto stats = ForEach([](uint32_t, const SegmentKey&, const CatalogEntry&) {});
  if (!stats.ok()) return stats.status();
  return stats->entries;
}

}  // namespace tierkv::storage
