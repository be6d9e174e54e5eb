// WeightsCatalog: the sealed weights shards of one weights namespace
// (include/tierkv/weights.h, issue 28) and the reference counts of their
// chunks. The chunks themselves are ordinary segments of the namespace
// (key: (WeightsChunkKey, 0, 0)), stored by clients with Put and read with
// Get; this catalog only records which shards name which chunks, so that
// a shard is sealed only over stored chunks and dropping one evicts the
// chunks no other sealed shard needs.
//
// Persistence: with an NVMe tier, Seal first makes the shard's chunks
// durable there (CacheEngine::Flush: the ones written through already
// cost nothing), then writes the manifest to the NVMe store's RocksDB
// catalog (NvmeCatalog::PutWeights) before it answers, so a sealed shard
// survives a crash whole; Open reloads them. a manifest whose chunks were
// evicted meanwhile is still listed (chunks_missing > 0) and still looked up,
// so a loader gets a per-chunk NotFound from its Get. Without one, sealed
// shards live in memory only and are gone after a restart (so are the
// chunks: DRAM is not persistent).
//
// Races with Drop: a chunk named by a Seal that is making its chunks
// durable is never erased by a Drop of the last sealed shard naming it (it
// stays stored until that Seal ends, and is erased then unless sealed), and
// a Seal answers only once every chunk is on NVMe (DRAM alone does not
// count) when it has one. What it leaves to the caller: a chunk
// deduplicated by a Put (already stored) may be erased by a Drop before
// the Seal that names it arrives; Seal then answers NotFound for it and
// the client stores it again.
//
// Thread safety: thread-safe. Calls into the engine (where chunks are,
// erasing them) and the NVMe catalog are made under the catalog's lock, so
// a Seal's presence check and a Drop's erase never interleave.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/clock.h"
#include "storage/engine/cache_engine.h"
#include "storage/nvme/nvme_catalog.h"
#include "tierkv/status.h"
#include "tierkv/types.h"
#include "tierkv/weights.h"

namespace tierkv::storage {

struct WeightsCatalogOptions {
  // The largest manifest encoding Seal accepts, in bytes: what the
  // manifest's reply frame can carry back. Default:
  // kWeightsMaxManifestBytes (16 MiB - 4 KiB).
  uint64_t max_manifest_bytes = kWeightsMaxManifestBytes;
  // The most manifest bytes (encoded) all sealed shards together may hold:
  // they live in memory (decoded too, a few times that), so a client
  // sealing version after version cannot grow the daemon without bound.
  // Past it, Seal is ResourceExhausted until shards are dropped.
  // Default: 256 MiB.
  uint64_t max_total_manifest_bytes = uint64_t{256} << 20;
  // Source of sealed_unix_ms. Default: the system clock.
  uint64_t (*now_unix_ms)() = nullptr;
  // Source of hint deadlines and pin expiry (borrowed; must outlive the
  // catalog). Default: the steady clock.
  const Clock* clock = nullptr;
  // A hinted shard whose next use is at most this far ahead has its chunks
  // below DRAM queued for promotion, in layer order, once per hint (at the
  // Hint, or at the Tick that finds it that close). 0: hints never
  // prefetch. Default: 60 s.
  std::chrono::milliseconds prefetch_horizon{60000};
  // The most distinct chunk bytes all pinned shards together may hold.
  // 0: half the namespace's DRAM. Default: 0.
  uint64_t max_pinned_bytes = 0;
};

class WeightsCatalog {
 public:
  // The catalog of weights namespace `ns` of `engine` (both borrowed, and
  // must outlive it), persisted in `persist` (borrowed; null: in memory
  // only), whose records it reloads. InvalidArgument when `ns` is not a
  // weights namespace; IOError / Corruption when the NVMe catalog cannot be
  // read (a malformed record is skipped and logged, never fatal).
  static Result<std::unique_ptr<WeightsCatalog>> Open(
      const WeightsCatalogOptions& options, CacheEngine* engine,
      EngineNamespace* ns, NvmeCatalog* persist);
  // Waits for the Seals whose chunks are being flushed (their callbacks
  // run first). REQUIRES: the engine still runs.
  ~WeightsCatalog();
  WeightsCatalog(const WeightsCatalog&) = delete;
  WeightsCatalog& operator=(const WeightsCatalog&) = delete;

