// HostTier: sharded DRAM index, O(1) clean/dirty LRU and dedup over a memfd
// arena (see host_tier.h for the contract).
#include "storage/host_tier.h"

#include <fmt/format.h>

namespace tierkv::storage {

struct HostTier::Shard {
  Shard(uint32_t index, uint64_t bytes, uint64_t alignment)
      : index(index), allocator(bytes, alignment) {}

  // Puts an unreferenced committed entry on its list: the front (most
  // recent) or the back (next to be evicted or persisted).
  void LinkLocked(const SegmentKey& key, Entry& e, bool front) REQUIRES(mu) {
    auto& list = e.dirty ? dirty_lru : clean_lru;
    e.lru_pos =
        front ? list.insert(list.begin(), key) : list.insert(list.end(), key);
    e.in_lru = true;
    if (!e.dirty) clean_bytes += e.extent.length;
  }
  void UnlinkLocked(Entry& e) REQUIRES(mu) {
    if (!e.in_lru) return;
    (e.dirty ? dirty_lru : clean_lru).erase(e.lru_pos);
    e.in_lru = false;
    if (!e.dirty) clean_bytes -= e.extent.length;
  }
  void TouchLocked(Entry& e) REQUIRES(mu) {
    if (!e.in_lru) return;
    auto& list = e.dirty ? dirty_lru : clean_lru;
    list.splice(list.begin(), list, e.lru_pos);
  }
  void EvictCleanTailLocked() REQUIRES(mu) {
    auto it = entries.find(clean_lru.back());
    Entry& e = it->second;
    UnlinkLocked(e);
    allocator.Free(e.extent);
    used_bytes -= e.extent.length;
    segments--;
    evictions++;
    evicted_bytes += e.size;
    entries.erase(it);
  }
  // FinishPersist under the lock; false when `key` was not taken.
  bool FinishPersistLocked(const SegmentKey& key, bool persisted, bool retry)
      REQUIRES(mu) {
    auto it = entries.find(key);
    if (it == entries.end() || !it->second.persisting) return false;
    Entry& e = it->second;
    e.persisting = false;
    persisting_bytes -= e.extent.length;
    if (persisted || !retry) {
      e.dirty = false;
      dirty_segments--;
      dirty_bytes -= e.size;
    }
    // Persisted segments are the oldest of the shard (the dirty tail): they
    // go to the clean tail, first in line for eviction. A retry goes back to
    // the dirty tail, first in line for the next batch.
    if (e.refs == 0) LinkLocked(key, e, /*front=*/false);
    return true;
  }

  // Free plus clean (evictable) bytes, plus those being written back (they
  // will be clean soon): what write-back need not clean any more.
  uint64_t ReadyBytesLocked(uint64_t shard_bytes) const REQUIRES(mu) {
    return shard_bytes - used_bytes - reserved_bytes + clean_bytes +
           persisting_bytes;
  }

