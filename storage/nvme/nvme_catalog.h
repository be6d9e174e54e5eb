// NvmeCatalog: the persistent record of which segments live where on the
// NVMe data file (DESIGN.md §6). It is the only truth of what is on disk:
// NvmeStore writes a segment's bytes first and its catalog entry second, and
// rebuilds its allocator and index from this catalog at open.
//
// Storage: RocksDB (WAL on). Fixed-width binary keys
//   segment:   0x02 | ns_id u32 BE | page.hi u64 BE | page.lo u64 BE |
//              layer u16 BE | part u8                        (24 bytes)
//   namespace: 0x01 | name bytes  -> ns_id u32 LE
//   weights:   0x03 | ns_id u32 BE | model | 0x00 | layout | 0x00 |
//              version.hi u64 BE | version.lo u64 BE
//              -> u8 format (1) | sealed_unix_ms u64 LE | manifest bytes
//              (a sealed weights shard, storage/weights/; model and
//              layout never hold a 0 byte)
//   format:    0x00 "format"      -> "tierkv-nvme-catalog" + u8 version
// so one namespace's segments form one contiguous key range (a prefix), and
// namespaces map to compact ids assigned on first use.
// Values are versioned (see EncodeCatalogEntry).
//
// Errors: a damaged or foreign database yields Corruption, an unreadable one
// IOError, a missing one (create_if_missing = false) NotFound; nothing
// crashes. With recreate_if_damaged the catalog is wiped and recreated
// instead, and recreated() says so (the caller then treats the NVMe tier as
// empty).
//
// Read-only mode (a full disk, a failing device): the first write or WAL
// sync that fails latches the catalog read-only. Later writes fail at once
// with IOError naming that first error and never reach RocksDB, whose WAL
// writer must not be used again after an error (Debian's build asserts in
// WritableFileWriter::AssertFalseAndGetStatusForPrevError and aborts the
// process). Reads keep working, so every acknowledged segment stays
// readable. A write at least resume_interval after the last attempt closes
// and reopens the database (a new WAL; RocksDB 7.8's DB::Resume cannot
// recover from a failed WAL append); once there is space again that
// succeeds and the catalog is writable. When Open cannot open the database
// for writing (IOError: no space for a new WAL or MANIFEST) it opens it
// read-only (DB::OpenForReadOnly), so a daemon restarted on a full disk
// serves what its catalog holds, and becomes writable the same way.
//
// Thread safety: all methods may be called concurrently (RocksDB is
// thread-safe; the namespace table has its own lock).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace tierkv::storage {

// Where one segment's bytes are on the data file, and how to verify them.
struct CatalogEntry {
  uint64_t offset = 0;              // bytes from the start of the data file
  uint64_t length = 0;              // the segment's exact size in bytes
  uint64_t checksum = 0;            // XXH3-64 of those `length` bytes
  uint64_t layout_fingerprint = 0;  // LayoutSpec::Fingerprint() at write time
  uint64_t generation = 0;          // store-wide write counter, newer = larger
  friend bool operator==(const CatalogEntry&, const CatalogEntry&) = default;
};

// Value encoding, version 1: u8 version (=1), then offset, length, checksum,
// layout_fingerprint, generation as u64 little-endian (41 bytes). Decoders
// accept trailing bytes (fields appended by later versions of v1) and reject
// unknown versions and short values with Corruption.
std::string EncodeCatalogEntry(const CatalogEntry& entry);
Result<CatalogEntry> DecodeCatalogEntry(std::string_view value);

struct NvmeCatalogOptions {
  // RocksDB directory. Required.
  std::string path;
  // fsync the WAL on every Write (durable on return). Default: true.
  bool sync_writes = true;
  // Create an empty catalog when `path` holds none. Default: true.
  bool create_if_missing = true;
  // Wipe and recreate a catalog that fails to open as damaged (Corruption)
  // or foreign. Default: false (report the error; the daemon decides).
  bool recreate_if_damaged = false;
  // How often a read-only catalog (see above) tries to reopen for writing,
  // at most, when written to. Default: 10 s.
  std::chrono::milliseconds resume_interval{10000};

