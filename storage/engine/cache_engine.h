// CacheEngine: everything tierkvd decides about segments, without sockets
// (DESIGN.md §2, §4): namespaces and their layouts, prefix matching across
// layers and parts, leases, dedup, promotion from NVMe, write policies and
// Flush. The daemon's request handler only decodes, calls the engine and
// encodes; tests drive the engine directly.
//
// One engine serves every namespace of a daemon, because the NVMe tier, the
// tier mover, the lease table and the worker pool are shared; each
// namespace keeps its own host tier (tenants never evict each other's DRAM).
//
// Threads: calls that only touch DRAM (Match, Reserve, Commit, Pin,
// Release) complete on the caller's thread. Calls that may wait for a tier
// below DRAM take a completion callback, and no engine thread waits for
// that tier's IO: an Acquire's promotion is planned on a worker and
// finished on the tier's thread when its read completes, Flush runs on the
// mover's workers, and Load lanes start their reads and go on. Workers wait
// only for write-back room (a Reserve or Store under backpressure). Calls
// complete inline when no such wait is needed; a full queue completes the
// call at once with Busy. Callbacks run exactly once, on the caller's, a
// worker's, a tier's or the mover's thread, and must not block.
//
// Why one header of ~640 lines: it declares one class, whose definitions
// are split by concern over cache_engine.cc, leased_access.cc,
// pool_transfer.cc, device_transfer.cc and tier_reports.cc; the private
// part (transfer jobs, pools) is what those files share.
//
// Owners: every lease belongs to an `owner` id chosen by the caller (the
// daemon uses connection ids); ReleaseOwner ends all of them.
//
// Thread safety: thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/latency_histogram.h"
#include "common/mutex.h"
#include "common/worker_pool.h"
#include "storage/clock.h"
#include "storage/device/device_backend.h"
#include "storage/device/device_quarantine.h"
#include "storage/device/hbm_tier.h"
#include "storage/device/mapped_region.h"
#include "storage/device/pinned_staging.h"
#include "storage/engine/engine_options.h"
#include "storage/engine/engine_stats.h"
#include "storage/engine/write_policy.h"
#include "storage/host/host_tier.h"
#include "storage/lease/lease_table.h"
#include "storage/nvme/nvme_store.h"
#include "storage/tier/placement.h"
#include "storage/tier/tier.h"
#include "storage/tier/tier_chain.h"
#include "storage/tier/tier_counters.h"
#include "storage/tier/tier_mover.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {
struct WeightsManifest;
}  // namespace tierkv

namespace tierkv::storage {

// One namespace inside the engine. Handed out by the engine, valid for its
// life; callers pass it back to name the namespace of a call.
class EngineNamespace {
 public:
  const std::string& name() const { return tiers_.ns.name; }
  WritePolicy write_policy() const { return tiers_.policy; }
  HostTier& host() const { return *host_; }
  // The registered layout, if any (immutable once registered; sharing it
  // keeps the per-call cost of Match and Reserve to one reference count).
  std::shared_ptr<const LayoutSpec> layout() const EXCLUDES(layout_mu_);
  // The registered layout's fingerprint (stored with NVMe data), 0 before.
  uint64_t fingerprint() const {
    return fingerprint_.load(std::memory_order_acquire);
  }
  // Whether it holds weights chunks (NamespaceOptions::weights).
  bool weights() const { return weights_; }

