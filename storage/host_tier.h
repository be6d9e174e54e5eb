// HostTier: one namespace's segments in host DRAM (DESIGN.md §4, tier T1).
//
// The arena (a memfd the client maps) is split into `shards` contiguous
// regions. A segment key hashes to one shard, which owns that region's extent
// allocator, its part of the index and its LRU lists, all under one mutex, as
// in leveldb's ShardedLRUCache: operations on different shards never contend.
// Consequences, by design: LRU order and capacity are per shard; a segment
// must fit in one shard (capacity / shards bytes).
//
// Segment life cycle:
//   Reserve -> (client writes bytes at the returned offset) -> Commit
//           \-> Abort (or expiry of the owning lease) frees the space.
//   Committed segments are readable; Acquire/Release bracket every read or
//   pin. A segment with refs > 0 is off the LRU lists and cannot be evicted,
//   so eviction is O(1): it always takes a list's tail.
// Dedup: Reserve of a committed key reports `already_stored` (a success:
// nothing is reserved or copied) and touches the LRU.
//
// Write-back (dirty segments): a segment committed with `dirty` must reach a
// lower tier before its memory may be reused. Each shard keeps two LRU
// lists, clean and dirty; eviction takes only the clean tail, so a dirty
// segment is never dropped. The tier mover takes the oldest dirty segments
// with TakeDirty(), persists them and hands them back with FinishPersist().
// When a reservation needs space and only dirty segments are left, Reserve
// answers Busy (backpressure, counted in backpressure_rejections) instead of
// losing data the daemon acknowledged as cached.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "storage/extent_allocator.h"
#include "storage/host_arena.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::storage {

struct HostTierOptions {
  std::string name = "default";  // namespace name, for the memfd and logs
  // Bytes of DRAM for this namespace. Default: 1 GiB. Fixed at creation.
  uint64_t capacity_bytes = uint64_t{1} << 30;
  // Number of index/LRU shards; each owns capacity/shards bytes. Default: 8.
  uint32_t shards = 8;
  // Extent alignment; internal waste is < alignment per segment. Default: 64.
  uint64_t alignment = 64;
  bool try_hugepages = true;  // Default: true (falls back to 4 KiB pages)
  bool prefault = true;       // Default: true (commit the arena at start)
  // Write-back: TakeDirty() with `only_needed` starts on a shard whose free
  // plus clean (evictable) bytes fall below this fraction of the shard and
  // cleans it up to twice the fraction, so the mover keeps room ahead of
  // new Puts, in large batches, without writing what may never be evicted.
  // Default: 0.25.
  double clean_reserve_fraction = 0.25;

  // InvalidArgument unless capacity >= shards * 1 MiB, 1 <= shards <= 256
  // alignment is a power of two in [8, 4096] and clean_reserve_fraction is
  // in [0, 1].
  Status Validate() const;
};

// Where a segment's bytes are: [offset, offset + size) of the arena.
struct SegmentLocation {
  uint64_t offset = 0;
  uint64_t size = 0;
};

// The result of a successful Reserve.
struct Reservation {
  // Where to write the bytes before Commit; meaningless if already_stored.
  SegmentLocation location;
  // Dedup: the key was committed before. Nothing was reserved; do not
  // Commit or Abort.
  bool already_stored = false;
};

// A dirty segment handed to the mover by TakeDirty(): its bytes stay valid
// and in place until FinishPersist(key).
struct DirtySegment {
  SegmentKey key;
  SegmentLocation location;
};

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
  bool hugepages = false;
};

class HostTier {
 public:
  static Result<std::unique_ptr<HostTier>> Create(const HostTierOptions& o);
  ~HostTier();

  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Allocates `size` bytes for `key`, evicting clean LRU segments of its
  // shard when needed. Returns `already_stored` for a committed key (dedup),
  // Busy when another writer holds a reservation of `key` or when only
  // dirty segments are left to evict (backpressure: retry once the mover
  // has persisted some), InvalidArgument (size 0 or larger than a shard) or
  // ResourceExhausted (every segment is referenced or reserved).
  Result<Reservation> Reserve(const SegmentKey& key, uint64_t size);