  Status Validate() const;
};

class NvmeCatalog {
 public:
  // A group of puts and deletes applied atomically by Write().
  class Batch {
   public:
    Batch();
    ~Batch();
    Batch(Batch&&) noexcept;
    Batch& operator=(Batch&&) noexcept;
    void Put(uint32_t ns_id, const SegmentKey& key, const CatalogEntry& entry);
    void Delete(uint32_t ns_id, const SegmentKey& key);
    size_t count() const { return count_; }
    bool empty() const { return count_ == 0; }
    void Clear();

   private:
    friend class NvmeCatalog;
    std::unique_ptr<rocksdb::WriteBatch> batch_;
    size_t count_ = 0;
  };

  // A sealed weights shard's record (see the key layout above).
  struct WeightsRecord {
    uint32_t ns_id = 0;
    std::string model;
    std::string layout;
    PageHash version;
    uint64_t sealed_unix_ms = 0;
    std::string manifest;  // EncodeWeightsManifest's bytes, as stored
  };
  using WeightsVisitor = std::function<void(const WeightsRecord& record)>;

  struct ScanStats {
    uint64_t entries = 0;    // well-formed entries passed to the visitor
    uint64_t malformed = 0;  // keys or values that failed to decode
  };
  using Visitor = std::function<void(uint32_t ns_id, const SegmentKey& key,
                                     const CatalogEntry& entry)>;

  // Opens or creates the catalog. Errors as described above.
  static Result<std::unique_ptr<NvmeCatalog>> Open(
      const NvmeCatalogOptions& options);
  ~NvmeCatalog();
  NvmeCatalog(const NvmeCatalog&) = delete;
  NvmeCatalog& operator=(const NvmeCatalog&) = delete;

  // True when Open found a damaged catalog and recreated it (entries lost);
  // recreate_reason() is the error that triggered it.
  bool recreated() const { return recreated_; }
  Status recreate_reason() const { return recreate_reason_; }

  // Whether writes are refused (see read-only mode above), and why: the
  // error that latched it. OK while writable.
  bool read_only() const { return read_only_.load(std::memory_order_acquire); }
  Status read_only_reason() const EXCLUDES(state_mu_);
  // Times the catalog became read-only (0 or 1 unless it recovered).
  uint64_t read_only_entries() const EXCLUDES(state_mu_);
  // OK when a write may proceed now: writable, or read-only and a due
  // reopen succeeded. Else the IOError a write would get. For callers
  // that would do expensive work (device IO) before writing the catalog.
  Status TryWritable() EXCLUDES(write_mu_, state_mu_);

  // The id of namespace `name`, assigning and persisting a new one on first
  // use. InvalidArgument for an empty name; IOError when persisting fails.
  Result<uint32_t> GetOrCreateNamespace(std::string_view name)
      EXCLUDES(write_mu_, ns_mu_);
  // NotFound when `name` was never assigned an id.
  Result<uint32_t> FindNamespace(std::string_view name) const;
  // Every known namespace: name -> id.
  std::map<std::string, uint32_t, std::less<>> Namespaces() const;

  // Applies `batch` atomically (WAL, synced when options.sync_writes and
  // `sync`). Unsynced, it survives a process crash (the WAL is written to
  // the file system before return) but not a power loss until SyncWal().
  // IOError on failure, in which case nothing of the batch is applied.
  Status Write(Batch& batch, bool sync = true) EXCLUDES(write_mu_);
  // Makes every Write so far durable (fsyncs the WAL), when
  // options.sync_writes; else a no-op.
  Status SyncWal() EXCLUDES(write_mu_);