  const uint32_t index;
  mutable Mutex mu;
  // Signalled whenever `generation` advances (commit, abort, write-back).
  CondVar changed;
  uint64_t generation GUARDED_BY(mu) = 0;
  ExtentAllocator allocator GUARDED_BY(mu);
  std::unordered_map<SegmentKey, Entry> entries GUARDED_BY(mu);
  // Unreferenced committed segments; front = most recent.
  std::list<SegmentKey> clean_lru GUARDED_BY(mu);
  std::list<SegmentKey> dirty_lru GUARDED_BY(mu);
  uint64_t clean_bytes GUARDED_BY(mu) = 0;       // extent bytes on clean_lru
  uint64_t persisting_bytes GUARDED_BY(mu) = 0;  // extent bytes taken
  uint64_t used_bytes GUARDED_BY(mu) = 0;
  uint64_t reserved_bytes GUARDED_BY(mu) = 0;
  uint64_t segments GUARDED_BY(mu) = 0;
  uint64_t referenced GUARDED_BY(mu) = 0;
  uint64_t dirty_segments GUARDED_BY(mu) = 0;
  uint64_t dirty_bytes GUARDED_BY(mu) = 0;
  uint64_t inserts GUARDED_BY(mu) = 0;
  uint64_t dedup_hits GUARDED_BY(mu) = 0;
  uint64_t evictions GUARDED_BY(mu) = 0;
  uint64_t evicted_bytes GUARDED_BY(mu) = 0;
  uint64_t aborts GUARDED_BY(mu) = 0;
  uint64_t backpressure_rejections GUARDED_BY(mu) = 0;
};

Status HostTierOptions::Validate() const {
  if (shards == 0 || shards > 256) {
    return Status::InvalidArgument("host tier shards must be in [1, 256]");
  }
  if (alignment < 8 || alignment > 4096 || (alignment & (alignment - 1))) {
    return Status::InvalidArgument(
        "host tier alignment must be a power of two in [8, 4096]");
  }
  if (capacity_bytes < uint64_t{shards} << 20) {
    return Status::InvalidArgument(fmt::format(
        "namespace '{}': host capacity {} B is below 1 MiB per shard ({} "
        "shards)",
        name, capacity_bytes, shards));
  }
  if (!(clean_reserve_fraction >= 0 && clean_reserve_fraction <= 1)) {
    return Status::InvalidArgument(
        "host tier clean_reserve_fraction must be in [0, 1]");
  }
  return Status::OK();
}

Result<std::unique_ptr<HostTier>> HostTier::Create(const HostTierOptions& o) {
  TIERKV_RETURN_IF_ERROR(o.Validate());
  auto arena = HostArena::Create({.name = "tierkv-" + o.name,
                                  .bytes = o.capacity_bytes,
                                  .try_hugepages = o.try_hugepages,
                                  .prefault = o.prefault});
  if (!arena.ok()) return arena.status();
  return std::unique_ptr<HostTier>(new HostTier(o, std::move(arena).value()));
}

HostTier::HostTier(const HostTierOptions& o, std::unique_ptr<HostArena> arena)
    : options_(o), arena_(std::move(arena)) {
  shard_bytes_ = (o.capacity_bytes / o.shards) & ~(o.alignment - 1);
  for (uint32_t i = 0; i < o.shards; ++i) {
    shards_.push_back(std::make_unique<Shard>(i, shard_bytes_, o.alignment));
  }
}

HostTier::~HostTier() = default;

HostTier::Shard& HostTier::ShardFor(const SegmentKey& key) const {
  return *shards_[std::hash<SegmentKey>()(key) % shards_.size()];
}

uint64_t HostTier::ArenaOffset(const Shard& shard, const Extent& e) const {
  return shard.index * shard_bytes_ + e.offset;
}

Result<Reservation> HostTier::Reserve(const SegmentKey& key, uint64_t size) {
  if (size == 0) return Status::InvalidArgument("segment size is 0");
  if (size > shard_bytes_) {
    return Status::InvalidArgument(fmt::format(
        "segment of {} B exceeds the {} B host shard of namespace '{}'", size,
        shard_bytes_, options_.name));
  }
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  if (auto it = shard.entries.find(key); it != shard.entries.end()) {
    if (!it->second.committed) {
      return Status::Busy("segment is being written by another client");
    }
    shard.dedup_hits++;
    shard.TouchLocked(it->second);
    return Reservation{.already_stored = true};
  }
  std::optional<Extent> extent;
  while (!(extent = shard.allocator.Allocate(size))) {
    if (shard.clean_lru.empty()) {
      if (shard.dirty_segments > 0) {
        shard.backpressure_rejections++;
        return Status::Busy(fmt::format(
            "namespace '{}': host shard {} holds only segments not yet "
            "written back to NVMe; retry when the write-back catches up",
            options_.name, shard.index));
      }
      return Status::ResourceExhausted(fmt::format(
          "namespace '{}': no evictable space for {} B (shard {} has every "
          "segment leased, pinned or reserved)",
          options_.name, size, shard.index));
    }
    shard.EvictCleanTailLocked();
  }
  Entry& e = shard.entries[key];
  e.extent = *extent;
  e.size = size;
  shard.reserved_bytes += extent->length;
  return Reservation{.location = {ArenaOffset(shard, *extent), size}};
}

Status HostTier::Commit(const SegmentKey& key, bool dirty) {
  Shard& shard = ShardFor(key);
  {
    MutexLock lock(&shard.mu);
    auto it = shard.entries.find(key);
    if (it == shard.entries.end() || it->second.committed) {
      return Status::NotFound("segment is not reserved");
    }
    Entry& e = it->second;
    e.committed = true;
    e.dirty = dirty;
    shard.reserved_bytes -= e.extent.length;
    shard.used_bytes += e.extent.length;
    shard.segments++;
    shard.inserts++;
    if (dirty) {
      shard.dirty_segments++;
      shard.dirty_bytes += e.size;
    }
    shard.LinkLocked(key, e, /*front=*/true);
    shard.generation++;
  }
  shard.changed.SignalAll();
  return Status::OK();
}

void HostTier::Abort(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  {
    MutexLock lock(&shard.mu);
    auto it = shard.entries.find(key);
    if (it == shard.entries.end() || it->second.committed) return;
    shard.allocator.Free(it->second.extent);
    shard.reserved_bytes -= it->second.extent.length;
    shard.aborts++;
    shard.entries.erase(it);
    shard.generation++;
  }
  shard.changed.SignalAll();
}

uint64_t HostTier::ShardGeneration(const SegmentKey& key) const {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  return shard.generation;
}

bool HostTier::WaitShardChange(const SegmentKey& key, uint64_t seen,
                               std::chrono::steady_clock::time_point deadline) {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  while (shard.generation == seen) {
    if (!shard.changed.WaitUntil(&shard.mu, deadline)) {
      return shard.generation != seen;
    }
  }
  return true;
}

Result<SegmentLocation> HostTier::Acquire(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || !it->second.committed) {
    return Status::NotFound("segment not in host tier");
  }
  Entry& e = it->second;
  if (e.refs++ == 0) {
    shard.UnlinkLocked(e);
    shard.referenced++;
  }
  return SegmentLocation{ArenaOffset(shard, e.extent), e.size};
}