 private:
  friend class CacheEngine;
  bool weights_ = false;  // fixed at Open
  // Its index in the engine: every tier's namespace id.
  uint32_t id() const { return tiers_.ns.id; }
  std::unique_ptr<HostTier> host_;
  // Its share of the engine's HBM tier; null without one.
  std::unique_ptr<HbmNamespaceTier> hbm_;
  bool pinned_ = false;  // its arena is registered with options.device
  NamespaceTiers tiers_;
  mutable Mutex layout_mu_;
  std::shared_ptr<const LayoutSpec> layout_ GUARDED_BY(layout_mu_);
  // Release-published after layout_ is set; read lock-free by the data path.
  std::atomic<uint64_t> fingerprint_{0};
};

struct EngineMatch {
  // Pages [0, leading_pages) have every segment of the layout stored.
  uint32_t leading_pages = 0;
  uint32_t leading_nvme_pages = 0;  // of those, pages with a segment on NVMe
  // ... pages with a segment only a peer holds (the peer tier, [cluster])
  uint32_t leading_peer_pages = 0;
  uint32_t leading_hbm_pages = 0;  // of those, pages wholly in HBM too
  // Per page: the slowest tier holding one of its segments, or kMiss;
  // kHbm for a stored page whose every segment the HBM tier holds too.
  std::vector<tierkv::Tier> tiers;
};

struct SegmentSize {
  SegmentKey key;
  uint64_t size = 0;
};

struct EngineReservation {
  uint64_t lease_id = 0;  // write lease; 0 when nothing was reserved
  // Per item: where to write (commit under lease_id), or already_stored
  // (dedup: nothing to write), or why not (InvalidArgument: size differs
  // from the layout; Busy: being written or write-back backpressure;
  // ResourceExhausted: nothing evictable).
  std::vector<Result<Reservation>> items;
};

struct EngineRead {
  uint64_t lease_id = 0;  // read lease; 0 when nothing was leased
  // Per key: where the bytes are in the arena (valid until the lease ends),
  // NotFound (miss) or Busy (no worker free / no host room to promote).
  std::vector<Result<SegmentLocation>> items;
  // Per key: kHost, the tier below DRAM it was promoted from, or kMiss.
  std::vector<tierkv::Tier> source;
};

struct EnginePin {
  uint64_t lease_id = 0;
  std::vector<Status> items;  // per key: OK or NotFound
};

// One engine-registered pool: slot_count slots of slot_bytes at `offset` of
// a client memfd, holding segments of (layer, part).
struct PoolLayout {
  uint16_t layer = 0;
  uint8_t part = 0;
  uint64_t offset = 0;
  uint64_t slot_bytes = 0;  // must equal the layout's segment size
  uint32_t slot_count = 0;
};

// A per-layer transfer between registered pools and the tiers: page i of
// `pages` is slot slots[i] of every layer's pools, layers [first_layer,
// first_layer + num_layers) in order; progress goes to ticket `ticket`.
struct PoolTransfer {
  std::vector<PageHash> pages;
  std::vector<uint32_t> slots;
  uint16_t first_layer = 0;
  uint16_t num_layers = 0;
  uint32_t ticket = 0;
};

// A per-layer load of a sealed weights shard into the owner's image pool
// (a weights namespace's one pool: layer 0, part 0, one slot holding the
// whole image): the chunks of layers [first_layer, first_layer +
// num_layers) of `manifest` land at their image offsets; progress goes to
// ticket `ticket` as for a PoolTransfer, each failed chunk recorded with
// its index in manifest->chunks as the page and its layer.
struct WeightsTransfer {
  std::shared_ptr<const WeightsManifest> manifest;
  uint16_t first_layer = 0;
  uint16_t num_layers = 0;
  uint32_t ticket = 0;
};

// A chunk's bytes in an image pool (StageWeights).
struct WeightsExtent {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
// What StageWeights stored: per extent its chunk key (the XXH3-128 of its
// bytes) and whether the chunk was held already (nothing copied).
struct WeightsStaged {
  std::vector<PageHash> keys;
  std::vector<bool> already_stored;
};

class CacheEngine {
 public:
  // Validates everything, creates each namespace's host tier, opens every
  // namespace in the tiers `below` DRAM (ordered by options.placement into
  // the engine's TierChain) and starts the workers. `nvme`, when given, is
  // only read for its stats (EngineStats::nvme) and must outlive the
  // engine. Errors: InvalidArgument (options, placement, duplicate names),
  // IOError (arena creation, a tier refusing a namespace).
  static Result<std::unique_ptr<CacheEngine>> Open(
      const CacheEngineOptions& options, std::vector<NamespaceOptions> spaces,
      std::vector<std::unique_ptr<Tier>> below,
      const NvmeStore* nvme = nullptr);
  // Open with NVMe (borrowed; null: none) as the one tier below DRAM.
  static Result<std::unique_ptr<CacheEngine>> Open(
      const CacheEngineOptions& options, std::vector<NamespaceOptions> spaces,
      NvmeStore* nvme);
  // Runs queued worker calls (their callbacks fire), stops the mover, then
  // ends every lease.
  ~CacheEngine();

  CacheEngine(const CacheEngine&) = delete;
  CacheEngine& operator=(const CacheEngine&) = delete;

  // The namespace called `name`, or null.
  EngineNamespace* Find(std::string_view name) const;
  const std::vector<std::unique_ptr<EngineNamespace>>& namespaces() const {
    return spaces_;
  }
  // Whether Flush can make segments durable (a persistent tier takes the
  // write-back).
  bool can_persist() const { return chain_->can_persist(); }
  // The tiers below DRAM.
  const TierChain& chain() const { return *chain_; }

  // Registers the namespace's layout the first time; later calls must pass
  // the same layout (else InvalidArgument).
  Status RegisterLayout(EngineNamespace& ns, const LayoutSpec& layout);

  // Which leading pages have every segment of the layout in some tier;
  // touches them in the host LRU and, with kQueue, queues promotion of the
  // NVMe-only segments of leading pages (the Get that follows then hits
  // DRAM). A client that reads through Load passes kNone: its Load reads
  // NVMe straight into the pool and promotes afterwards, and a promotion
  // racing that Load would read every page twice, taking device bandwidth
  // from the read the engine is waiting for. InvalidArgument without a
  // registered layout.
  // With kQueue, only the segments of layers `prefetch` are queued: a
  // sparse reader that reads one layer group next (its Get promotes the
  // rest on demand) would otherwise promote every layer of every page.
  enum class NvmePromotion { kQueue, kNone };
  Result<EngineMatch> Match(EngineNamespace& ns,
                            std::span<const PageHash> pages,
                            NvmePromotion promotion = NvmePromotion::kQueue,
                            LayerRange prefetch = {});
  // Whether `owner` has registered pools (reads through Load).
  bool HasPools(uint64_t owner) const EXCLUDES(owners_mu_);

