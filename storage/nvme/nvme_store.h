// NvmeStore: the NVMe tier (T2) — segments of every namespace in one data
// file (or raw block device), located by the NvmeCatalog (DESIGN.md §4, §6).
//
// Layout and policy:
//   * Space is handed out by an ExtentAllocator in block_size (4 KiB) units;
//     a segment of any size occupies RoundUp(size) bytes.
//   * The tier has its own capacity, cut into shares: a namespace given a
//     quota (SetNamespaceQuota) has a share of that many bytes to itself;
//     every other namespace uses the shared rest. Each share orders its
//     segments with its own EvictionPolicy (kPolicy: `lru`), and a write
//     that does not fit evicts the policy's victims of its own share only:
//     one tenant cannot evict another's reserved KV. Without quotas this is
//     one order over the whole tier. Segments being read are unlinked from
//     the policy, so never evicted (or reused) while the read runs.
//   * Equal (namespace, key) means equal bytes (content-addressed prefix
//     hashes), so writing a key that is already stored with the same layout
//     and size returns AlreadyExists and copies nothing.
//
// Crash safety (DESIGN.md §6): a write goes (1) data to the device (flushed
// when sync_data), then (2) its catalog entry (WAL, synced when
// sync_catalog), and only then (3) is it acknowledged and visible to reads.
// A Durability::kDeferred write skips both syncs: it survives a process
// crash (O_DIRECT data is on the device, the WAL record in the file system)
// but may be lost to a power loss until the next Sync() or durable Write,
// after which a lost one is a miss (absent or failing its checksum), never
// wrong bytes. Background demotion uses it and syncs on a timer (group
// commit); an explicit Flush is durable on return.
// Extents of evicted or removed segments may be reused only after their
// catalog deletes are durable, so the catalog never points at bytes of a
// different segment; every read still verifies the XXH3-64 checksum, and a
// mismatch is a miss (NotFound) plus a checksum_failures count — never bad
// bytes. A failed write (IOError, including ENOSPC) leaves every segment
// stored before it readable.
//
// Thread safety: all methods may be called concurrently. One mutex guards
// the index, the policies and the allocator; device IO and catalog writes run
// outside it. A Read racing an eviction, Remove or overwrite of the same key
// returns either the complete old bytes or a miss, never a mix.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/alloc/extent_allocator.h"
#include "storage/nvme/device.h"
#include "storage/nvme/nvme_catalog.h"
#include "storage/nvme/staging_pool.h"
#include "storage/policy/eviction_policy.h"
#include "storage/policy/eviction_policy_kind.h"
#include "storage/tier/tier.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::storage {

struct NvmeStoreOptions {
  // Data file or block device. Required unless `device` is set.
  std::string path;
  // RocksDB catalog directory. Default (empty): path + ".catalog".
  std::string catalog_path;
  // Bytes of the data file the tier may use; a multiple of block_size. A
  // regular file is created/preallocated to this size. Required.
  uint64_t capacity_bytes = 0;
  // io_uring queue depth per thread, 1..4096. Default: 64.
  uint32_t queue_depth = 64;
  // O_DIRECT on the data file (falls back to buffered IO where the file
  // system refuses it; see Stats().direct_io). Default: true.
  bool use_direct_io = true;
  // Use pread/pwrite instead of io_uring. Default: false.
  bool force_sync_io = false;
  // Sync the catalog WAL on every write batch. Default: true.
  bool sync_catalog = true;
  // fdatasync the data file before writing catalog entries, so an
  // acknowledged segment survives power loss, not just a process crash.
  // Default: true.
  bool sync_data = true;
  // Create an empty catalog when none exists. Default: true.
  bool create_catalog_if_missing = true;
  // Recreate (empty) a damaged catalog instead of failing Open with
  // Corruption; the data file is then treated as empty. Default: false.
  bool recreate_damaged_catalog = false;
  // How often a catalog made read-only by a write error (a full disk)
  // retries recovery, at most (NvmeCatalogOptions::resume_interval).
  // Default: 10 s.
  std::chrono::milliseconds catalog_resume_interval{10000};
  // Largest accepted segment in bytes. Default: 1 GiB (LayoutSpec's limit).
  uint64_t max_segment_bytes = uint64_t{1} << 30;
  // Most bounce-buffer bytes one ReadBatch call holds at a time. Items whose
  // destination is block-aligned and at least the rounded segment size are
  // read in place and need none; the others are staged, and a batch whose
  // staging would exceed this is read in several rounds (each still keeps
  // up to queue_depth IOs in flight). A single segment may exceed it.
  // Default: 64 MiB.
  uint64_t read_batch_bounce_bytes = uint64_t{64} << 20;
  // IO alignment (O_DIRECT); a power of two >= 512. Default: 4096.
  uint32_t block_size = 4096;
  // Device to use instead of opening `path` (tests: tests/testing/'s
  // MemoryDevice, FaultInjectionDevice). Its size must be >= capacity_bytes and
  // its block size equal to block_size. Default: null.
  std::shared_ptr<Device> device;