  struct Sealed {
    PageHash version;
    bool already_sealed = false;
  };
  // Seals the manifest encoded as `encoded` (EncodeWeightsManifest):
  // Corruption when it does not decode, InvalidArgument past
  // max_manifest_bytes, ResourceExhausted past max_total_manifest_bytes,
  // NotFound naming the first chunk that no tier of
  // the namespace holds with its size (or that is gone before it is
  // durable), IOError when a chunk or the manifest cannot be persisted.
  // Sealing a version sealed before is OK, already_sealed, and checks
  // nothing again. `done` runs once: inline, or on the mover's thread
  // that made the chunks durable.
  using SealDone = std::function<void(Result<Sealed>)>;
  void Seal(std::span<const std::byte> encoded, SealDone done) EXCLUDES(mu_);
  // Seal, waiting for its answer. REQUIRES: not on a mover thread.
  Result<Sealed> Seal(std::span<const std::byte> encoded) EXCLUDES(mu_);

  // The encoded manifest of (model, layout, version), the newest sealed
  // one of (model, layout) for a zero version; NotFound when none is.
  Result<std::vector<std::byte>> Manifest(const WeightsId& id) const
      EXCLUDES(mu_);
  // The same shard's manifest, decoded (shared, immutable: the caller may
  // keep it while the shard is dropped, as a load in flight does).
  Result<std::shared_ptr<const WeightsManifest>> Decoded(
      const WeightsId& id) const EXCLUDES(mu_);

  // One WeightsInfo per sealed shard of `model` (empty: every model), in
  // (model, layout, sealed order), at most `limit`, with where its chunks
  // are now.
  std::vector<WeightsInfo> List(std::string_view model, size_t limit) const
      EXCLUDES(mu_);

  struct Dropped {
    uint32_t shards = 0;
    uint64_t freed_bytes = 0;  // of chunks no sealed shard names any more
  };
  // Unseals the shards of `model` (required), of `layout` (empty: every
  // layout) and `version` (zero: every version), then erases from every
  // tier the chunks no remaining shard names. InvalidArgument for an
  // empty model; NotFound when nothing matches; IOError when the NVMe
  // catalog refuses the first delete (nothing dropped). A later refusal
  // ends the drop early: the shards dropped so far are counted and the
  // rest stay sealed (logged).
  Result<Dropped> Drop(std::string_view model, std::string_view layout,
                       const PageHash& version) EXCLUDES(mu_);

  // Queues promotion into DRAM of the chunks of layers `layers` of one
  // shard (zero version: the newest), in layer order; returns how many
  // were queued (CacheEngine::PromoteInOrder). NotFound for no such
  // shard; InvalidArgument when layers.first is past its last layer.
  Result<size_t> Prefetch(const WeightsId& id, LayerRange layers) const
      EXCLUDES(mu_);

  // When sealed shards are next used (kWeightsHint): one Status per item,
  // OK or NotFound (no such shard; a zero version names the newest of
  // (model, layout) now, and the hint stays with that version).
  struct ShardHint {
    WeightsId id;
    // From now; negative: no known next use (the hint is cleared).
    std::chrono::milliseconds next_use{-1};
  };
  // The namespace's DRAM eviction order follows at once (the `weights`
  // policy, weights_policy.cc): unhinted chunks first, least recently used
  // first, then the farthest next use first; a next use that has passed
  // ranks as the nearest until the shard is hinted again or cleared.
  // Shards within prefetch_horizon are prefetched (see the option).
  std::vector<Status> Hint(std::span<const ShardHint> hints) EXCLUDES(mu_);

