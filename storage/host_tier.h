// HostTier: one namespace's segments in host DRAM (DESIGN.md §4, tier T1).
//
// The arena (a memfd the client maps) is split into `shards` contiguous
// regions. A segment key hashes to one shard, which owns that region's extent
// allocator, its part of the index and its LRU list, all under one mutex, as
// in leveldb's ShardedLRUCache: operations on different shards never contend.
// Consequences, by design: LRU order and capacity are per shard; a segment
// must fit in one shard (capacity / shards bytes).
//
// Segment life cycle:
//   Reserve -> (client writes bytes at the returned offset) -> Commit
//           \-> Abort (or expiry of the owning lease) frees the space.
//   Committed segments are readable; Acquire/Release bracket every read or
//   pin. A segment with refs > 0 is off the LRU list and cannot be evicted,
//   so eviction is O(1): it always takes the LRU tail.
// Dedup: Reserve of a committed key returns AlreadyExists and copies nothing.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

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

  // InvalidArgument unless capacity >= shards * 1 MiB, 1 <= shards <= 256
  // and alignment is a power of two in [8, 4096].
  Status Validate() const;
};

// Where a segment's bytes are: [offset, offset + size) of the arena.
struct SegmentLocation {
  uint64_t offset = 0;
  uint64_t size = 0;
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
  uint64_t largest_free_bytes = 0;  // over all shards
  bool hugepages = false;
};

class HostTier {
 public:
  // Called with a segment's bytes just before eviction frees them (the hook
  // for write-back demotion). Runs under the shard lock: it must be quick and
  // must not call back into this tier.
  using EvictionListener =
      std::function<void(const SegmentKey&, std::span<const std::byte>)>;

  static Result<std::unique_ptr<HostTier>> Create(const HostTierOptions& o);
  ~HostTier();

  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Allocates `size` bytes for `key`, evicting LRU segments of its shard
  // when needed. Returns AlreadyExists (committed; dedup, LRU touched), Busy
  // (another writer holds a reservation), InvalidArgument (size 0 or larger
  // than a shard) or ResourceExhausted (nothing evictable left).
  Result<SegmentLocation> Reserve(const SegmentKey& key, uint64_t size);

  // Makes a reserved segment readable. NotFound when `key` is not reserved.
  Status Commit(const SegmentKey& key);

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

  // Up to `limit` committed segments, in no particular order.
  std::vector<SegmentInfo> List(size_t limit) const;

  HostTierStats Stats() const;
  const HostArena& arena() const { return *arena_; }
  uint64_t shard_bytes() const { return shard_bytes_; }

  // REQUIRES: no concurrent calls (set once at start-up).
  void SetEvictionListener(EvictionListener listener) {
    on_evict_ = std::move(listener);
  }

 private:
  struct Entry {
    Extent extent;  // shard-relative
    uint64_t size = 0;
    bool committed = false;
    uint32_t refs = 0;
    std::list<SegmentKey>::iterator lru_pos;  // valid iff in_lru
    bool in_lru = false;
  };
  struct Shard;

  HostTier(const HostTierOptions& o, std::unique_ptr<HostArena> arena);
  Shard& ShardFor(const SegmentKey& key) const;
  uint64_t ArenaOffset(const Shard& shard, const Extent& e) const;
  void EvictTailLocked(Shard& shard);
  static void TouchLocked(Shard& shard, Entry& e);

  const HostTierOptions options_;
  const std::unique_ptr<HostArena> arena_;
  uint64_t shard_bytes_;
  std::vector<std::unique_ptr<Shard>> shards_;
  EvictionListener on_evict_;
};

}  // namespace tierkv::storage