  // InvalidArgument naming the first bad field.
  Status Validate() const;
};

// One segment to store (Tier's item, so NvmeTier hands batches through
// as they are): `data` is borrowed for the duration of Write().
using NvmeWriteItem = TierWriteItem;

// One segment to read: up to dst.size() bytes land at the front of `dst`,
// which is borrowed for the duration of ReadBatch(). A block-aligned `dst`
// at least as large as the segment rounded up to block_size is read into
// directly (no bounce copy); bytes past the segment's length may then be
// overwritten with padding.
using NvmeReadItem = TierReadItem;

// What Open() found in the catalog.
struct NvmeRecoveryReport {
  uint64_t recovered_segments = 0;
  uint64_t recovered_bytes = 0;    // sum of segment lengths
  uint64_t dropped_segments = 0;   // overlapping / out-of-range entries
  uint64_t malformed_entries = 0;  // undecodable catalog records
  bool catalog_recreated = false;  // the catalog was damaged and wiped
};

// One namespace's part of the tier.
struct NvmeNamespaceStats {
  uint64_t quota_bytes = 0;  // its share; 0 = it uses the shared rest
  uint64_t segments = 0;
  uint64_t bytes_used = 0;       // sum of segment lengths
  uint64_t bytes_allocated = 0;  // sum of rounded extents
  uint64_t evictions = 0;        // its segments evicted for space
};

struct NvmeStoreStats {
  uint64_t namespaces = 0;  // names the catalog has assigned an id
  uint64_t segments = 0;
  uint64_t bytes_used = 0;       // sum of segment lengths
  uint64_t bytes_allocated = 0;  // sum of rounded extents
  uint64_t capacity_bytes = 0;
  double fragmentation = 0;  // 1 - largest free extent / free bytes
  uint64_t evictions = 0;
  uint64_t removals = 0;
  uint64_t checksum_failures = 0;
  // Checksum failures whose immediate re-read of the extent verified: the
  // device held the acknowledged bytes and the first read returned others
  // (a read-path problem, not lost data). Each is still a miss and dropped.
  uint64_t checksum_reread_ok = 0;
  uint64_t reads = 0;  // items read (Read or ReadBatch)
  uint64_t read_hits = 0;
  uint64_t read_misses = 0;   // absent, layout mismatch or corrupt
  uint64_t read_errors = 0;   // device errors
  uint64_t writes = 0;        // items stored (acknowledged)
  uint64_t write_dedup = 0;   // items answered AlreadyExists
  uint64_t write_errors = 0;  // items that failed (any code)
  // Items staged through a bounce buffer (an unaligned or unpadded source
  // or destination) rather than moved in place.
  uint64_t bounced_writes = 0;
  uint64_t bounced_reads = 0;
  uint64_t pending_catalog_deletes = 0;
  // The catalog refuses writes (a full disk or failing device: see
  // NvmeCatalog); every stored segment stays readable.
  bool read_only = false;
  uint64_t read_only_entries = 0;  // times it became read-only
  NvmeRecoveryReport recovery;
  bool direct_io = false;  // O_DIRECT in effect (false: buffered)
  bool io_uring = false;   // io_uring in effect (false: pread/pwrite)
  DeviceStats device;
};

class NvmeStore {
 public:
  // Every share's eviction order.
  static constexpr EvictionPolicyKind kPolicy = EvictionPolicyKind::kLru;

