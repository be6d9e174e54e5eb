// NvmeCatalog: the NVMe tier's RocksDB catalog of segment extents, its
// namespace ids and its read-only recovery (see nvme_catalog.h).
#include "storage/nvme/nvme_catalog.h"

#include <fmt/format.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <utility>

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
constexpr char kWeightsPrefix = '\x03';
constexpr uint8_t kWeightsRecordVersion = 1;
constexpr size_t kWeightsValueHeader = 1 + 8;
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

// RocksDB's info log, into tierkv's log instead of a LOG file in the
// catalog directory: on a full disk a failed LOG append makes the next log
// line (from any RocksDB thread) trip an assertion in Debian's build and
// abort the process, and one log is easier to read anyway. At most one line
// a second (RocksDB's free-space poller repeats itself while the disk is
// full); the lines dropped are counted in the next one.
class CatalogLogger : public rocksdb::Logger {
 public:
  CatalogLogger(std::string path, rocksdb::InfoLogLevel level)
      : rocksdb::Logger(level), path_(std::move(path)) {}

  using rocksdb::Logger::Logv;
  void Logv(const rocksdb::InfoLogLevel level, const char* format,
            va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    const auto now = std::chrono::steady_clock::now();
    uint64_t dropped = 0;
    {
      MutexLock lock(&mu_);
      if (now - last_ < std::chrono::seconds(1)) {
        ++dropped_;
        return;
      }
      last_ = now;
      dropped = std::exchange(dropped_, 0);
    }
    char line[1024];
    std::vsnprintf(line, sizeof(line), format, ap);
    std::string_view text(line);
    while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
    const auto spd_level =
        level >= rocksdb::InfoLogLevel::ERROR_LEVEL  ? spdlog::level::err
        : level == rocksdb::InfoLogLevel::WARN_LEVEL ? spdlog::level::warn
                                                     : spdlog::level::debug;
    StorageLog().log(spd_level, "rocksdb {}: {}{}", path_, text,
                     dropped > 0
                         ? fmt::format(" ({} earlier lines dropped)", dropped)
                         : std::string());
  }

 private:
  const std::string path_;
  Mutex mu_;
  std::chrono::steady_clock::time_point last_ GUARDED_BY(mu_);
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
};

// Opens for writing, or with `read_only` through DB::OpenForReadOnly (which
// writes nothing: no WAL, MANIFEST or format marker).
Result<std::unique_ptr<rocksdb::DB>> OpenDb(const NvmeCatalogOptions& options,
                                            bool read_only = false) {
  rocksdb::Options db_options;
  db_options.create_if_missing = options.create_if_missing;
  db_options.paranoid_checks = true;
  db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  db_options.info_log = std::make_shared<CatalogLogger>(
      options.path, rocksdb::InfoLogLevel::WARN_LEVEL);
  db_options.keep_log_file_num = 2;
  db_options.max_manifest_file_size = 64 << 20;
  if (options.create_if_missing && !read_only) {
    // Else RocksDB logs an error about the missing directory it creates.
    std::error_code ec;
    std::filesystem::create_directories(options.path, ec);
  }
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      read_only ? rocksdb::DB::OpenForReadOnly(db_options, options.path, &raw)
                : rocksdb::DB::Open(db_options, options.path, &raw);
  if (!s.ok()) return FromRocks(s, fmt::format("open {}", options.path));
  std::unique_ptr<rocksdb::DB> db(raw);

  // A fresh database gets the format marker; an existing one must have ours.
  std::string marker;
  s = db->Get(rocksdb::ReadOptions(), FormatKey(), &marker);
  if (s.IsNotFound() && read_only) {
    return Status::Corruption(
        fmt::format("catalog {}: no tierkv format marker", options.path));
  }
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
  Status read_only_reason;
  if (!db.ok() && db.status().code() == StatusCode::kIOError) {
    // Typically a full disk: RocksDB needs room for a new WAL and MANIFEST
    // to open for writing. Serve what the catalog holds.
    auto reader = OpenDb(options, /*read_only=*/true);
    if (reader.ok()) {
      read_only_reason = db.status();
      db = std::move(reader);
    }
  }
  if (!db.ok()) return db.status();
  std::unique_ptr<NvmeCatalog> catalog(
      new NvmeCatalog(options, std::move(db).value()));
  catalog->recreated_ = !recreate_reason.ok();
  catalog->recreate_reason_ = recreate_reason;
  MutexLock lock(&catalog->write_mu_);
  if (!read_only_reason.ok()) catalog->EnterReadOnly(read_only_reason);
  TIERKV_RETURN_IF_ERROR(catalog->LoadNamespaces());
  return catalog;
}

