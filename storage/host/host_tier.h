// HostTier: one namespace's segments in host DRAM (DESIGN.md §4, tier T1).
//
// Space and eviction order are tier-wide; the index is sharded. One extent
// allocator hands out the whole arena (a memfd the client maps), and one
// eviction policy (eviction_policy.h: `lru`, `2q`, `s3fifo`, `topk`)
// orders every evictable segment of the tier, so a full tier evicts what
// the policy ranks first whichever shard holds it: `lru` is exact LRU
// whatever the shard count (shards that evicted on their own lost 0.2-1.2
// points of prefix hits on Mooncake's trace with 8 of them: a prefix hit
// needs every page). Shards keep lookups, references and commits of
// different keys apart; the policy's own lock is held only for O(1) (topk:
// O(log n)) list updates. Lock order: a shard, then the policy or the
// allocator; eviction takes one shard lock at a time.
//
// Segment life cycle:
//   Reserve -> (client writes bytes at the returned offset) -> Commit
//           \-> Abort (or expiry of the owning lease) frees the space.
//   Committed segments are readable; Acquire/Release bracket every read or
//   pin. A segment with refs > 0 is out of its policy and cannot be
//   evicted, so eviction is O(shards): it takes a policy's victim.
// Dedup: Reserve of a committed key reports `already_stored` (a success:
// nothing is reserved or copied) and counts as a use.
//
// Write-back (dirty segments): a segment committed with `dirty` must reach a
// lower tier before its memory may be reused. Dirty segments stay out of
// the policy on a dirty list per shard (least recently used at the back);
// the tier mover takes the tier's oldest with TakeDirty(), persists them
// and hands them back with FinishPersist(), after which they are evictable
// where their last use puts them. When a reservation needs space and only dirty
// segments are left, Reserve answers Busy (backpressure, counted in
// backpressure_rejections) instead of losing data the daemon acknowledged
// as cached.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "storage/alloc/extent_allocator.h"
#include "storage/clock.h"
#include "storage/host/host_arena.h"
#include "storage/policy/eviction_policy.h"
#include "storage/policy/eviction_policy_kind.h"
#include "storage/tier/leased_tier.h"
#include "storage/tier/tier.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::storage {

struct HostTierOptions {
  std::string name = "default";  // namespace name, for the memfd and logs
  // Bytes of DRAM for this namespace. Default: 1 GiB. Fixed at creation.
  uint64_t capacity_bytes = uint64_t{1} << 30;
  // Index shards (lock partitions; space and eviction order are tier-wide).
  // Default: 8.
  uint32_t shards = 8;
  // Extent alignment; internal waste is < alignment per segment. Default: 64.
  uint64_t alignment = 64;
  bool try_hugepages = true;  // Default: true (falls back to 4 KiB pages)
  bool prefault = true;       // Default: true (commit the arena at start)
  // Write-back: TakeDirty() with `only_needed` starts when the tier's free
  // plus clean (evictable) bytes fall below this fraction of it and cleans
  // up to twice the fraction, so the mover keeps room ahead of new Puts, in
  // large batches, without writing what may never be evicted.
  // Default: 0.25.
  double clean_reserve_fraction = 0.25;
  // Which evictable segment goes first. Default: lru.
  EvictionPolicyKind eviction_policy = EvictionPolicyKind::kLru;
  EvictionPolicyOptions policy_options;

  // InvalidArgument unless capacity >= shards * 1 MiB, 1 <= shards <= 256
  // alignment is a power of two in [8, 4096] and clean_reserve_fraction is
  // in [0, 1].
  Status Validate() const;
};

// Where a segment's bytes are: [offset, offset + size) of the arena.
struct SegmentInfo {
  SegmentKey key;
  uint64_t size = 0;
  uint32_t refs = 0;
};

struct HostTierStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;           // committed, rounded to the alignment
  uint64_t reserved_bytes = 0;       // reserved, not yet committed
  uint64_t segments = 0;             // committed
  uint64_t referenced_segments = 0;  // leased or pinned right now
  uint64_t inserts = 0;
  uint64_t dedup_hits = 0;
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  uint64_t aborts = 0;
  uint64_t dirty_segments = 0;  // committed, not yet persisted below
  uint64_t dirty_bytes = 0;
  // Reservations answered Busy because only dirty segments were left to
  // evict (write-back backpressure).
  uint64_t backpressure_rejections = 0;
  uint64_t largest_free_bytes = 0;  // over all shards
  // The index's memory: populated ahead by ReserveIndex, and taken from the
  // heap beyond it (bucket arrays, nodes past the reservation).
  uint64_t index_populated_bytes = 0;
  uint64_t index_heap_bytes = 0;
  bool hugepages = false;
};