  // Validates `options`, opens the device and the catalog and rebuilds the
  // allocator, index and eviction order from the catalog (newest generation
  // first; entries that overlap a newer one or lie outside the capacity are
  // dropped, deleted from the catalog and counted, never fatal).
  // Errors: InvalidArgument (options), IOError (device / catalog IO),
  // Corruption (damaged catalog, unless recreate_damaged_catalog), NotFound
  // (no catalog and create_catalog_if_missing = false).
  static Result<std::unique_ptr<NvmeStore>> Open(
      const NvmeStoreOptions& options);
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Registers namespace `ns` in the catalog now (one synced catalog write
  // the first time a name is seen; nothing afterwards). Write does it on
  // first use otherwise, and on a virtual disk that sync took 1.5 s in the
  // middle of a demotion flood, so owners call this when they open a
  // namespace. IOError when the catalog cannot be written.
  Status OpenNamespace(std::string_view ns);

  // Stores a batch of segments of namespace `ns` written with layout
  // `layout_fingerprint`. Returns one Status per item, in order:
  //   OK                stored durably (see crash safety above);
  //   AlreadyExists     the same key, layout and size is stored (dedup);
  //   Busy              another write of the same key is in flight (also
  //                     for a key repeated within one batch);
  //   InvalidArgument   empty or oversized data;
  //   ResourceExhausted no room even after evicting every unpinned segment;
  //   IOError           device or catalog failure (ENOSPC included); the
  //                     item is not stored, nothing stored before is lost.
  // A key stored with a different layout or size is replaced. Items whose
  // data is block-aligned in address and length are written to the device
  // straight from `data`; the others are staged in a bounce buffer.
  // kDeferred: see crash safety above; OK then means stored and readable.
  std::vector<Status> Write(std::string_view ns, uint64_t layout_fingerprint,
                            std::span<const NvmeWriteItem> items,
                            Durability durability = Durability::kDurable);

  // Makes every write acknowledged so far durable: one device flush and one
  // WAL sync, or nothing when no deferred write is pending. IOError when
  // the device or catalog fails (the writes stay readable, not durable).
  Status Sync() EXCLUDES(sync_mu_, mu_);
  // Deferred writes acknowledged and not yet covered by a sync.
  bool HasUnsyncedWrites() const EXCLUDES(mu_);

  // Reads a batch of segments of namespace `ns` stored with layout
  // `layout_fingerprint`, keeping up to queue_depth device IOs in flight
  // (one io_uring submission stream on the calling thread). Returns one
  // result per item, in order: the segment's length, copied to the front of
  // item.dst, or
  //   NotFound          absent, stored with another layout fingerprint, or
  //                     its XXH3-64 checksum failed (the entry is then
  //                     dropped and counted in checksum_failures);
  //   InvalidArgument   item.dst is smaller than the segment;
  //   ResourceExhausted no memory for a bounce buffer;
  //   IOError           the device failed (the segment stays stored).
  // Each segment is pinned while it is read, so eviction, Remove or a
  // replacing Write cannot reuse its extent mid-read: a hit is always the
  // complete bytes that were acknowledged for that key. On an error the
  // content of item.dst is unspecified but never holds bytes of a wrong
  // segment that look valid. A key may appear more than once.
  // REQUIRES: the items' dst ranges do not overlap one another.
  std::vector<Result<uint64_t>> ReadBatch(std::string_view ns,
                                          uint64_t layout_fingerprint,
                                          std::span<const NvmeReadItem> items);

  // ReadBatch of one item: copies segment `key` of `ns` into the front of
  // `dst` and returns its length, with the same errors and guarantees.
  Result<uint64_t> Read(std::string_view ns, const SegmentKey& key,
                        uint64_t layout_fingerprint, std::span<std::byte> dst);

  // The stored segment's length, or nullopt when absent / other layout.
  // Does not touch the LRU.
  std::optional<uint64_t> Lookup(std::string_view ns, const SegmentKey& key,
                                 uint64_t layout_fingerprint) const;
  bool Contains(std::string_view ns, const SegmentKey& key,
                uint64_t layout_fingerprint) const {
    return Lookup(ns, key, layout_fingerprint).has_value();
  }
  // Lookup of a batch under one lock: each key's length, 0 when absent or
  // stored with another layout.
  std::vector<uint64_t> LookupBatch(std::string_view ns,
                                    uint64_t layout_fingerprint,
                                    std::span<const SegmentKey> keys) const
      EXCLUDES(mu_);

  // Drops the segment. NotFound when absent; IOError when the catalog delete
  // cannot be made durable (the segment is gone from this process either
  // way; the delete is retried before its space is reused).
  Status Remove(std::string_view ns, const SegmentKey& key);

  // Reserves `bytes` (a positive multiple of block_size) of the tier for
  // namespace `ns`: its segments are evicted only to make room for its own
  // writes, and it never holds more. The namespaces without a quota share
  // what the quotas leave. Segments over a new limit are evicted at once
  // (least recently used first). Meant for start-up, before writes: a
  // quota can be changed but not removed while the store is open.
  // InvalidArgument when the quotas would exceed capacity_bytes or `bytes`
  // is not a positive multiple of block_size; IOError when a new namespace
  // cannot be registered in the catalog (a read-only catalog). `policy`
  // orders the share's evictions (fixed by the first call; kWeights for a
  // weights namespace, fed by SetNamespaceSchedule).
  Status SetNamespaceQuota(std::string_view ns, uint64_t bytes,
                           EvictionPolicyKind policy = kPolicy) EXCLUDES(mu_);
  // Hands a weights catalog's chunk standings to namespace `ns`'s share
  // (EvictionPolicy::SetSchedule) and re-ranks its stored segments at
  // once. No effect without a quota for `ns` (the shared rest keeps one
  // order for every namespace) or when its share's policy is not kWeights.
  void SetNamespaceSchedule(std::string_view ns, ScheduleTable table)
      EXCLUDES(mu_);

  NvmeStoreStats Stats() const;
  // The catalog refuses writes (NvmeStoreStats::read_only).
  bool read_only() const { return catalog_->read_only(); }
  // The store's catalog, for records that live beside its segments' (the
  // weights catalog's sealed manifests); never null.
  NvmeCatalog& catalog() const { return *catalog_; }
  // Every namespace that has segments or a quota, by name.
  std::map<std::string, NvmeNamespaceStats, std::less<>> NamespaceStats() const
      EXCLUDES(mu_);
  // Test hook: the catalog entry of a stored segment (to corrupt its bytes).
  std::optional<CatalogEntry> TEST_Entry(std::string_view ns,
                                         const SegmentKey& key) const;
  const NvmeRecoveryReport& recovery() const { return recovery_; }
  Device& device() { return *device_; }

 private:
  struct FullKey {
    uint32_t ns_id = 0;
    SegmentKey key;
    friend bool operator==(const FullKey&, const FullKey&) = default;
  };
  struct FullKeyHash {
    size_t operator()(const FullKey& k) const noexcept {
      return std::hash<SegmentKey>()(k.key) ^
             (size_t{k.ns_id} * 0x9E3779B97F4A7C15ull);
    }
  };
  // One stored segment. Owned by index_ while live; readers hold a
  // shared_ptr so a segment unlinked mid-read keeps its extent reserved
  // until the last reader leaves. `key`, `entry` and `extent` are immutable
  // once the segment is published in index_.
  //
  // `readers`, `live`, `share` and `policy` are guarded by NvmeStore::mu_
  // but carry no GUARDED_BY: an annotation in a nested struct cannot name
  // the enclosing object's mutex (Clang resolves `mu_` against the
  // Segment). They are touched only in REQUIRES(mu_) helpers and under
  // MutexLock(&mu_).
  struct Segment;
  // A segment's state in its share's policy, and the way back from the
  // PolicyState a policy hands out (Victim) to the segment.
  struct SegmentPolicyState : PolicyState {
    Segment* segment = nullptr;
  };
  struct Share;
  struct Segment {
    FullKey key;
    CatalogEntry entry;
    Extent extent;
    uint32_t readers = 0;    // guarded by NvmeStore::mu_
    bool live = true;        // guarded by NvmeStore::mu_; false once unlinked
    Share* share = nullptr;  // NvmeStore::mu_; while live
    // Linked into share->policy while live and unread (evictable).
    SegmentPolicyState policy;
  };
  // Space that writes of some namespaces may fill and evict from: a quota
  // namespace's own, or the shared rest (guarded by NvmeStore::mu_, as
  // Segment's fields). Declared after index_ in the store, so a share's
  // policy (and its hooks into segments) goes first.
  struct Share {
    uint64_t limit = 0;      // bytes of rounded extents
    uint64_t allocated = 0;  // live segments' and in-flight writes' extents
    std::unique_ptr<EvictionPolicy> policy = NewEvictionPolicy(kPolicy);
  };
  // Per-namespace counters for NamespaceStats (guarded by mu_).
  struct NamespaceUsage {
    uint64_t segments = 0, bytes_used = 0, bytes_allocated = 0;
    uint64_t evictions = 0;
  };

  NvmeStore(const NvmeStoreOptions& options, std::shared_ptr<Device> device,
            std::unique_ptr<NvmeCatalog> catalog);
  Status Recover() EXCLUDES(mu_);
  // The share namespace `ns_id` writes into.
  Share& ShareOfLocked(uint32_t ns_id) REQUIRES(mu_);
  // An extent for `length` bytes charged to `share`, evicting from it (only)
  // as needed; nullopt when its unpinned segments cannot make room.
  std::optional<Extent> AllocateLocked(uint64_t length, Share& share)
      REQUIRES(mu_);
  // Returns an allocated extent not used after all (a failed write).
  void FreeAllocatedLocked(const Extent& extent, Share& share) REQUIRES(mu_);
  bool EvictOneLocked(Share& share) REQUIRES(mu_);
  // Admits `segment` to `share`'s policy as used at `used_at` (a tick of
  // clock_; recovery passes the catalog generation, so the order survives
  // restarts) and counts it for its namespace; the caller charges
  // share.allocated.
  void LinkLocked(const std::shared_ptr<Segment>& segment, Share& share,
                  uint64_t used_at) REQUIRES(mu_);
  void TouchLocked(Segment& segment) REQUIRES(mu_);
  // Pins a segment for a read (not evictable) / ends that.
  void AddReaderLocked(Segment& segment) REQUIRES(mu_);
  void UnlinkLocked(const std::shared_ptr<Segment>& segment, bool delete_entry)
      REQUIRES(mu_);
  void ReleaseReaderLocked(const std::shared_ptr<Segment>& segment)
      REQUIRES(mu_);
  // Writes every catalog delete queued up to `upto_seq` to the catalog
  // (synced unless `sync` is false: deferred writes need only WAL order).
  Status FlushPendingDeletes(uint64_t upto_seq, bool sync = true)
      EXCLUDES(flush_mu_, mu_);
  bool IsBlockAligned(const void* address) const;
  // Block-aligned bounce memory for `sizes[i]` bytes each (0: none
  // wanted): the calling thread's registered memory first (fixed-buffer
  // IO), the rest in one staging_ region, all kept alive by `*held`. An
  // entry is empty when a non-zero size could not be served (no memory).
  std::vector<std::span<std::byte>> StageBounces(
      std::span<const uint64_t> sizes, std::vector<IoBuffer>* held);
  // Cold path of a checksum mismatch: re-reads the extent (which the caller
  // keeps pinned) and says whether the device holds the right bytes
  // (*reread_ok) for the log.
  std::string DiagnoseMismatch(const CatalogEntry& entry, uint64_t got_checksum,
                               bool* reread_ok) EXCLUDES(mu_);

  const NvmeStoreOptions options_;
  const std::shared_ptr<Device> device_;
  const std::unique_ptr<NvmeCatalog> catalog_;
  NvmeRecoveryReport recovery_;  // written once in Open
  // What StageBounces cannot take from registered memory, one region per
  // write batch or read round: two mover batches (TierMoverOptions: 32 MiB
  // each) stay pooled.
  StagingPool staging_{uint64_t{64} << 20};

  // Serializes catalog delete flushes so they reach RocksDB in order.
  // Taken before mu_.
  Mutex flush_mu_ ACQUIRED_BEFORE(mu_);

  // Serializes Sync calls (one device flush at a time). Taken before mu_.
  Mutex sync_mu_ ACQUIRED_BEFORE(mu_);

  mutable Mutex mu_;  // guards everything below
  // Deferred writes published so far / covered by a completed sync.
  uint64_t deferred_seq_ GUARDED_BY(mu_) = 0;
  uint64_t synced_seq_ GUARDED_BY(mu_) = 0;
  ExtentAllocator allocator_ GUARDED_BY(mu_);
  std::unordered_map<FullKey, std::shared_ptr<Segment>, FullKeyHash> index_
      GUARDED_BY(mu_);
  // Shares of the namespaces with a quota, by ns_id; everyone else uses
  // shared_ (limit: capacity minus every quota).
  std::unordered_map<uint32_t, std::unique_ptr<Share>> quota_shares_
      GUARDED_BY(mu_);
  Share shared_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, NamespaceUsage> usage_ GUARDED_BY(mu_);
  // Writes in flight.
  std::unordered_set<FullKey, FullKeyHash> writing_ GUARDED_BY(mu_);
  // Catalog deletes of unlinked segments not yet durable. Their extents may
  // be handed out again, but no data is written into a fresh extent before
  // every delete queued until then is durable (durable_delete_seq_).
  std::vector<FullKey> pending_deletes_ GUARDED_BY(mu_);
  uint64_t delete_seq_ GUARDED_BY(mu_) = 0;          // deletes queued so far
  uint64_t durable_delete_seq_ GUARDED_BY(mu_) = 0;  // deletes known durable
  uint64_t next_generation_ GUARDED_BY(mu_) = 1;
  uint64_t bytes_used_ GUARDED_BY(mu_) = 0;
  NvmeStoreStats counters_ GUARDED_BY(mu_);  // the counter fields only
  // The policies' clock: one tick per admission or use.
  uint64_t clock_ GUARDED_BY(mu_) = 0;
};

}  // namespace tierkv::storage