  // Reserves host space for segments, under one write lease of `owner`,
  // then calls `done` once. Items that meet write-back backpressure (only
  // unpersisted segments left to evict) wait on a worker, up to
  // write_back_wait, for the mover to clean space; only then are they Busy.
  void Reserve(uint64_t owner, EngineNamespace& ns,
               std::vector<SegmentSize> items,
               std::function<void(EngineReservation)> done);
  // Commits reserved segments of write lease `lease_id`: one Status per key
  // (NotFound when not reserved by that lease). Committed segments become
  // readable and, by the namespace's write policy, dirty for the mover.
  // In a weights namespace each chunk's bytes are hashed first: a chunk
  // whose WeightsChunkKey differs from its key is Corruption and its
  // reservation is dropped, so no chunk becomes readable unverified (dedup
  // answers already_stored to every later Put of that key). That guards
  // against a buggy client, not a hostile one: every client of a namespace
  // maps its arena writable and can change bytes after the check (a
  // reader that must know sets ClientOptions::weights_verify_loads).
  std::vector<Status> Commit(uint64_t owner, EngineNamespace& ns,
                             uint64_t lease_id,
                             std::span<const SegmentKey> keys);
  // Commit, then `done` once: inline, except in a weights namespace, whose
  // hashing (up to 64 MiB per chunk) runs on a worker; when the workers are
  // saturated every key is Busy and its reservation dropped (nothing
  // committed; a Put of it again starts over).
  void CommitAsync(uint64_t owner, EngineNamespace& ns, uint64_t lease_id,
                   std::vector<SegmentKey> keys,
                   std::function<void(std::vector<Status>)> done);

  // Where segments are now, not a use of them (the eviction order stays):
  // the fastest local tier holding each (kHost for DRAM) and its size
  // there, or kMiss and 0.
  struct SegmentWhere {
    tierkv::Tier tier = tierkv::Tier::kMiss;
    uint64_t bytes = 0;
  };
  std::vector<SegmentWhere> Where(EngineNamespace& ns,
                                  std::span<const SegmentKey> keys) const;
  // Per key: its size on a persistent local tier (NVMe), or 0 when none
  // holds it (DRAM does not count).
  std::vector<uint64_t> PersistedBytes(EngineNamespace& ns,
                                       std::span<const SegmentKey> keys) const;
  // Queues promotion into DRAM of those of `keys` only below it, in the
  // given order (a loader's layer order), up to half the namespace's DRAM
  // (more would evict what was just promoted before it is read). Returns
  // how many were queued; 0 without tiers below DRAM. A hint: a full
  // prefetch queue drops it, and Acquire promotes on demand. Queued at the
  // mover's background IO class (after KV prefetches, flushes and
  // demotion), within NamespaceOptions::prefetch_bytes_per_second.
  size_t PromoteInOrder(EngineNamespace& ns, std::span<const SegmentKey> keys);
  // Per item: whether a local tier below DRAM holds that chunk with that
  // size while DRAM does not (not a use of it). Reserve in a weights
  // namespace answers already_stored for those: chunk keys are content
  // hashes, so equal keys hold equal bytes (all false without such tiers).
  std::vector<bool> ChunksHeldBelow(EngineNamespace& ns,
                                    std::span<const SegmentSize> items) const;
  // Hands a weights catalog's chunk standings to the namespace's DRAM
  // eviction policy (HostTier::SetSchedule).
  void SetSchedule(EngineNamespace& ns, ScheduleTable table);
  // The namespace's DRAM bytes.
  uint64_t HostCapacity(const EngineNamespace& ns) const;
  // Removes `keys` from DRAM (those not leased, pinned or being written
  // back; the rest go by eviction) and from every local tier below it.
  void Erase(EngineNamespace& ns, std::span<const SegmentKey> keys);

  // Leases `keys` for reading, promoting NVMe-only ones into DRAM first
  // (one ReadBatch), then calls `done` once. A segment that fails its
  // checksum on NVMe is a miss, never bad bytes. `scope` kLocal promotes
  // only from this node's own tiers (a read on a peer's behalf).
  void Acquire(uint64_t owner, EngineNamespace& ns,
               std::vector<SegmentKey> keys,
               std::function<void(EngineRead)> done,
               TierScope scope = TierScope::kAll);

  // Per page: whether every segment of the layout is held by this node
  // (DRAM or a local tier below it). Not a use: no eviction order changes.
  // All false without a registered layout.
  std::vector<bool> HeldLocally(EngineNamespace& ns,
                                std::span<const PageHash> pages) const;

  // Protects host segments from eviction for `ttl` (InvalidArgument
  // outside [1 ms, max_pin_ttl]).
  Result<EnginePin> Pin(uint64_t owner, EngineNamespace& ns,
                        std::span<const SegmentKey> keys,
                        std::chrono::milliseconds ttl);

  // Ends a lease of `owner`; NotFound when expired or not its own.
  Status Release(uint64_t owner, uint64_t lease_id);
  // Ends every lease of `owner`; returns how many.
  size_t ReleaseOwner(uint64_t owner);
  // Ends leases past their expiry; returns how many.
  size_t ExpireLeases();
  // Leases held right now, over all namespaces.
  size_t active_leases() const;

  // Makes `keys` durable on NVMe (one write batch: one data sync and one
  // catalog sync) and calls `done` with one Status per key: OK (on NVMe),
  // NotFound (in neither tier), IOError / ResourceExhausted (NVMe), Busy.
  // InvalidArgument for every key without an NVMe tier.
  void Flush(EngineNamespace& ns, std::vector<SegmentKey> keys,
             std::function<void(std::vector<Status>)> done);

