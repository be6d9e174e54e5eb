// HostTier: sharded index over one arena-wide allocator and eviction order
// (see host_tier.h for the contract).
#include "storage/host_tier.h"

#include <fmt/format.h>

namespace tierkv::storage {

struct HostTier::Shard {
  using DirtyList = boost::intrusive::list<
      Entry, boost::intrusive::member_hook<Entry, PolicyState::Hook,
                                           &Entry::dirty_hook>>;

  explicit Shard(std::unique_ptr<EvictionPolicy> p) : policy(std::move(p)) {}
  ~Shard() {
    MutexLock lock(&mu);
    dirty.clear();  // unlink every hook before the entries go
    policy.reset();
  }

  // Dirty list: front = most recently used.
  void LinkDirtyLocked(Entry& e, uint64_t now, bool first_out) REQUIRES(mu) {
    e.dirty_rank = first_out ? 0 : now;
    if (first_out) {
      dirty.push_back(e);
    } else {
      dirty.push_front(e);
    }
  }
  void UnlinkDirtyLocked(Entry& e) REQUIRES(mu) {
    if (e.dirty_hook.is_linked()) dirty.erase(dirty.iterator_to(e));
  }
  // Makes an unreferenced committed entry evictable (clean) or puts it on
  // the dirty list, as used at `now`, or (`persist_done`) as the mover
  // leaves it: clean where its last use puts it, dirty first out again.
  void LinkLocked(Entry& e, uint64_t now, bool persist_done) REQUIRES(mu) {
    if (e.dirty) {
      LinkDirtyLocked(e, now, /*first_out=*/persist_done);
    } else {
      policy->Link(e.policy, now,
                   persist_done ? LinkAt::kLastUse : LinkAt::kNow);
    }
  }
  void UnlinkLocked(Entry& e) REQUIRES(mu) {
    if (e.dirty) {
      UnlinkDirtyLocked(e);
    } else {
      policy->Unlink(e.policy);
    }
  }
  // A use at `now`: the policy learns it; a linked dirty entry moves up.
  void UseLocked(Entry& e, uint64_t now) REQUIRES(mu) {
    policy->Use(e.policy, now);
    if (e.dirty_hook.is_linked()) {
      dirty.erase(dirty.iterator_to(e));
      LinkDirtyLocked(e, now, /*first_out=*/false);
    }
  }