  // Pins one sealed shard (zero version: the newest) in DRAM for `ttl`
  // (0: unpins it; a later Pin of a pinned shard sets a new ttl): its
  // chunks are queued for promotion in layer order and, once in DRAM,
  // never evicted from it while the pin lasts, shared chunks included
  // (another shard naming them may be dropped or evicted; they stay).
  // NotFound: no such shard; ResourceExhausted: the distinct chunk bytes
  // of the pinned shards would pass max_pinned_bytes (half the namespace's
  // DRAM unless set); OK for an
  // unpin of a shard that was not pinned. Pins end at their ttl (checked
  // by Tick) and are not persisted: a restart ends them.
  Status Pin(const WeightsId& id, std::chrono::milliseconds ttl) EXCLUDES(mu_);

  // Sync point (common/sync_point.h): a Seal's chunks are durable, before
  // it takes the catalog's lock to check them again and seal.
  static constexpr char kSealFlushed[] = "WeightsCatalog::Seal:Flushed";

  // Ends pins past their ttl and prefetches the hinted shards that came
  // within prefetch_horizon; the daemon calls it every sweep interval.
  void Tick() EXCLUDES(mu_);

  struct ScheduleTotals {
    uint32_t hinted_shards = 0;
    uint32_t pinned_shards = 0;
    uint64_t pinned_bytes = 0;  // distinct chunk bytes of pinned shards
  };
  ScheduleTotals schedule_totals() const EXCLUDES(mu_);

  struct Totals {
    uint64_t shards = 0;
    // Chunk bytes the sealed shards name, a chunk counted once per shard.
    uint64_t referenced_bytes = 0;
    // Bytes of the distinct chunks they name: what storing them takes.
    uint64_t unique_bytes = 0;
  };
  Totals totals() const EXCLUDES(mu_);

 private:
  struct Shard {
    // Immutable once sealed; shared with loads in flight (Decoded).
    std::shared_ptr<const WeightsManifest> manifest;
    std::vector<std::byte> encoded;
    PageHash version;
    uint64_t sealed_unix_ms = 0;
    uint64_t sequence = 0;  // seal (or load) order: breaks time ties
    uint64_t chunk_bytes = 0;
    // kWeightsHint: when it is next used; whether the hint has prefetched
    // it yet (once per hint).
    std::optional<Clock::TimePoint> next_use;
    bool hint_prefetched = false;
    // kWeightsPin: until when it is pinned.
    std::optional<Clock::TimePoint> pinned_until;
  };
  struct Chunk {
    uint32_t shards = 0;  // sealed shards naming it
    uint64_t bytes = 0;
  };
  using ShardKey = std::tuple<std::string, std::string, PageHash>;
  // Chunk keys are XXH3-128 hashes already: their low word spreads well.
  struct ChunkKeyHash {
    size_t operator()(const PageHash& h) const { return h.lo; }
  };