  // Registered pools (DESIGN.md §5). All belong to `owner` and end with
  // ReleaseOwner; a worker still moving bytes keeps its regions mapped.
  //
  // Maps memfd `fd` (borrowed) as the pool of (layer, part) of `ns`.
  // InvalidArgument: (layer, part) not in the layout or already has a pool
  // of this owner, slot_bytes differs from the segment size, no slots, or
  // the memfd is unsuitable (see MappedRegion::Map).
  Status RegisterPool(uint64_t owner, EngineNamespace& ns, int fd,
                      const PoolLayout& pool);
  // Imports an engine's device pool (an IPC handle of options.device's
  // kind) as the pool of (layer, part); `pool.offset` is within it. Loads
  // into it and Stores from it are device copies, each unit of a transfer
  // waiting for its copies' event before its layer is published. The
  // import is closed once ReleaseOwner and every transfer using it are
  // done. InvalidArgument as for RegisterPool, for slots past the
  // allocation, or without a device backend; NotFound when the handle's
  // pool (or process) is gone.
  // The same for a device allocation exported as a file descriptor
  // (DeviceBackend::ExportRangeFd; borrowed) of `allocation_bytes`: memory
  // without a legacy IPC handle, whose import stays valid after the engine
  // frees it or exits.
  Status RegisterDevicePoolFd(uint64_t owner, EngineNamespace& ns, int fd,
                              uint64_t allocation_bytes,
                              const DeviceUuid& device_uuid,
                              const PoolLayout& pool);
  // `device_uuid`: the GPU holding the pool (all zero: not said, taken as
  // options.device's); another GPU's pool is imported by a backend opened
  // for that GPU (DeviceFor), and an error names a GPU it cannot open.
  Status RegisterDevicePool(uint64_t owner, EngineNamespace& ns,
                            const IpcHandle& handle,
                            const DeviceUuid& device_uuid,
                            const PoolLayout& pool);
  // Maps memfd `fd` as `count` LoadTickets of `owner` (replacing earlier
  // ones). InvalidArgument as for pools, or count 0.
  Status RegisterTickets(uint64_t owner, int fd, uint32_t count);
  // Starts copying the segments of `t.pages` into the owner's pools, layer
  // by layer (host DRAM by memcpy, NVMe by io_uring reads into the slots),
  // publishing progress in ticket t.ticket. Returns once the request is
  // checked and queued; InvalidArgument (no layout, a layer without pools,
  // a slot out of range, bad ticket, sizes), Busy (workers saturated). A
  // segment found in no tier, or failing its checksum, is recorded in the
  // ticket's errors: its slot is not written.
  Status Load(uint64_t owner, EngineNamespace& ns, PoolTransfer t);
  // The reverse: copies slots into the host tier (dedup: an existing
  // segment copies nothing), layer by layer, then the write policy applies
  // as for Put. Errors as for Load.
  Status Store(uint64_t owner, EngineNamespace& ns, PoolTransfer t);
  // Starts loading a weights shard's layers into the owner's image pool
  // (see WeightsTransfer) with the Load machinery: lanes over layers, DRAM
  // chunks copied (memfd: non-temporal stores; device: batched copies),
  // chunks only below DRAM read from there (memfd: straight into the image;
  // device: through pinned staging, then copied), every NVMe read verified
  // by its checksum; a layer is published once all its chunks are in
  // place. Chunks read from below are queued for promotion into DRAM
  // afterwards at the background IO class (PromoteInOrder). Returns once
  // queued; InvalidArgument (not a weights namespace, no image pool, an
  // image pool smaller than the manifest's image, layers outside it, bad
  // ticket), Busy (workers saturated). A chunk in no tier, or failing its
  // checksum, is recorded in the ticket's errors: a device image's bytes of
  // it are not written; a memfd image's are zeroed if its in-place read
  // failed (never left holding what the read brought).
  Status LoadWeights(uint64_t owner, EngineNamespace& ns, WeightsTransfer t);
  // The reverse, for staging a shard from an engine's image pool: on a
  // worker, each of `extents` (a chunk of the shard's plan) is copied out
  // of the owner's image pool into private staging (a device pool by a
  // device copy), hashed there (so a pool written meanwhile cannot store
  // bytes under another key), and stored as a chunk: a chunk already held
  // (DRAM or below) copies nothing. Then the write policy applies as for
  // Put. `done` runs once, on the worker (or inline with InvalidArgument:
  // not a weights namespace, no image pool, an extent outside it or of a
  // chunk's size; Busy: workers saturated), with every extent's key, or
  // the first extent that could not be stored (its error, naming it;
  // chunks stored before it stay, as a Put's do).
  using StageDone = std::function<void(Result<WeightsStaged>)>;
  void StageWeights(uint64_t owner, EngineNamespace& ns,
                    std::vector<WeightsExtent> extents, StageDone done);
  // Queues promotion NVMe -> DRAM of every NVMe-only segment of `pages`.
  Status Prefetch(EngineNamespace& ns, std::span<const PageHash> pages);
  // Selection counts from an engine's sparse attention (Client::ReportTopk)
  // for the namespace's eviction policy: each count goes to the latent
  // segments of its full layer and of the IndexShare layers after it (up
  // to the next layer with an "index_k" part), and times
  // index_key_report_weight to the full layer's index_k segment. Segments
  // not in DRAM are skipped. InvalidArgument (nothing applied) for a layer
  // outside the layout or without a registered layout.
  Status ReportTopk(EngineNamespace& ns,
                    std::span<const SelectionReport> reports);

  // Up to `limit` host segments of `ns`.
  std::vector<SegmentInfo> List(EngineNamespace& ns, size_t limit) const;
  EngineStats Stats(EngineNamespace& ns) const EXCLUDES(owners_mu_);
  // The daemon-wide part of Stats() (no namespace: `host` is empty).
  EngineStats SharedStats() const EXCLUDES(owners_mu_);
  // Every tier of the daemon, cheapest first: HBM (when there is one),
  // host DRAM, then the tiers below DRAM in read order; each with its
  // name, policy, kind and counters (tier_counters.h), so readers show a
  // tier they have never heard of. Namespace shares are `ns`'s only, or
  // every namespace's for null. Host DRAM is per_namespace; its `shared`
  // holds the engine's write-back backpressure counters (daemon-wide).
  std::vector<TierReport> TierReports(
      const EngineNamespace* ns = nullptr) const;
  // The NVMe store given to Open (null without), and the mover (null
  // without tiers below DRAM), for metrics.
  const NvmeStore* nvme() const { return nvme_; }
  const TierMover* mover() const { return mover_.get(); }