Status NvmeCatalog::ReopenLocked() {
  if (db_) db_->Close().PermitUncheckedError();  // reports the old error
  db_.reset();
  auto writer = OpenDb(options_);
  if (writer.ok()) {
    db_ = std::move(writer).value();
    return Status::OK();
  }
  auto reader = OpenDb(options_, /*read_only=*/true);
  if (reader.ok()) db_ = std::move(reader).value();
  return writer.status();
}

Status NvmeCatalog::LoadNamespaces() {
  if (!db_) return Status::IOError("catalog: database is closed");
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
  TIERKV_RETURN_IF_ERROR(CheckWritable());
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
  if (Status s = FromRocks(db_->Put(wo, key, value), "create namespace");
      !s.ok()) {
    EnterReadOnly(s);
    return s;
  }
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

Status NvmeCatalog::read_only_reason() const {
  MutexLock lock(&state_mu_);
  return read_only_reason_;
}

uint64_t NvmeCatalog::read_only_entries() const {
  MutexLock lock(&state_mu_);
  return read_only_entries_;
}

void NvmeCatalog::EnterReadOnly(const Status& failure) {
  // Every failure is an IOError to callers: a device problem, whatever
  // RocksDB called it.
  const Status reason = failure.code() == StatusCode::kIOError
                            ? failure
                            : Status::IOError(failure.message());
  MutexLock lock(&state_mu_);
  if (read_only_.load(std::memory_order_relaxed)) return;
  read_only_reason_ = reason;
  ++read_only_entries_;
  read_only_.store(true, std::memory_order_release);
  last_resume_ = std::chrono::steady_clock::now();
  StorageLog().error(
      "tierkv nvme catalog {}: read-only after: {}; segments stored so far "
      "stay readable, new ones are refused until it can be reopened for "
      "writing (tried as writes come, at most every {} ms)",
      options_.path, reason.ToString(), options_.resume_interval.count());
}

Status NvmeCatalog::CheckWritable() {
  if (!read_only_.load(std::memory_order_acquire)) return Status::OK();
  const auto now = std::chrono::steady_clock::now();
  if (now - last_resume_ >= options_.resume_interval) {
    last_resume_ = now;
    if (ReopenLocked().ok()) {
      MutexLock lock(&state_mu_);
      read_only_.store(false, std::memory_order_release);
      StorageLog().warn("tierkv nvme catalog {}: writable again after: {}",
                        options_.path, read_only_reason_.ToString());
      read_only_reason_ = Status::OK();
      return Status::OK();
    }
  }
  MutexLock lock(&state_mu_);
  return Status::IOError(fmt::format("catalog is read-only after: {}",
                                     read_only_reason_.message()));
}

Status NvmeCatalog::TryWritable() {
  if (!read_only()) return Status::OK();
  MutexLock write_lock(&write_mu_);
  return CheckWritable();
}

Status NvmeCatalog::SyncWal() {
  if (!options_.sync_writes) return Status::OK();
  // Under write_mu_, so no write can fail between the check and the sync.
  MutexLock write_lock(&write_mu_);
  TIERKV_RETURN_IF_ERROR(CheckWritable());
  Status s = FromRocks(db_->SyncWAL(), "sync WAL");
  if (!s.ok()) EnterReadOnly(s);
  return s.ok() ? s : read_only_reason();
}

Status NvmeCatalog::Write(Batch& batch, bool sync) {
  if (batch.empty()) return Status::OK();
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes && sync;
  MutexLock write_lock(&write_mu_);
  TIERKV_RETURN_IF_ERROR(CheckWritable());
  Status s = FromRocks(db_->Write(wo, batch.batch_.get()), "write");
  // A failed write applied nothing, and RocksDB must not be written again.
  if (!s.ok()) EnterReadOnly(s);
  return s.ok() ? s : read_only_reason();
}

Result<CatalogEntry> NvmeCatalog::Get(uint32_t ns_id,
                                      const SegmentKey& key) const {
  MutexLock lock(&write_mu_);
  if (!db_) return Status::IOError("catalog: database is closed");
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
  {
    MutexLock lock(&write_mu_);
    if (!db_) return Status::IOError("catalog: database is closed");
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
  }
  // Read-only: the malformed entries stay, skipped again next time.
  if (!read_only()) TIERKV_RETURN_IF_ERROR(Write(garbage));
  return stats;
}

namespace {

std::string WeightsNsPrefix(uint32_t ns_id) {
  std::string k(1, kWeightsPrefix);
  PutBigEndian(k, ns_id, 4);
  return k;
}

std::string WeightsDbKey(uint32_t ns_id, std::string_view model,
                         std::string_view layout, const PageHash& version) {
  std::string k = WeightsNsPrefix(ns_id);
  k.append(model);
  k.push_back('\0');
  k.append(layout);
  k.push_back('\0');
  PutBigEndian(k, version.hi, 8);
  PutBigEndian(k, version.lo, 8);
  return k;
}

// Fills `r` from a weights key and value; false when either is malformed.
bool ParseWeightsRecord(std::string_view k, std::string_view v,
                        NvmeCatalog::WeightsRecord* r) {
  if (k.size() < 5 + 2 + 16 || k[0] != kWeightsPrefix) return false;
  r->ns_id = static_cast<uint32_t>(GetBigEndian(k, 1, 4));
  const std::string_view names = k.substr(5, k.size() - 5 - 16);
  const size_t model_end = names.find('\0');
  if (model_end == std::string_view::npos || names.back() != '\0') {
    return false;
  }
  r->model = std::string(names.substr(0, model_end));
  r->layout =
      std::string(names.substr(model_end + 1, names.size() - model_end - 2));
  if (r->layout.find('\0') != std::string::npos) return false;
  r->version.hi = GetBigEndian(k, k.size() - 16, 8);
  r->version.lo = GetBigEndian(k, k.size() - 8, 8);
  if (v.size() < kWeightsValueHeader ||
      static_cast<uint8_t>(v[0]) != kWeightsRecordVersion) {
    return false;
  }
  r->sealed_unix_ms = GetLittleEndian64(v, 1);
  r->manifest = std::string(v.substr(kWeightsValueHeader));
  return true;
}

}  // namespace

Status NvmeCatalog::PutWeights(const WeightsRecord& r) {
  if (r.model.find('\0') != std::string::npos ||
      r.layout.find('\0') != std::string::npos) {
    return Status::InvalidArgument(
        "catalog: a weights model or layout holds a 0 byte");
  }
  std::string value;
  value.reserve(kWeightsValueHeader + r.manifest.size());
  value.push_back(static_cast<char>(kWeightsRecordVersion));
  PutLittleEndian64(value, r.sealed_unix_ms);
  value.append(r.manifest);
  Batch batch;
  batch.batch_->Put(WeightsDbKey(r.ns_id, r.model, r.layout, r.version), value)
      .PermitUncheckedError();
  batch.count_ = 1;
  return Write(batch);
}

Status NvmeCatalog::DeleteWeights(uint32_t ns_id, std::string_view model,
                                  std::string_view layout,
                                  const PageHash& version) {
  Batch batch;
  batch.batch_->Delete(WeightsDbKey(ns_id, model, layout, version))
      .PermitUncheckedError();
  batch.count_ = 1;
  return Write(batch);
}

Result<NvmeCatalog::ScanStats> NvmeCatalog::ForEachWeights(
    uint32_t ns_id, const WeightsVisitor& visitor) const {
  ScanStats stats;
  MutexLock lock(&write_mu_);
  if (!db_) return Status::IOError("catalog: database is closed");
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  const std::string prefix = WeightsNsPrefix(ns_id);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix);
       it->Next()) {
    WeightsRecord record;
    if (!ParseWeightsRecord({it->key().data(), it->key().size()},
                            {it->value().data(), it->value().size()},
                            &record)) {
      ++stats.malformed;
      continue;
    }
    ++stats.entries;
    visitor(record);
  }
  TIERKV_RETURN_IF_ERROR(FromRocks(it->status(), "scan weights"));
  return stats;
}

Result<uint64_t> NvmeCatalog::CountEntries() {
  auto stats = ForEach([](uint32_t, const SegmentKey&, const CatalogEntry&) {});
  if (!stats.ok()) return stats.status();
  return stats->entries;
}

}  // namespace tierkv::storage