  mutable Mutex mu;
  // Entries are node-based (stable addresses): the policy's and the dirty
  // list's hooks live in them. Declared before both lists, so they outlive
  // them.
  std::unordered_map<SegmentKey, Entry> entries GUARDED_BY(mu);
  std::unique_ptr<EvictionPolicy> policy GUARDED_BY(mu);
  DirtyList dirty GUARDED_BY(mu);
  // Read without the lock by reservations and TakeDirty choosing a shard;
  // written under it (PublishLocked).
  std::atomic<uint64_t> victim_rank{EvictionPolicy::kNoVictim};
  std::atomic<uint64_t> dirty_rank{EvictionPolicy::kNoVictim};
  uint64_t published_clean GUARDED_BY(mu) = 0;
  // Statistics.
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
  if (!(policy_options.protected_fraction >= 0 &&
        policy_options.protected_fraction <= 1) ||
      !(policy_options.ghost_factor >= 0 &&
        policy_options.ghost_factor <= 16)) {
    return Status::InvalidArgument(
        "eviction policy: protected_fraction must be in [0, 1] and "
        "ghost_factor in [0, 16]");
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
    : options_(o),
      arena_(std::move(arena)),
      capacity_bytes_(o.capacity_bytes & ~(o.alignment - 1)),
      allocator_(capacity_bytes_, o.alignment) {
  for (uint32_t i = 0; i < o.shards; ++i) {
    shards_.push_back(std::make_unique<Shard>(
        NewEvictionPolicy(o.eviction_policy, o.policy_options)));
  }
}

HostTier::~HostTier() = default;

HostTier::Shard& HostTier::ShardFor(const SegmentKey& key) const {
  return *shards_[std::hash<SegmentKey>()(key) % shards_.size()];
}

void HostTier::PublishLocked(Shard& shard) {
  shard.mu.AssertHeld();
  shard.victim_rank.store(shard.policy->VictimRank(),
                          std::memory_order_relaxed);
  shard.dirty_rank.store(shard.dirty.empty() ? EvictionPolicy::kNoVictim
                                             : shard.dirty.back().dirty_rank,
                         std::memory_order_relaxed);
  const uint64_t clean = shard.policy->linked_bytes();
  // Unsigned wrap-around makes the sum of deltas exact.
  clean_bytes_.fetch_add(clean - shard.published_clean,
                         std::memory_order_relaxed);
  shard.published_clean = clean;
}

void HostTier::AdvanceGeneration() {
  generation_.fetch_add(1, std::memory_order_seq_cst);
  // A waiter counts itself before it checks the generation (seq_cst both
  // ways), so either it sees the new value or this sees it waiting.
  if (generation_waiters_.load(std::memory_order_seq_cst) > 0) {
    MutexLock lock(&gen_mu_);
    gen_changed_.SignalAll();
  }
}

uint64_t HostTier::Generation() const {
  return generation_.load(std::memory_order_seq_cst);
}

bool HostTier::WaitChange(
    uint64_t seen, std::chrono::steady_clock::time_point deadline) const {
  MutexLock lock(&gen_mu_);
  generation_waiters_.fetch_add(1, std::memory_order_seq_cst);
  bool changed = true;
  while (generation_.load(std::memory_order_seq_cst) == seen) {
    if (!gen_changed_.WaitUntil(&gen_mu_, deadline)) {
      changed = generation_.load(std::memory_order_seq_cst) != seen;
      break;
    }
  }
  generation_waiters_.fetch_sub(1, std::memory_order_seq_cst);
  return changed;
}

bool HostTier::EvictOneLocked(Shard& shard) {
  shard.mu.AssertHeld();
  PolicyState* victim = shard.policy->Victim();
  if (victim == nullptr) return false;
  auto it = shard.entries.find(victim->key);
  Entry& e = it->second;
  shard.policy->Unlink(e.policy);
  shard.policy->Evicted(e.policy);
  {
    MutexLock space(&space_mu_);
    allocator_.Free(e.extent);
  }
  used_bytes_.fetch_sub(e.extent.length, std::memory_order_relaxed);
  shard.used_bytes -= e.extent.length;
  shard.segments--;
  shard.evictions++;
  shard.evicted_bytes += e.size;
  shard.entries.erase(it);
  PublishLocked(shard);
  return true;
}

Result<Extent> HostTier::MakeRoom(uint64_t size) {
  while (true) {
    {
      MutexLock space(&space_mu_);
      if (auto extent = allocator_.Allocate(size)) return *extent;
    }
    // The tier's next victim: the shard whose candidate ranks first.
    Shard* best = nullptr;
    uint64_t best_rank = EvictionPolicy::kNoVictim;
    for (const auto& shard : shards_) {
      const uint64_t rank = shard->victim_rank.load(std::memory_order_relaxed);
      if (rank < best_rank) {
        best_rank = rank;
        best = shard.get();
      }
    }
    if (best != nullptr) {
      MutexLock lock(&best->mu);
      if (EvictOneLocked(*best)) continue;
    }
    // No candidate published (or it went meanwhile): ask every shard under
    // its lock before giving up.
    bool evicted = false;
    for (const auto& shard : shards_) {
      MutexLock lock(&shard->mu);
      if ((evicted = EvictOneLocked(*shard))) break;
    }
    if (evicted) continue;
    if (dirty_segments_.load(std::memory_order_relaxed) > 0) {
      return Status::Busy(fmt::format(
          "namespace '{}': DRAM holds only segments not yet written back to "
          "NVMe; retry when the write-back catches up",
          options_.name));
    }
    return Status::ResourceExhausted(fmt::format(
        "namespace '{}': no evictable space for {} B (every segment is "
        "leased, pinned or reserved)",
        options_.name, size));
  }
}

Result<Reservation> HostTier::Reserve(const SegmentKey& key, uint64_t size) {
  if (size == 0) return Status::InvalidArgument("segment size is 0");
  if (size > capacity_bytes_) {
    return Status::InvalidArgument(
        fmt::format("segment of {} B exceeds the {} B host tier of namespace "
                    "'{}'",
                    size, capacity_bytes_, options_.name));
  }
  Shard& shard = ShardFor(key);
  {
    MutexLock lock(&shard.mu);
    if (auto it = shard.entries.find(key); it != shard.entries.end()) {
      if (!it->second.committed) {
        return Status::Busy("segment is being written by another client");
      }
      shard.dedup_hits++;
      shard.UseLocked(it->second, Tick());
      PublishLocked(shard);
      return Reservation{.already_stored = true};
    }
    std::optional<Extent> extent;
    {
      MutexLock space(&space_mu_);
      extent = allocator_.Allocate(size);
    }
    Entry& e = shard.entries[key];
    e.policy.key = key;
    e.size = size;
    if (extent) {  // the common case: free space, no eviction
      e.extent = *extent;
      e.policy.bytes = extent->length;
      shard.reserved_bytes += extent->length;
      reserved_bytes_.fetch_add(extent->length, std::memory_order_relaxed);
      return Reservation{.location = {extent->offset, size}};
    }
    // The entry claims the key (another writer gets Busy) while room is
    // made with this shard unlocked: eviction locks one shard at a time.
  }
  Result<Extent> extent = MakeRoom(size);
  MutexLock lock(&shard.mu);
  auto it = shard.entries.find(key);
  if (!extent.ok()) {
    if (it != shard.entries.end() && !it->second.committed &&
        it->second.extent.length == 0) {
      shard.entries.erase(it);
    }
    if (extent.status().code() == StatusCode::kBusy) {
      shard.backpressure_rejections++;
    }
    return extent.status();
  }
  if (it == shard.entries.end() || it->second.extent.length != 0) {
    // Aborted while claimed (its lease expired): give the space back.
    MutexLock space(&space_mu_);
    allocator_.Free(*extent);
    return Status::Busy("segment reservation was aborted meanwhile");
  }
  Entry& e = it->second;
  e.extent = *extent;
  e.policy.bytes = extent->length;
  shard.reserved_bytes += extent->length;
  reserved_bytes_.fetch_add(extent->length, std::memory_order_relaxed);
  return Reservation{.location = {extent->offset, size}};
}

Status HostTier::Commit(const SegmentKey& key, bool dirty) {
  Shard& shard = ShardFor(key);
  {
    MutexLock lock(&shard.mu);
    auto it = shard.entries.find(key);
    if (it == shard.entries.end() || it->second.committed ||
        it->second.extent.length == 0) {
      return Status::NotFound("segment is not reserved");
    }
    Entry& e = it->second;
    e.committed = true;
    e.dirty = dirty;
    shard.reserved_bytes -= e.extent.length;
    shard.used_bytes += e.extent.length;
    reserved_bytes_.fetch_sub(e.extent.length, std::memory_order_relaxed);
    used_bytes_.fetch_add(e.extent.length, std::memory_order_relaxed);
    shard.segments++;
    shard.inserts++;
    if (dirty) {
      shard.dirty_segments++;
      shard.dirty_bytes += e.size;
      dirty_segments_.fetch_add(1, std::memory_order_relaxed);
    }
    const uint64_t now = Tick();
    shard.policy->Admit(e.policy, now);
    shard.LinkLocked(e, now, /*persist_done=*/false);
    PublishLocked(shard);
  }
  AdvanceGeneration();
  return Status::OK();
}

void HostTier::Abort(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  {
    MutexLock lock(&shard.mu);
    auto it = shard.entries.find(key);
    if (it == shard.entries.end() || it->second.committed) return;
    const Extent extent = it->second.extent;
    if (extent.length > 0) {  // else claimed: Reserve sees it gone
      MutexLock space(&space_mu_);
      allocator_.Free(extent);
    }
    shard.reserved_bytes -= extent.length;
    reserved_bytes_.fetch_sub(extent.length, std::memory_order_relaxed);
    shard.aborts++;
    shard.entries.erase(it);
  }
  AdvanceGeneration();
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
  shard.UseLocked(e, Tick());
  PublishLocked(shard);
  return SegmentLocation{e.extent.offset, e.size};
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
    if (!e.persisting) shard.LinkLocked(e, Tick(), /*persist_done=*/false);
    PublishLocked(shard);
  }
}

bool HostTier::Touch(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || !it->second.committed) return false;
  shard.UseLocked(it->second, Tick());
  PublishLocked(shard);
  return true;
}

void HostTier::Report(std::span<const std::pair<SegmentKey, double>> reports) {
  for (const auto& [key, weight] : reports) {
    Shard& shard = ShardFor(key);
    MutexLock lock(&shard.mu);
    auto it = shard.entries.find(key);
    if (it == shard.entries.end() || !it->second.committed) continue;
    shard.policy->Report(it->second.policy, weight, Tick());
    PublishLocked(shard);
  }
}

uint64_t HostTier::ReadyBytes() const {
  const uint64_t taken = used_bytes_.load(std::memory_order_relaxed) +
                         reserved_bytes_.load(std::memory_order_relaxed);
  const uint64_t free = taken >= capacity_bytes_ ? 0 : capacity_bytes_ - taken;
  return free + clean_bytes_.load(std::memory_order_relaxed) +
         persisting_bytes_.load(std::memory_order_relaxed);
}

std::vector<DirtySegment> HostTier::TakeDirty(size_t max_items,
                                              uint64_t max_bytes,
                                              bool only_needed) {
  std::vector<DirtySegment> out;
  uint64_t bytes = 0;
  const auto reserve_bytes = static_cast<uint64_t>(
      options_.clean_reserve_fraction * static_cast<double>(capacity_bytes_));
  // write_back: a tier below its reserve of ready bytes is cleaned up to
  // twice the reserve (hysteresis: large batches, not one per Put).
  if (only_needed && ReadyBytes() >= reserve_bytes) return out;
  // Least recently used first across shards, until the batch is full or
  // the tier is clean enough.
  while (out.size() < max_items && (out.empty() || bytes < max_bytes) &&
         (!only_needed || ReadyBytes() < 2 * reserve_bytes)) {
    Shard* best = nullptr;
    uint64_t best_rank = EvictionPolicy::kNoVictim;
    for (const auto& shard : shards_) {
      const uint64_t rank = shard->dirty_rank.load(std::memory_order_relaxed);
      if (rank < best_rank) {
        best_rank = rank;
        best = shard.get();
      }
    }
    if (best == nullptr) break;
    MutexLock lock(&best->mu);
    if (best->dirty.empty()) {
      PublishLocked(*best);  // raced: republish and look again
      continue;
    }
    Entry& e = best->dirty.back();
    best->UnlinkDirtyLocked(e);
    e.persisting = true;
    persisting_bytes_.fetch_add(e.extent.length, std::memory_order_relaxed);
    out.push_back({e.policy.key, {e.extent.offset, e.size}});
    bytes += e.size;
    PublishLocked(*best);
  }
  return out;
}

void HostTier::FinishPersist(const SegmentKey& key, bool persisted,
                             bool retry) {
  Shard& shard = ShardFor(key);
  {
    MutexLock lock(&shard.mu);
    auto it = shard.entries.find(key);
    if (it == shard.entries.end() || !it->second.persisting) return;
    Entry& e = it->second;
    e.persisting = false;
    persisting_bytes_.fetch_sub(e.extent.length, std::memory_order_relaxed);
    if (persisted || !retry) {
      e.dirty = false;
      shard.dirty_segments--;
      shard.dirty_bytes -= e.size;
      dirty_segments_.fetch_sub(1, std::memory_order_relaxed);
    }
    // A persisted segment is evictable where its last use puts it (the
    // oldest under write_back, a recent one under write_through); a retry
    // is first in line for the next batch.
    if (e.refs == 0) shard.LinkLocked(e, Tick(), /*persist_done=*/true);
    PublishLocked(shard);
  }
  AdvanceGeneration();
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
  s.capacity_bytes = capacity_bytes_;
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
  }
  MutexLock space(&space_mu_);
  s.largest_free_bytes = allocator_.Stats().largest_free_bytes;
  return s;
}

}  // namespace tierkv::storage