  // Writes the dirty DRAM segments of every namespace with a write policy
  // to the demotion target, starting batches for at most `budget` on
  // options.clock (see TierMover::PersistDirty): for a graceful shutdown,
  // after the server stopped. Returns the segments written (0 without a
  // tier below DRAM).
  uint64_t PersistDirty(std::chrono::milliseconds budget);

  // Blocks until the mover is idle and the worker queue is empty (tests).
  void TEST_DrainBackground();
  // Blocks until the engine's workers have no job queued or running
  // (tests: e.g. RegisterLayout's index reservation has run).
  void TEST_WaitWorkersIdle() { workers_->WaitIdle(); }
  // Sync point (common/sync_point.h) a worker passes before it moves each
  // unit (part of a layer, see TransferJob) of a Load or Store, so once per
  // lane that works on the layer; its argument is the layer (uint16_t*).
  // Tests: stall layer l+1 to see WaitLayer(l) return first.
  static constexpr char kBeforeTransferUnit[] =
      "CacheEngine::RunLane:BeforeTransferUnit";
  // Sync point the destructor passes once its workers are done, before it
  // waits for the reads below DRAM they started (tests: let held reads go
  // there).
  static constexpr char kBeforeWaitingForTierReads[] =
      "CacheEngine::~CacheEngine:BeforeWaitingForTierReads";

 private:
  CacheEngine(const CacheEngineOptions& options, const NvmeStore* nvme,
              std::unique_ptr<TierChain> chain);
  // How many of `want` segments `owner` may still lease in `ns`
  // (LeaseTable::Room), and the ResourceExhausted the items past that room
  // get (OK when all fit).
  struct LeaseRoomCheck {
    size_t room = 0;
    Status error;
  };
  LeaseRoomCheck CheckLeaseRoom(uint64_t owner, const EngineNamespace& ns,
                                size_t want) const;
  Status LeaseLimitStatus(uint64_t owner, const char* limit) const;
  // Reserves `key` in DRAM, retrying while write-back backpressure answers
  // Busy, each time the tier changed, until `deadline` (the mover kicked
  // every round); still Busy then is counted in backpressure_busy_. The
  // deadline is on options_.clock (as every deadline of the engine).
  // REQUIRES: mover_ (write-back needs a tier below DRAM).
  Result<Reservation> ReserveAfterWriteBack(EngineNamespace& ns,
                                            const SegmentKey& key,
                                            uint64_t size,
                                            Clock::TimePoint deadline);
  // Whether a batch's new pages go to the namespace's eviction policy last
  // to first (a prompt's deepest pages first in line: a page is useful
  // only with every page before it). Every policy but lru, which stays
  // textbook LRU (and equal to an independent LRU simulation).
  static bool DeepestFirst(const EngineNamespace& ns);
  // The leasable part of one request: `candidates` (item index, segment)
  // in request order, admitted while their bytes fit the lease limits
  // (LeaseTable::FitBytes). Each one past that goes to `refuse` with the
  // ResourceExhausted to answer (the caller drops its reference or
  // reservation). Returns the admitted segments.
  std::vector<LeasedSegment> AdmitLeaseBytes(
      uint64_t owner, const EngineNamespace& ns,
      const std::vector<std::pair<size_t, LeasedSegment>>& candidates,
      const std::function<void(size_t item, Status)>& refuse) const;
  Status CheckSize(const EngineNamespace& ns, const SegmentKey& key,
                   uint64_t size) const;
  // A weights namespace's rules for a chunk's key and size.
  static Status CheckChunk(const SegmentKey& key, uint64_t size);
  // Per key: Corruption when its reservation's bytes do not hash to its
  // key, else OK (also when it is not reserved: Commit then says so).
  std::vector<Status> VerifyChunks(EngineNamespace& ns,
                                   std::span<const SegmentKey> keys) const;
  // Runs `job` on a worker (of `workers_`, or of `pool`); false when the
  // queue is full (counted).
  bool Submit(std::function<void()> job);
  bool Submit(WorkerPool& pool, std::function<void()> job);
  // The workers a transfer's lanes run on: Loads apart from everything
  // that may wait for write-back (CacheEngineOptions::load_workers).
  WorkerPool& LanesFor(bool load) const {
    return load ? *load_workers_ : *workers_;
  }
  // Retries the Busy items of a Reserve until they settle or the deadline,
  // then adds the write lease and calls `done`.
  void FinishReserve(uint64_t owner, EngineNamespace& ns,
                     std::vector<SegmentSize> items, EngineReservation r,
                     std::vector<size_t> busy, bool wait,
                     std::function<void(EngineReservation)> done);
  // An Acquire whose misses are being promoted.
  struct AcquireState {
    std::vector<SegmentKey> keys;
    EngineRead read;
    std::vector<size_t> missing;  // indexes of keys DRAM lacked
    std::function<void(EngineRead)> done;
    TierScope scope = TierScope::kAll;
  };
  // On a worker: starts promoting the Acquire's misses; the promotion's
  // completion finishes it (FinishAcquire).
  void PromoteForAcquire(uint64_t owner, EngineNamespace& ns,
                         const std::shared_ptr<AcquireState>& state);
  // Takes the promoted segments (`promoted`: one answer per `missing`
  // key) and finishes an Acquire: leases, then `done`.
  void FinishAcquire(uint64_t owner, EngineNamespace& ns,
                     std::vector<SegmentKey> keys, EngineRead read,
                     std::vector<size_t> missing, TierMover::Promoted promoted,
                     std::function<void(EngineRead)> done);

