#include "storage/host_tier.h"

#include <fmt/format.h>

namespace tierkv::storage {

struct HostTier::Shard {
  Shard(uint32_t index, uint64_t bytes, uint64_t alignment)
      : index(index), allocator(bytes, alignment) {}

  const uint32_t index;
  mutable std::mutex mu;
  ExtentAllocator allocator;                      // guarded by mu
  std::unordered_map<SegmentKey, Entry> entries;  // guarded by mu
  std::list<SegmentKey>
      lru;  // front = most recent; unreferenced committed only
  // Counters: guarded by mu.
  uint64_t used_bytes = 0;
  uint64_t reserved_bytes = 0;
  uint64_t segments = 0;
  uint64_t referenced = 0;
  uint64_t inserts = 0;
  uint64_t dedup_hits = 0;
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  uint64_t aborts = 0;
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

void HostTier::TouchLocked(Shard& shard, Entry& e) {
  if (e.in_lru) shard.lru.splice(shard.lru.begin(), shard.lru, e.lru_pos);
}

void HostTier::EvictTailLocked(Shard& shard) {
  const SegmentKey key = shard.lru.back();
  auto it = shard.entries.find(key);
  Entry& e = it->second;
  if (on_evict_) {
    on_evict_(key, std::span<const std::byte>(
                       arena_->base() + ArenaOffset(shard, e.extent), e.size));
  }
  shard.lru.pop_back();
  shard.allocator.Free(e.extent);
  shard.used_bytes -= e.extent.length;
  shard.segments--;
  shard.evictions++;
  shard.evicted_bytes += e.size;
  shard.entries.erase(it);
}

Result<SegmentLocation> HostTier::Reserve(const SegmentKey& key,
                                          uint64_t size) {
  if (size == 0) return Status::InvalidArgument("segment size is 0");
  if (size > shard_bytes_) {
    return Status::InvalidArgument(fmt::format(
        "segment of {} B exceeds the {} B host shard of namespace '{}'", size,
        shard_bytes_, options_.name));
  }
  Shard& shard = ShardFor(key);
  std::lock_guard lock(shard.mu);
  if (auto it = shard.entries.find(key); it != shard.entries.end()) {
    if (!it->second.committed) {
      return Status::Busy("segment is being written by another client");
    }
    shard.dedup_hits++;
    TouchLocked(shard, it->second);
    return Status::AlreadyExists("segment already stored");
  }
  std::optional<Extent> extent;
  while (!(extent = shard.allocator.Allocate(size))) {
    if (shard.lru.empty()) {
      return Status::ResourceExhausted(fmt::format(
          "namespace '{}': no evictable space for {} B (shard {} has every "
          "segment leased, pinned or reserved)",
          options_.name, size, shard.index));
    }
    EvictTailLocked(shard);
  }
  Entry& e = shard.entries[key];
  e.extent = *extent;
  e.size = size;
  shard.reserved_bytes += extent->length;
  return SegmentLocation{ArenaOffset(shard, *extent), size};
}

Status HostTier::Commit(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || it->second.committed) {
    return Status::NotFound("segment is not reserved");
  }
  Entry& e = it->second;
  e.committed = true;
  shard.reserved_bytes -= e.extent.length;
  shard.used_bytes += e.extent.length;
  shard.segments++;
  shard.inserts++;
  shard.lru.push_front(key);
  e.lru_pos = shard.lru.begin();
  e.in_lru = true;
  return Status::OK();
}

void HostTier::Abort(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || it->second.committed) return;
  shard.allocator.Free(it->second.extent);
  shard.reserved_bytes -= it->second.extent.length;
  shard.aborts++;
  shard.entries.erase(it);
}

Result<SegmentLocation> HostTier::Acquire(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || !it->second.committed) {
    return Status::NotFound("segment not in host tier");
  }
  Entry& e = it->second;
  if (e.refs++ == 0) {
    shard.lru.erase(e.lru_pos);
    e.in_lru = false;
    shard.referenced++;
  }
  return SegmentLocation{ArenaOffset(shard, e.extent), e.size};
}

void HostTier::Release(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || it->second.refs == 0) return;
  Entry& e = it->second;
  if (--e.refs == 0) {
    shard.lru.push_front(key);  // released = just used
    e.lru_pos = shard.lru.begin();
    e.in_lru = true;
    shard.referenced--;
  }
}

bool HostTier::Touch(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || !it->second.committed) return false;
  TouchLocked(shard, it->second);
  return true;
}

std::vector<SegmentInfo> HostTier::List(size_t limit) const {
  std::vector<SegmentInfo> out;
  for (const auto& shard : shards_) {
    std::lock_guard lock(shard->mu);
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
    std::lock_guard lock(shard->mu);
    s.used_bytes += shard->used_bytes;
    s.reserved_bytes += shard->reserved_bytes;
    s.segments += shard->segments;
    s.referenced_segments += shard->referenced;
    s.inserts += shard->inserts;
    s.dedup_hits += shard->dedup_hits;
    s.evictions += shard->evictions;
    s.evicted_bytes += shard->evicted_bytes;
    s.aborts += shard->aborts;
    s.largest_free_bytes = std::max(
        s.largest_free_bytes, shard->allocator.Stats().largest_free_bytes);
  }
  return s;
}

}  // namespace tierkv::storage