class HostTier final : public LeasedTier {
 public:
  static Result<std::unique_ptr<HostTier>> Create(const HostTierOptions& o);
  ~HostTier();

  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Allocates `size` bytes for `key`, evicting the policy's first clean
  // segments when needed. Returns `already_stored` for a committed key
  // (dedup), Busy when another writer holds a reservation of `key` or when
  // only dirty segments are left to evict (backpressure: retry once the
  // mover has persisted some), InvalidArgument (size 0 or larger than the
  // tier) or ResourceExhausted (every segment is referenced or reserved).
  Result<Reservation> Reserve(const SegmentKey& key, uint64_t size) override;

  // Makes a reserved segment readable; `dirty` when it must be persisted
  // below before eviction (write_back / write_through); with `acquire` it
  // is referenced at once (as by Acquire: Release it), so it is never
  // evictable between its commit and its first read. NotFound when `key`
  // is not reserved.
  Status Commit(const SegmentKey& key, bool dirty = false,
                bool acquire = false) override;

  // Drops a reservation and frees its space; no-op unless `key` is reserved.
  void Abort(const SegmentKey& key) override;

  // Takes a reference on a committed segment (for a read or a pin); a use
  // of it. NotFound when absent or not committed.
  Result<SegmentLocation> Acquire(const SegmentKey& key) override;

  // Drops a reference taken by Acquire() (the last one makes the segment
  // evictable again, as just used).
  // REQUIRES: a matching Acquire() on `key`.
  void Release(const SegmentKey& key) override;

  // True when `key` is committed; a use of it.
  bool Touch(const SegmentKey& key);
  // True when `key` is committed; not a use (the eviction order stays).
  bool Contains(const SegmentKey& key) const;
  // The size of committed `key`, 0 when it is not committed; not a use.
  uint64_t SizeOf(const SegmentKey& key) const;
  // Where a reservation of `key` not yet committed is to be written (to
  // check its bytes before Commit); NotFound when `key` is not reserved or
  // its space is still being made.
  Result<SegmentLocation> Reserved(const SegmentKey& key) const;
  // Removes committed `key` now, dirty or not (its bytes are no longer
  // wanted anywhere: a dropped weights chunk). False, leaving it, when it
  // is absent, not committed, referenced (leased or pinned) or being
  // persisted: it then goes as any segment does, by eviction.
  bool Drop(const SegmentKey& key);

  // Engines' indexers selected these segments' tokens `weight` times
  // (EvictionPolicy::Report: the `topk` policy ranks by it); keys not
  // committed here are skipped.
  void Report(std::span<const std::pair<SegmentKey, double>> reports);

  // The weights catalog's standing of each hinted or pinned chunk (every
  // other key: none), replacing the previous table; the `weights` policy
  // re-ranks the committed ones at once (EvictionPolicy::SetSchedule; the
  // other policies ignore it). O(old + new keys).
  void SetSchedule(ScheduleTable table);

  // A counter that advances whenever a segment of the tier is committed,
  // aborted or finishes a write-back: read it before a Reserve that
  // answered Busy, then WaitChange() for a reason to retry.
  uint64_t Generation() const override;
  // Waits until Generation() differs from `seen`, or until `clock` reaches
  // `deadline`; false on timeout.
  bool WaitChange(uint64_t seen, const Clock& clock,
                  Clock::TimePoint deadline) const override;

  // Takes up to `max_items` / `max_bytes` (at least one segment when any
  // qualifies) of the tier's least recently used unreferenced dirty
  // segments. With `only_needed`, only while the tier's free plus clean
  // bytes are below clean_reserve_fraction (write_back); otherwise every
  // dirty segment qualifies (write_through). Taken segments cannot be
  // evicted and are not taken again until FinishPersist().
  std::vector<DirtySegment> TakeDirty(size_t max_items, uint64_t max_bytes,
                                      bool only_needed) override;

  // Ends a TakeDirty() of `key`. `persisted`: the segment is now clean,
  // evictable where its last use puts it in the policy's order. Otherwise
  // it stays dirty (first in line for the next TakeDirty) when `retry`,
  // else it is made clean unpersisted (the lower tier cannot take it; the
  // host copy stays a cache entry rather than wedging the tier).
  void FinishPersist(const SegmentKey& key, bool persisted,
                     bool retry) override;

  // Sizes the index for `segments` entries and populates the memory of
  // their nodes now (populated_memory.h), so that Reserves into a fresh
  // arena allocate nothing until the tier holds that many. At most
  // 1/kMaxIndexShare of the capacity (plus a page per shard) is populated: a
  // layout of tiny segments cannot make the daemon populate more than a share
  // of the arena it already holds. No-op without `prefault` (memory committed
  // on first use) or below an earlier call's count. Takes a fault's time per
  // page: call it off latency-sensitive threads.
  void ReserveIndex(uint64_t segments);
  static constexpr uint64_t kMaxIndexShare = 16;

  // Up to `limit` committed segments, in no particular order.
  std::vector<SegmentInfo> List(size_t limit) const;