  // An engine's device pool imported into options_.device; closed when the
  // last Pool copy (the owner's, or a running transfer's) lets go.
  struct ImportedDevicePool {
    DeviceBackend* backend = nullptr;
    ImportedPool pool;
    ImportedDevicePool(DeviceBackend* b, ImportedPool p)
        : backend(b), pool(p) {}
    ~ImportedDevicePool() { (void)backend->CloseImported(pool); }
  };
  struct Pool {
    std::shared_ptr<MappedRegion> region;        // memfd pools
    std::shared_ptr<ImportedDevicePool> device;  // device pools
    PoolLayout layout;
    std::byte* Slot(uint32_t slot) const {  // region starts at layout.offset
      return region->bytes().data() + uint64_t{slot} * layout.slot_bytes;
    }
    DeviceRegion DeviceSlot(uint32_t slot) const {
      return {device->pool.pool,
              layout.offset + uint64_t{slot} * layout.slot_bytes,
              layout.slot_bytes};
    }
  };
  void PinHostArenas();
  // Checks a pool against the namespace's layout (RegisterPool's rules).
  Status CheckPoolLayout(EngineNamespace& ns, const PoolLayout& pool) const;
  // Adds `pool` as the owner's pool of (layer, part).
  Status AddPool(uint64_t owner, Pool pool);
  // RegisterDevicePool's checks: a device backend, the layout, the slots
  // inside the allocation.
  Status CheckDevicePool(EngineNamespace& ns, const PoolLayout& pool,
                         uint64_t allocation_bytes) const;
  // Adds an imported device pool (or says why the import failed).
  Status AddDevicePool(uint64_t owner, DeviceBackend* backend,
                       Result<ImportedPool> imported, const PoolLayout& pool);
  // The backend for device pools on the GPU `uuid`: options_.device when
  // unset or its own; else one of the same kind opened for that GPU on
  // first use (kept until the engine ends). Pools on another GPU than the
  // HBM tier's are served from DRAM and NVMe only.
  Result<DeviceBackend*> DeviceFor(const DeviceUuid& uuid)
      EXCLUDES(other_devices_mu_, device_streams_mu_);
  // What a transfer job needs, resolved under owners_mu_ at submission,
  // and its progress. Each layer is cut into `splits` page ranges (units);
  // up to transfer_lanes workers claim units in order (layer 0's first,
  // ...), so the lanes share a layer instead of each taking its own: layer
  // 0 is complete after ~1/L of the transfer, not ~lanes/L, which is what
  // an engine computing layer by layer waits for. Layers complete in any
  // order and are published in order.
  struct TransferJob {
    EngineNamespace* ns;
    bool load = true;  // else Store
    // When it was accepted, on the steady clock (latencies and the
    // ticket's time stamps are real time), and when a stream gate gives
    // up on it (accepted + device_copy_timeout, on options_.clock).
    std::chrono::steady_clock::time_point accepted;
    Clock::TimePoint gate_deadline;
    PoolTransfer t;
    std::shared_ptr<const LayoutSpec> layout;
    std::vector<std::vector<Pool>> pools;  // [layer - first][part]
    std::shared_ptr<MappedRegion> tickets;
    uint32_t splits = 1;  // units per layer
    // The engine's stream gate (LoadTicket::gate): kGateUnknown until a
    // lane looked, then passed or timed out for every lane.
    enum : uint8_t { kGateUnknown, kGatePassed, kGateTimedOut };
    std::atomic<uint8_t> gate{kGateUnknown};
    std::atomic<bool> gate_counted{false};  // in stream_gate_waits_
    uint32_t gate_target = 0;  // LoadTicket::gate_target at submission
    uint32_t device_base = 0;  // LoadTicket::device_layers at submission
    std::atomic<uint32_t> next_unit{0};  // the next unit to claim
    // Lanes still on the job plus its tier reads in flight (LeaveJob).
    std::atomic<uint32_t> working{1};
    Mutex mu;  // the ticket's errors and count
    std::vector<uint32_t> units_left GUARDED_BY(mu);  // per layer
    std::vector<bool> layer_done GUARDED_BY(mu);
    uint32_t published GUARDED_BY(mu) = 0;
    // Segments a Load read from NVMe: promoted into DRAM once it is done.
    std::vector<SegmentKey> from_nvme GUARDED_BY(mu);
    // A weights load (LoadWeights): its shard; t.pages and t.slots are
    // empty, every layer is one unit (splits 1), and pools[k] is the image
    // pool for every k.
    std::shared_ptr<const WeightsManifest> weights;
  };
  struct OwnerPools {
    std::unordered_map<uint32_t, Pool> pools;  // by layer << 8 | part
    std::shared_ptr<MappedRegion> tickets;
    uint32_t ticket_count = 0;
  };
  Result<std::shared_ptr<TransferJob>> PrepareTransfer(uint64_t owner,
                                                       EngineNamespace& ns,
                                                       PoolTransfer t);
  // The owner's pools and tickets, when it registered tickets and `ticket`
  // is one of them; else InvalidArgument ("register tickets before
  // <call>", or the index out of range).
  Result<const OwnerPools*> OwnerWithTicketLocked(uint64_t owner,
                                                  uint32_t ticket,
                                                  std::string_view call) const
      REQUIRES(owners_mu_);
  // LoadWeights' checks and job: the owner's image pool for every layer.
  Result<std::shared_ptr<TransferJob>> PrepareWeightsTransfer(
      uint64_t owner, EngineNamespace& ns, WeightsTransfer t);
  // Resets ticket `index` for the job and reads what the client set in it
  // before the request (gate target, device layers).
  void ArmTicket(TransferJob& job, uint32_t index);
  // Accepts a prepared Load or Store: queues its first lane (Busy when the
  // queue is full).
  Status StartTransfer(Result<std::shared_ptr<TransferJob>> job, bool load,
                       std::chrono::steady_clock::time_point accepted);
  // An ordered transfer waits until the engine's stream opened its gate
  // (LoadTicket::gate), spinning briefly, then yielding and sleeping (the
  // device writes the word: no futex wakes it), for up to
  // device_copy_timeout after the request was accepted. True once open or
  // when the transfer has no gate; false when it timed out, for every lane.
  bool PassStreamGate(TransferJob& job);
  // One worker's share of a job: claims layers until none is left, then
  // leaves it (LeaveJob: the last of its lanes and reads marks the ticket
  // finished). The first lane also starts the others, where workers are
  // free.
  void RunLane(const std::shared_ptr<TransferJob>& job, bool first);
  // A lane or a tier read is done with `job`; the last one finishes it
  // (queues the Load's promotion, marks the ticket finished).
  void LeaveJob(const std::shared_ptr<TransferJob>& job);
  // DRAM for a Store's segment `key` of page `page`: waits out write-back
  // backpressure as a Put does, until `*deadline` (set at the unit's first
  // wait, write_back_wait on). The reservation to fill, or nullopt: a dedup
  // (counted) or a failure (recorded).
  std::optional<Reservation> ReserveForStore(
      TransferJob& job, const SegmentKey& key, uint64_t bytes, uint32_t page,
      std::optional<Clock::TimePoint>* deadline);
  // Pages [begin, end) of the job's layer k. LoadLayer copies what DRAM
  // holds and starts one read of the rest from the tiers below; true when
  // it did, and so the unit is finished (FinishUnit) by that read's
  // completion, on a tier's thread, while this lane goes on.
  bool LoadLayer(const std::shared_ptr<TransferJob>& job, uint32_t k,
                 uint32_t begin, uint32_t end);
  // One segment LoadLayer reads from a tier below DRAM.
  struct LoadRead {
    SegmentKey key;
    uint32_t page;
    uint64_t bytes;
    uint16_t layer;  // of the transfer (a weights chunk's key has layer 0)
    // Zeroed when the read fails (weights images: a failed chunk's bytes
    // never stay in the pool); empty for KV slots.
    std::span<std::byte> scrub = {};
  };
  // Starts one read of `reads` from the tiers below DRAM for unit k, which
  // that read's completion finishes (FinishLoadReads, FinishUnit), on a
  // tier's thread.
  void ReadBelow(const std::shared_ptr<TransferJob>& job, uint32_t k,
                 std::vector<TierReadItem> reads,
                 std::vector<LoadRead> read_of);
  // Counts a LoadLayer read's results, recording each failed segment.
  void FinishLoadReads(TransferJob& job, std::span<const LoadRead> reads,
                       std::span<const Result<uint64_t>> got);
  // Reads below DRAM in flight whose completions use the engine (Load
  // units, Get promotions): the destructor waits for them.
  void BeginTierRead() EXCLUDES(tier_reads_mu_);
  void EndTierRead() EXCLUDES(tier_reads_mu_);
  void StoreLayer(TransferJob& job, uint32_t k, uint32_t begin, uint32_t end);
  // A weights load's layer k (see LoadWeights): LoadLayer's contract, over
  // the layer's chunks into the image pool (weights_transfer.cc).
  bool LoadWeightsLayer(const std::shared_ptr<TransferJob>& job, uint32_t k);
  // The device image's layer k: a stream is taken only around each batch
  // of copies and its wait, never across NVMe reads.
  void LoadWeightsToDevice(TransferJob& job, const Pool& pool, uint32_t k);
  // StageWeights' work on the worker, from `pool` (a copy: the owner may
  // unregister meanwhile).
  Result<WeightsStaged> StageChunks(EngineNamespace& ns, const Pool& pool,
                                    std::span<const WeightsExtent> extents);
  // A unit the stream gate kept closed: every chunk or page of it fails
  // with Busy.
  void FailUnit(TransferJob& job, uint32_t k, uint32_t begin, uint32_t end);
  // LoadLayer / StoreLayer for one device pool: copies on `stream` (the
  // unit's alone), then waits for their event.
  void LoadUnitToDevice(TransferJob& job, const Pool& pool, uint32_t k,
                        uint32_t begin, uint32_t end, StreamId stream);
  void StoreUnitFromDevice(TransferJob& job, const Pool& pool, uint32_t k,
                           uint32_t begin, uint32_t end, StreamId stream);
  // HBM admissions of segments whose bytes are in an engine's device pool
  // (just loaded into it or to be stored from it), copied device to device
  // as one batch: QueueHbmAdmission reserves the segment and adds the copy
  // from `src` (a slot on `device`) to `batch` (nothing without an HBM tier
  // or room, or when `device` is another GPU's); SubmitHbmAdmissions
  // queues the batch's copies on `stream` and moves its keys to
  // `admitted`, or aborts them if the copies were refused.
  struct HbmAdmissions {
    std::vector<SegmentKey> keys;
    std::vector<DeviceRegion> dsts, srcs;
  };
  void QueueHbmAdmission(EngineNamespace& ns, const SegmentKey& key,
                         const DeviceBackend& device, const DeviceRegion& src,
                         HbmAdmissions* batch);
  void SubmitHbmAdmissions(EngineNamespace& ns, StreamId stream,
                           HbmAdmissions* batch,
                           std::vector<SegmentKey>* admitted);
  // After the stream's event: commits what was admitted, or aborts it.
  void FinishHbmAdmissions(EngineNamespace& ns,
                           std::span<const SegmentKey> admitted, bool copied);
  // Records an event on `stream` and waits for it (device_copy_timeout).
  // Then `release` (what the copies read or write: held segments,
  // reservations to abort, bounce buffers) runs with the wait's answer, at
  // once, or, when the wait gave up while the copies may still run, once
  // they are done (quarantine_). Returns the wait's answer.
  Status WaitDeviceCopies(DeviceBackend& device, StreamId stream,
                          std::function<void(const Status&)> release);
  // True while the HBM tier exists and its device works. The first call
  // that finds the device failed logs it (once) with the cause.
  bool HbmUsable() const;
  bool DeviceFailed() const;
  // A unit of layer k is done; once all are, publishes every completed
  // leading layer.
  void FinishUnit(TransferJob& job, uint32_t k);
  // Queues the segments a finished Load read from NVMe for promotion into
  // DRAM (off its critical path: every layer is published by then), so
  // pages read again are served from DRAM.
  void PromoteLoaded(TransferJob& job);
  // A segment of the job that could not be moved (written to the ticket
  // before its layer is published).
  static void RecordError(TransferJob& job, uint32_t page, uint16_t layer,
                          uint8_t part, StatusCode code);