void HostTier::Release(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || it->second.refs == 0) return;
  Entry& e = it->second;
  if (--e.refs == 0) {
    shard.referenced--;
    // Released = just used. A segment being persisted re-links when the
    // mover finishes with it.
    if (!e.persisting) shard.LinkLocked(key, e, /*front=*/true);
  }
}

bool HostTier::Touch(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || !it->second.committed) return false;
  shard.TouchLocked(it->second);
  return true;
}

std::vector<DirtySegment> HostTier::TakeDirty(size_t max_items,
                                              uint64_t max_bytes,
                                              bool only_needed) {
  std::vector<DirtySegment> out;
  uint64_t bytes = 0;
  const auto reserve_bytes = static_cast<uint64_t>(
      options_.clean_reserve_fraction * static_cast<double>(shard_bytes_));
  const uint32_t start =
      next_dirty_shard_.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < shards_.size() && out.size() < max_items; ++i) {
    Shard& shard = *shards_[(start + i) % shards_.size()];
    MutexLock lock(&shard.mu);
    // write_back: a shard below its reserve of ready bytes is cleaned up to
    // twice the reserve (hysteresis: large batches, not one per Put).
    if (only_needed && shard.ReadyBytesLocked(shard_bytes_) >= reserve_bytes) {
      continue;
    }
    // Oldest first, until the batch is full or the shard is clean enough.
    while (!shard.dirty_lru.empty() && out.size() < max_items &&
           (out.empty() || bytes < max_bytes) &&
           (!only_needed ||
            shard.ReadyBytesLocked(shard_bytes_) < 2 * reserve_bytes)) {
      const SegmentKey key = shard.dirty_lru.back();
      Entry& e = shard.entries.find(key)->second;
      shard.UnlinkLocked(e);
      e.persisting = true;
      shard.persisting_bytes += e.extent.length;
      out.push_back({key, {ArenaOffset(shard, e.extent), e.size}});
      bytes += e.size;
    }
  }
  return out;
}

void HostTier::FinishPersist(const SegmentKey& key, bool persisted,
                             bool retry) {
  Shard& shard = ShardFor(key);
  {
    MutexLock lock(&shard.mu);
    if (shard.FinishPersistLocked(key, persisted, retry)) shard.generation++;
  }
  shard.changed.SignalAll();
}

std::vector<SegmentInfo> HostTier::List(size_t limit) const {
  std::vector<SegmentInfo> out;
  for (const auto& shard : shards_) {
    MutexLock lock(&shard->mu);
    for (const auto& [key, e] : shard->entries) {
      if (out.size() >= limit) return out;
      if (e.committed) out.push_back({key, e.size, e.refs});
    }
  }
  return out;
}

HostTierStats HostTier::Stats() const {
  HostTierStats s;
  s.capacity_bytes = shard_bytes_ * shards_.size();
  s.hugepages = arena_->hugepages_used();
  for (const auto& shard : shards_) {
    MutexLock lock(&shard->mu);
    s.used_bytes += shard->used_bytes;
    s.reserved_bytes += shard->reserved_bytes;
    s.segments += shard->segments;
    s.referenced_segments += shard->referenced;
    s.inserts += shard->inserts;
    s.dedup_hits += shard->dedup_hits;
    s.evictions += shard->evictions;
    s.evicted_bytes += shard->evicted_bytes;
    s.aborts += shard->aborts;
    s.dirty_segments += shard->dirty_segments;
    s.dirty_bytes += shard->dirty_bytes;
    s.backpressure_rejections += shard->backpressure_rejections;
    s.largest_free_bytes = std::max(
        s.largest_free_bytes, shard->allocator.Stats().largest_free_bytes);
  }
  return s;
}

}  // namespace tierkv::storage