  // Makes a reserved segment readable; `dirty` when it must be persisted
  // below before eviction (write_back / write_through). NotFound when `key`
  // is not reserved.
  Status Commit(const SegmentKey& key, bool dirty = false);

  // Drops a reservation and frees its space; no-op unless `key` is reserved.
  void Abort(const SegmentKey& key);

  // Takes a reference on a committed segment (for a read or a pin) and marks
  // it most recently used. NotFound when absent or not committed.
  Result<SegmentLocation> Acquire(const SegmentKey& key);

  // Drops a reference taken by Acquire().
  // REQUIRES: a matching Acquire() on `key`.
  void Release(const SegmentKey& key);

  // True when `key` is committed; marks it most recently used.
  bool Touch(const SegmentKey& key);

  // A counter of `key`'s shard that advances whenever a segment of the
  // shard is committed, aborted or finishes a write-back: read it before a
  // Reserve that answered Busy, then WaitShardChange() for a reason to retry.
  uint64_t ShardGeneration(const SegmentKey& key) const;
  // Waits until the generation of `key`'s shard differs from `seen`, or
  // until `deadline`; false on timeout.
  bool WaitShardChange(const SegmentKey& key, uint64_t seen,
                       std::chrono::steady_clock::time_point deadline);

  // Takes up to `max_items` / `max_bytes` (at least one segment when any
  // qualifies) of the oldest unreferenced dirty segments, visiting shards
  // from a rotating start. With `only_needed`, only shards whose free plus
  // clean bytes are below clean_reserve_fraction contribute (write_back);
  // otherwise every dirty segment qualifies (write_through). Taken segments
  // cannot be evicted and are not taken again until FinishPersist().
  std::vector<DirtySegment> TakeDirty(size_t max_items, uint64_t max_bytes,
                                      bool only_needed);

  // Ends a TakeDirty() of `key`. `persisted`: the segment is now clean (the
  // oldest of its shard's clean list). Otherwise it stays dirty when
  // `retry`, else it is made clean unpersisted (the lower tier cannot take
  // it; the host copy stays a cache entry rather than wedging the shard).
  // Finish a batch newest first (reverse TakeDirty order): each finished
  // segment goes behind those finished before it, so the oldest ends last.
  void FinishPersist(const SegmentKey& key, bool persisted, bool retry);

  // Up to `limit` committed segments, in no particular order.
  std::vector<SegmentInfo> List(size_t limit) const;

  HostTierStats Stats() const;
  const HostArena& arena() const { return *arena_; }
  uint64_t shard_bytes() const { return shard_bytes_; }
  uint64_t capacity_bytes() const { return shard_bytes_ * shards_.size(); }
  const std::string& name() const { return options_.name; }

 private:
  struct Entry {
    Extent extent;  // shard-relative
    uint64_t size = 0;
    bool committed = false;
    bool dirty = false;       // must be persisted before eviction
    bool persisting = false;  // taken by TakeDirty, not yet finished
    uint32_t refs = 0;
    // Position in the clean or dirty list (by `dirty`); valid iff in_lru.
    std::list<SegmentKey>::iterator lru_pos;
    bool in_lru = false;
  };
  struct Shard;

  HostTier(const HostTierOptions& o, std::unique_ptr<HostArena> arena);
  Shard& ShardFor(const SegmentKey& key) const;
  uint64_t ArenaOffset(const Shard& shard, const Extent& e) const;

  const HostTierOptions options_;
  const std::unique_ptr<HostArena> arena_;
  uint64_t shard_bytes_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<uint32_t> next_dirty_shard_{0};  // TakeDirty's rotating start
};

}  // namespace tierkv::storage