  const CacheEngineOptions options_;
  const NvmeStore* const nvme_;             // borrowed, for stats; may be null
  const std::unique_ptr<TierChain> chain_;  // never null; may be empty
  // Backends for device pools on other GPUs than options_.device's
  // (DeviceFor). Declared early: they end after every pool, job and
  // quarantined copy that uses them.
  Mutex other_devices_mu_;
  std::map<DeviceUuid, std::unique_ptr<DeviceBackend>> other_devices_
      GUARDED_BY(other_devices_mu_);
  std::vector<std::unique_ptr<EngineNamespace>> spaces_;
  std::unique_ptr<LeaseTable> leases_;
  std::unique_ptr<TierMover> mover_;  // null without NVMe
  // Destroyed first: the pools of the workers (see CacheEngineOptions).
  std::unique_ptr<WorkerPool> workers_;
  std::unique_ptr<WorkerPool> load_workers_;
  std::atomic<uint64_t> worker_rejections_{0};
  std::atomic<uint64_t> backpressure_waits_{0};
  std::atomic<uint64_t> load_segments_host_{0}, load_bytes_host_{0},
      load_segments_nvme_{0}, load_bytes_nvme_{0}, load_misses_{0},
      store_segments_{0}, store_bytes_{0}, store_dedup_{0}, loads_{0},
      stores_{0}, weights_loads_{0}, prefetches_{0}, topk_reports_{0};
  // Weights loads are timed apart: a shard of gigabytes would swamp the
  // KV loads' latencies, which engines wait on every step.
  LatencyHistogram load_latency_, store_latency_, weights_load_latency_;
  mutable Mutex owners_mu_;
  std::unordered_map<uint64_t, OwnerPools> owners_ GUARDED_BY(owners_mu_);
  std::atomic<uint64_t> backpressure_busy_{0};
  // Reserves of weights chunks answered already_stored from a tier below
  // DRAM (ChunksHeldBelow).
  std::atomic<uint64_t> lower_tier_dedup_hits_{0};
  std::atomic<uint64_t> stream_gate_waiting_{0}, stream_gate_waits_{0},
      stream_gate_timeouts_{0};
  // Device streams not in use by a transfer unit. A unit holds one stream
  // alone from its first copy to its event: a stream's errors are sticky
  // until the next WaitEvent, so two units sharing one could each see the
  // other's error (and one publish a layer whose copy failed).
  StreamId AcquireDeviceStream(DeviceBackend& device)
      EXCLUDES(device_streams_mu_);
  void ReleaseDeviceStream(DeviceBackend& device, StreamId stream)
      EXCLUDES(device_streams_mu_);
  Mutex device_streams_mu_;
  CondVar device_streams_cv_;
  std::map<const DeviceBackend*, std::vector<StreamId>> free_device_streams_
      GUARDED_BY(device_streams_mu_);
  std::unique_ptr<HbmTier> hbm_;  // null without one
  // Null without a device or when pinning was refused. Before quarantine_:
  // released memory held there goes back before the arena ends.
  std::unique_ptr<PinnedStaging> staging_;
  // See WaitDeviceCopies. Mutable: Stats reaps it too, so quarantined
  // memory comes back on the daemon's periodic scrape when no transfer runs.
  mutable DeviceQuarantine quarantine_;
  mutable std::atomic<bool> device_failure_logged_{false};
  std::atomic<uint64_t> load_segments_hbm_{0}, load_bytes_hbm_{0};
  Mutex tier_reads_mu_;
  CondVar tier_reads_cv_;
  uint64_t tier_reads_ GUARDED_BY(tier_reads_mu_) = 0;
};

}  // namespace tierkv::storage