  // NotFound when absent; Corruption when the stored value is malformed.
  Result<CatalogEntry> Get(uint32_t ns_id, const SegmentKey& key) const;

  // Calls `visitor` for every segment entry, in key order (namespace by
  // namespace). Malformed entries are skipped and counted (and deleted when
  // `delete_malformed`). IOError / Corruption when iteration itself fails.
  Result<ScanStats> ForEach(const Visitor& visitor,
                            bool delete_malformed = false);

  // Number of segment entries (a full scan; for tests and tools).
  Result<uint64_t> CountEntries();

  // Stores (replacing) one weights record, synced like Write. IOError on
  // failure (nothing stored); InvalidArgument for a model or layout
  // holding a 0 byte.
  Status PutWeights(const WeightsRecord& record) EXCLUDES(write_mu_);
  // Deletes one weights record (absent: OK), synced like Write.
  Status DeleteWeights(uint32_t ns_id, std::string_view model,
                       std::string_view layout, const PageHash& version)
      EXCLUDES(write_mu_);
  // Calls `visitor` for every weights record of namespace `ns_id`, in key
  // order. Malformed records are skipped and counted (never deleted: a
  // later version may read them). IOError / Corruption when iteration
  // itself fails.
  Result<ScanStats> ForEachWeights(uint32_t ns_id,
                                   const WeightsVisitor& visitor) const
      EXCLUDES(write_mu_);

 private:
  NvmeCatalog(const NvmeCatalogOptions& options,
              std::unique_ptr<rocksdb::DB> db);
  Status LoadNamespaces() REQUIRES(write_mu_) EXCLUDES(ns_mu_);
  // Closes and reopens the database for writing (RocksDB 7.8 cannot Resume
  // after a failed WAL append: its WAL writer stays failed). If that fails
  // (still no space), reopens it read-only so reads keep working.
  Status ReopenLocked() REQUIRES(write_mu_);
  // OK when writes may proceed: writable, or read-only and a due reopen
  // succeeded. Else the IOError to return.
  Status CheckWritable() REQUIRES(write_mu_) EXCLUDES(state_mu_);
  // Latches read-only mode after `failure` (logged once per entry).
  void EnterReadOnly(const Status& failure) REQUIRES(write_mu_)
      EXCLUDES(state_mu_);

  const NvmeCatalogOptions options_;
  bool recreated_ = false;
  Status recreate_reason_;

  // Serializes every write to RocksDB, and guards db_, which a read-only
  // catalog replaces when it reopens the database. RocksDB would
  // group-commit concurrent writers, with one thread copying another's
  // batch; NvmeStore already batches per call, and that cross-thread
  // hand-off happens inside the uninstrumented system librocksdb, where
  // ThreadSanitizer reports it as a race. Reads (Get, ForEach) are rare
  // (start-up, tests) and take it too. Taken before ns_mu_ when both are
  // needed.
  mutable Mutex write_mu_ ACQUIRED_BEFORE(ns_mu_);
  // Null only if a reopen failed both ways (every call is then IOError).
  std::unique_ptr<rocksdb::DB> db_ GUARDED_BY(write_mu_);
  mutable Mutex ns_mu_;  // guards the namespace table
  // True from the first failed write until a reopen succeeds; changed
  // under write_mu_ and state_mu_, read without either.
  std::atomic<bool> read_only_{false};
  mutable Mutex state_mu_ ACQUIRED_AFTER(write_mu_);
  Status read_only_reason_ GUARDED_BY(state_mu_);
  uint64_t read_only_entries_ GUARDED_BY(state_mu_) = 0;
  std::chrono::steady_clock::time_point last_resume_ GUARDED_BY(write_mu_);
  std::map<std::string, uint32_t, std::less<>> namespaces_ GUARDED_BY(ns_mu_);
  uint32_t next_ns_id_ GUARDED_BY(ns_mu_) = 1;
};

}  // namespace tierkv::storage