  WeightsCatalog(const WeightsCatalogOptions& options, CacheEngine* engine,
                 EngineNamespace* ns, NvmeCatalog* persist, uint32_t ns_id);
  // Adds a decoded shard and its chunk references.
  void InsertLocked(Shard shard) REQUIRES(mu_);
  // Seal's checks on `shard`: already sealed (an answer), past the
  // manifest limit or a chunk not stored (an error), or nullopt: go on.
  // `durable`: the re-check after the flush: every chunk must be on NVMe,
  // not only somewhere, and `shard` is among the pending seals.
  Result<std::optional<Sealed>> CheckSealLocked(const Shard& shard,
                                                bool durable) const
      REQUIRES(mu_);
  // A Seal waiting for its flush: its manifest bytes count against the
  // limit and its chunks are not erased by Drop meanwhile (Add), until it
  // ends either way (Remove).
  void AddPendingLocked(uint64_t encoded_bytes,
                        std::span<const SegmentKey> chunks) REQUIRES(mu_);
  // Ends a pending seal (of `encoded_bytes`, naming `chunks`) and returns
  // the chunks to erase now: deferred by a Drop, named by no other pending
  // seal and by no sealed shard (called once the seal is inserted, or
  // failed).
  std::vector<SegmentKey> RemovePendingLocked(
      uint64_t encoded_bytes, std::span<const SegmentKey> chunks) REQUIRES(mu_);
  // Persists `shard`'s manifest (with NVMe) and inserts it.
  Result<Sealed> FinishSealLocked(Shard shard) REQUIRES(mu_);
  // Ends a Seal that waited for a flush (the destructor waits for them).
  void EndPendingSeal() EXCLUDES(mu_);
  // The shard `id` names (newest for a zero version), or null.
  const Shard* FindLocked(const WeightsId& id) const REQUIRES(mu_);
  // The same, mutable. The analysis cannot see that std::as_const(*this)
  // names this object's mu_, which REQUIRES holds: exempt.
  Shard* FindLocked(const WeightsId& id)
      REQUIRES(mu_) NO_THREAD_SAFETY_ANALYSIS {
    return const_cast<Shard*>(std::as_const(*this).FindLocked(id));
  }
  // Folds the hinted and pinned shards into one standing per chunk and
  // hands the table to the namespace's DRAM policy.
  void PushScheduleLocked() REQUIRES(mu_);
  // Ends pins past `now`; true when one ended (the schedule must be
  // pushed again).
  bool ExpirePinsLocked(Clock::TimePoint now) REQUIRES(mu_);
  // `now` + `ahead`, saturating at the clock's end (a ttl or next use of
  // "forever" must not wrap into the past).
  static Clock::TimePoint Later(Clock::TimePoint now,
                                std::chrono::milliseconds ahead);
  // The chunks of hinted shards that came within the horizon, nearest
  // next use first, each shard once per hint.
  std::vector<SegmentKey> DueForPrefetchLocked(Clock::TimePoint now)
      REQUIRES(mu_);
  // Distinct chunk bytes of the pinned shards (plus `extra`, if not null).
  uint64_t PinnedBytesLocked(const Shard* extra) const REQUIRES(mu_);
  // The distinct chunk keys of `m`, in chunk order.
  static std::vector<SegmentKey> DistinctChunks(const WeightsManifest& m);

  const WeightsCatalogOptions options_;
  CacheEngine* const engine_;   // borrowed
  EngineNamespace* const ns_;   // borrowed, owned by the engine
  NvmeCatalog* const persist_;  // borrowed; null: in memory only
  const uint32_t ns_id_;        // the namespace's id in persist_
  const Clock* const clock_;    // borrowed

  mutable Mutex mu_;
  std::map<ShardKey, Shard> shards_ GUARDED_BY(mu_);
  std::unordered_map<PageHash, Chunk, ChunkKeyHash> chunks_ GUARDED_BY(mu_);
  uint64_t next_sequence_ GUARDED_BY(mu_) = 0;
  uint64_t referenced_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t unique_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t manifest_bytes_ GUARDED_BY(mu_) = 0;          // encoded, all shards
  uint32_t pending_seals_ GUARDED_BY(mu_) = 0;           // waiting for a flush
  uint64_t pending_manifest_bytes_ GUARDED_BY(mu_) = 0;  // of those seals
  // Chunks those seals name, and how many of them name each.
  std::unordered_map<PageHash, uint32_t, ChunkKeyHash> pending_chunks_
      GUARDED_BY(mu_);
  // Chunks a Drop left stored because a pending seal named them: erased
  // when the last such seal ends without sealing them.
  std::unordered_set<PageHash, ChunkKeyHash> drop_deferred_ GUARDED_BY(mu_);
  // The newest sealed_unix_ms: the next seal's is at least one more, so
  // sealed order (which a zero version's "newest" follows, across
  // restarts too) holds even if the system clock steps back.
  uint64_t last_sealed_unix_ms_ GUARDED_BY(mu_) = 0;
  CondVar pending_seals_done_;
};

}  // namespace tierkv::storage