  HostTierStats Stats() const;
  // Stats() in the tier counter vocabulary (tier_counters.h): bytes and
  // segments as gauges, events as counters, hugepages as a flag.
  void VisitCounters(TierCounterVisitor& visitor) const override;
  const HostArena& arena() const { return *arena_; }
  // The arena's bytes at `at` (empty when `at` is outside it).
  std::span<std::byte> HostBytes(const SegmentLocation& at) const override;
  uint64_t capacity_bytes() const override { return capacity_bytes_; }
  static constexpr std::string_view kName = "host";
  std::string_view name() const override { return kName; }
  EvictionPolicyKind eviction_policy() const {
    return options_.eviction_policy;
  }
  // The eviction policy's name ("lru"): the `policy` label of its metrics.
  std::string_view policy() const override {
    return EvictionPolicyName(options_.eviction_policy);
  }

 private:
  struct Entry {
    Extent extent;      // arena offsets; length 0 while being claimed
    uint64_t size = 0;  // bytes asked for
    bool committed = false;
    bool dirty = false;       // must be persisted before eviction
    bool persisting = false;  // taken by TakeDirty, not yet finished
    uint32_t refs = 0;
    PolicyState policy;  // key, bytes; linked into the policy iff evictable
    // On the shard's dirty list iff dirty, unreferenced and not persisting.
    PolicyState::Hook dirty_hook;
    uint64_t dirty_rank = 0;  // tier clock at the last use (0: first out)
  };
  struct Shard;

  HostTier(const HostTierOptions& o, std::unique_ptr<HostArena> arena);
  Shard& ShardFor(const SegmentKey& key) const;
  // The tier's clock: one tick per policy event, taken under policy_mu_
  // so ticks follow the order the policy sees.
  uint64_t Tick() REQUIRES(policy_mu_) { return ++clock_; }
  // Space for a reservation: allocates, evicting the policy's victims
  // until it fits. Called with no lock held.
  Result<Extent> MakeRoom(uint64_t size);
  // Evicts `key` if it is still evictable; false otherwise (raced). When
  // `reused` is set and the victim's extent is exactly `reuse_length`
  // bytes, the extent goes to *reused instead of back to the allocator: in
  // an arena full of one segment size, a reservation then takes its
  // victim's space without two allocator calls under space_mu_.
  // REQUIRES: shard.mu (every helper taking a Shard& below does too; the
  // analysis cannot name a lock reached through a parameter of an
  // incomplete type, so they assert it).
  bool EvictLocked(Shard& shard, const SegmentKey& key,
                   uint64_t reuse_length = 0,
                   std::optional<Extent>* reused = nullptr);
  // An unreferenced committed entry becomes evictable (clean) or goes on
  // its shard's dirty list, as just used, or (`persist_done`) as the
  // mover leaves it: clean where its last use puts it, dirty first out.
  void LinkLocked(Shard& shard, Entry& e, bool persist_done);
  void UnlinkLocked(Shard& shard, Entry& e);
  // A use: the policy learns it; a linked dirty entry moves up.
  void UseLocked(Shard& shard, Entry& e);
  // Free + clean + being-persisted bytes: what write-back need not clean.
  uint64_t ReadyBytes() const;
  void AdvanceGeneration();

  const HostTierOptions options_;
  const std::unique_ptr<HostArena> arena_;
  const uint64_t capacity_bytes_;
  std::vector<std::unique_ptr<Shard>> shards_;

  // The eviction order of the whole tier. Every hook runs under policy_mu_,
  // taken inside a shard lock (never the other way round): the policy
  // reads and moves PolicyStates of any shard, which are therefore guarded
  // by policy_mu_, while an entry's existence is guarded by its shard's
  // lock (it is unlinked, under both, before it is erased). Declared after
  // the shards: destroyed first, while the entries it links still exist.
  mutable Mutex policy_mu_;
  std::unique_ptr<EvictionPolicy> policy_ GUARDED_BY(policy_mu_);
  uint64_t clock_ GUARDED_BY(policy_mu_) = 0;

  // The arena's space; innermost lock (taken inside a shard lock).
  mutable Mutex space_mu_;
  ExtentAllocator allocator_ GUARDED_BY(space_mu_);

  // Tier-wide byte counts (extent bytes) for ReadyBytes().
  std::atomic<uint64_t> used_bytes_{0};
  std::atomic<uint64_t> reserved_bytes_{0};
  std::atomic<uint64_t> persisting_bytes_{0};
  std::atomic<uint64_t> dirty_segments_{0};

  // Generation(): bumped lock-free; waiters sleep on gen_changed_, and a
  // bump signals only when someone waits.
  std::atomic<uint64_t> generation_{0};
  mutable std::atomic<uint32_t> generation_waiters_{0};
  mutable Mutex gen_mu_;
  mutable CondVar gen_changed_;
};

}  // namespace tierkv::storage
