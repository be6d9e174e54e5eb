// HostTier: sharded index over one arena-wide allocator and eviction order
// (see host_tier.h for the contract).
#include "storage/host/host_tier.h"

#include <fmt/format.h>

#include <memory_resource>
#include <unordered_map>

#include "storage/host/populated_memory.h"

namespace tierkv::storage {

namespace {
constexpr uint64_t kNoDirty = UINT64_MAX;

// std::hash<SegmentKey>, not noexcept on purpose: libstdc++ then stores each
// node's hash code in it. With a noexcept ("fast") hash it stores none, and
// a lookup walking a bucket rehashes every node it passes to find where the
// bucket ends: one more cache miss and two Mix64 per node, about a third of
// HostTier::Reserve's samples in the daemon's profile under 72 KiB Puts.
struct CachedSegmentKeyHash {
  size_t operator()(const SegmentKey& key) const {  // NOLINT: see above
    return std::hash<SegmentKey>()(key);
  }
};
#if defined(__GLIBCXX__)
static_assert(std::__cache_default<SegmentKey, CachedSegmentKeyHash>::value,
              "the host index must store hash codes in its nodes");
#endif
}  // namespace

struct HostTier::Shard {
  Shard() : entries(&memory) {}

  using DirtyList = boost::intrusive::list<
      Entry, boost::intrusive::member_hook<Entry, PolicyState::Hook,
                                           &Entry::dirty_hook>>;

  ~Shard() {
    MutexLock lock(&mu);
    dirty.clear();  // unlink every hook before the entries go
  }

  // Dirty list: front = most recently used.
  void LinkDirtyLocked(Entry& e, uint64_t now, bool first_out) REQUIRES(mu) {
    e.dirty_rank = first_out ? 0 : now;
    if (first_out) {
      dirty.push_back(e);
    } else {
      dirty.push_front(e);
    }
    PublishDirtyLocked();
  }
  void UnlinkDirtyLocked(Entry& e) REQUIRES(mu) {
    if (!e.dirty_hook.is_linked()) return;
    dirty.erase(dirty.iterator_to(e));
    PublishDirtyLocked();
  }
  void PublishDirtyLocked() REQUIRES(mu) {
    dirty_rank.store(dirty.empty() ? kNoDirty : dirty.back().dirty_rank,
                     std::memory_order_relaxed);
  }

  mutable Mutex mu;
  // Where the index's nodes live, populated ahead by ReserveIndex (used by
  // every change to entries).
  PopulatedMemory memory GUARDED_BY(mu);
  // Entries are node-based (stable addresses): the policy's and the dirty
  // list's hooks live in them. Declared before the list, so they outlive
  // it.
  std::pmr::unordered_map<SegmentKey, Entry, CachedSegmentKeyHash> entries
      GUARDED_BY(mu);
  uint64_t index_reserved GUARDED_BY(mu) = 0;  // entries ReserveIndex sized
  DirtyList dirty GUARDED_BY(mu);
  // The dirty tail's rank, read without the lock by TakeDirty choosing a
  // shard; written under it.
  std::atomic<uint64_t> dirty_rank{kNoDirty};
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
    shards_.push_back(std::make_unique<Shard>());
  }
  EvictionPolicyOptions po = o.policy_options;
  po.capacity_bytes = capacity_bytes_;
  policy_ = NewEvictionPolicy(o.eviction_policy, po);
}

void HostTier::ReserveIndex(uint64_t segments) {
  if (!options_.prefault) return;
  // Per entry: a node (its block size in PopulatedMemory) in the chunk, and
  // its share of the bucket array on the heap.
  using Node = std::pair<const SegmentKey, Entry>;
  constexpr uint64_t kNodeBytes =
      (sizeof(Node) + 2 * sizeof(void*) + PopulatedMemory::kBlockAlign - 1) /
      PopulatedMemory::kBlockAlign * PopulatedMemory::kBlockAlign;
  static_assert(kNodeBytes <= PopulatedMemory::kMaxBlock);
  constexpr uint64_t kEntryBytes = kNodeBytes + 2 * sizeof(void*);
  segments = std::min(segments, capacity_bytes_ / kMaxIndexShare / kEntryBytes);
  const uint64_t per_shard = (segments + shards_.size() - 1) / shards_.size();
  for (const auto& shard : shards_) {
    uint64_t reserved;
    {
      MutexLock lock(&shard->mu);
      reserved = shard->index_reserved;
    }
    if (per_shard <= reserved) continue;
    // Populating takes a fault's time per page: not under the shard lock.
    PopulatedChunk chunk =
        PopulatedChunk::Map((per_shard - reserved) * kNodeBytes);
    MutexLock lock(&shard->mu);
    shard->memory.Add(std::move(chunk));
    // The bucket array, allocated (and zeroed, so touched) now.
    shard->entries.reserve(per_shard);
    shard->index_reserved = std::max(shard->index_reserved, per_shard);
  }
}

HostTier::~HostTier() {
  MutexLock lock(&policy_mu_);
  policy_.reset();  // unlinks every entry before the shards drop them
}

HostTier::Shard& HostTier::ShardFor(const SegmentKey& key) const {
  return *shards_[std::hash<SegmentKey>()(key) % shards_.size()];
}

void HostTier::LinkLocked(Shard& shard, Entry& e, bool persist_done) {
  shard.mu.AssertHeld();
  MutexLock lock(&policy_mu_);
  const uint64_t now = Tick();
  if (e.dirty) {
    shard.LinkDirtyLocked(e, now, /*first_out=*/persist_done);
  } else {
    policy_->Link(e.policy, now,
                  persist_done ? LinkAt::kLastUse : LinkAt::kNow);
  }
}

void HostTier::UnlinkLocked(Shard& shard, Entry& e) {
  shard.mu.AssertHeld();
  if (e.dirty) {
    shard.UnlinkDirtyLocked(e);
  } else {
    MutexLock lock(&policy_mu_);
    policy_->Unlink(e.policy);
  }
}

void HostTier::UseLocked(Shard& shard, Entry& e) {
  shard.mu.AssertHeld();
  uint64_t now;
  {
    MutexLock lock(&policy_mu_);
    now = Tick();
    policy_->Use(e.policy, now);
  }
  if (e.dirty_hook.is_linked()) {
    shard.dirty.erase(shard.dirty.iterator_to(e));
    shard.LinkDirtyLocked(e, now, /*first_out=*/false);
  }
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

std::span<std::byte> HostTier::HostBytes(const SegmentLocation& at) const {
  if (at.offset > arena_->size() || at.size > arena_->size() - at.offset) {
    return {};
  }
  return {arena_->base() + at.offset, at.size};
}

uint64_t HostTier::Generation() const {
  return generation_.load(std::memory_order_seq_cst);
}

bool HostTier::WaitChange(uint64_t seen, const Clock& clock,
                          Clock::TimePoint deadline) const {
  MutexLock lock(&gen_mu_);
  generation_waiters_.fetch_add(1, std::memory_order_seq_cst);
  bool changed = true;
  while (generation_.load(std::memory_order_seq_cst) == seen) {
    if (!clock.WaitUntil(gen_changed_, &gen_mu_, deadline)) {
      changed = generation_.load(std::memory_order_seq_cst) != seen;
      break;
    }
  }
  generation_waiters_.fetch_sub(1, std::memory_order_seq_cst);
  return changed;
}

bool HostTier::EvictLocked(Shard& shard, const SegmentKey& key,
                           uint64_t reuse_length,
                           std::optional<Extent>* reused) {
  shard.mu.AssertHeld();
  auto it = shard.entries.find(key);
  if (it == shard.entries.end()) return false;
  Entry& e = it->second;
  {
    MutexLock lock(&policy_mu_);
    // Still evictable? A reader may have taken it since it was chosen.
    if (!e.policy.linked) return false;
    policy_->Unlink(e.policy);
    policy_->Evicted(e.policy);
  }
  if (reused != nullptr && e.extent.length == reuse_length) {
    *reused = e.extent;
  } else {
    MutexLock space(&space_mu_);
    allocator_.Free(e.extent);
  }
  used_bytes_.fetch_sub(e.extent.length, std::memory_order_relaxed);
  shard.used_bytes -= e.extent.length;
  shard.segments--;
  shard.evictions++;
  shard.evicted_bytes += e.size;
  shard.entries.erase(it);
  return true;
}

Result<Extent> HostTier::MakeRoom(uint64_t size) {
  while (true) {
    uint64_t length;  // what the allocator makes of `size`
    {
      MutexLock space(&space_mu_);
      if (auto extent = allocator_.Allocate(size)) return *extent;
      length = allocator_.RoundUp(size);
    }
    // The policy's victim, then its entry under its shard's lock (a shard
    // lock is never taken under the policy's: lock order shard, policy).
    std::optional<SegmentKey> victim;
    {
      MutexLock lock(&policy_mu_);
      if (PolicyState* v = policy_->Victim()) victim = v->key;
    }
    if (victim) {
      Shard& shard = ShardFor(*victim);
      MutexLock lock(&shard.mu);
      std::optional<Extent> reused;
      (void)EvictLocked(shard, *victim, length, &reused);  // else raced
      if (reused) return *reused;
      continue;  // freed (another size) or raced: allocate or choose again
    }
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
    // One lookup: the new entry claims the key, or the stored one answers.
    auto [it, inserted] = shard.entries.try_emplace(key);
    if (!inserted) {
      if (!it->second.committed) {
        return Status::Busy("segment is being written by another client");
      }
      shard.dedup_hits++;
      UseLocked(shard, it->second);
      return Reservation{.already_stored = true};
    }
    std::optional<Extent> extent;
    {
      MutexLock space(&space_mu_);
      extent = allocator_.Allocate(size);
    }
    Entry& e = it->second;
    e.policy.key = key;
    e.size = size;
    if (extent) {  // the common case: free space, no eviction
      e.extent = *extent;
      e.policy.bytes = extent->length;
      shard.reserved_bytes += extent->length;
      reserved_bytes_.fetch_add(extent->length, std::memory_order_relaxed);
      return Reservation{.location = {extent->offset, size, extent->length}};
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
  return Reservation{.location = {extent->offset, size, extent->length}};
}

Status HostTier::Commit(const SegmentKey& key, bool dirty, bool acquire) {
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
    {
      MutexLock policy(&policy_mu_);
      policy_->Admit(e.policy, Tick());
    }
    if (acquire) {
      e.refs = 1;
      shard.referenced++;
    } else {
      LinkLocked(shard, e, /*persist_done=*/false);
    }
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
    UnlinkLocked(shard, e);
    shard.referenced++;
  }
  UseLocked(shard, e);
  return SegmentLocation{e.extent.offset, e.size, e.extent.length};
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
    if (!e.persisting) LinkLocked(shard, e, /*persist_done=*/false);
  }
}

bool HostTier::Touch(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || !it->second.committed) return false;
  UseLocked(shard, it->second);
  return true;
}

bool HostTier::Contains(const SegmentKey& key) const {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  auto it = shard.entries.find(key);
  return it != shard.entries.end() && it->second.committed;
}

uint64_t HostTier::SizeOf(const SegmentKey& key) const {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || !it->second.committed) return 0;
  return it->second.size;
}

Result<SegmentLocation> HostTier::Reserved(const SegmentKey& key) const {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || it->second.committed ||
      it->second.extent.length == 0) {
    return Status::NotFound("segment is not reserved");
  }
  const Entry& e = it->second;
  return SegmentLocation{e.extent.offset, e.size, e.extent.length};
}

bool HostTier::Drop(const SegmentKey& key) {
  Shard& shard = ShardFor(key);
  {
    MutexLock lock(&shard.mu);
    auto it = shard.entries.find(key);
    if (it == shard.entries.end()) return false;
    Entry& e = it->second;
    if (!e.committed || e.refs > 0 || e.persisting) return false;
    UnlinkLocked(shard, e);  // off the dirty list or out of the policy
    if (e.dirty) {
      shard.dirty_segments--;
      shard.dirty_bytes -= e.size;
      dirty_segments_.fetch_sub(1, std::memory_order_relaxed);
    }
    {
      MutexLock space(&space_mu_);
      allocator_.Free(e.extent);
    }
    used_bytes_.fetch_sub(e.extent.length, std::memory_order_relaxed);
    shard.used_bytes -= e.extent.length;
    shard.segments--;
    shard.entries.erase(it);
  }
  AdvanceGeneration();
  return true;
}

void HostTier::Report(std::span<const std::pair<SegmentKey, double>> reports) {
  for (const auto& [key, weight] : reports) {
    Shard& shard = ShardFor(key);
    MutexLock lock(&shard.mu);
    auto it = shard.entries.find(key);
    if (it == shard.entries.end() || !it->second.committed) continue;
    MutexLock policy(&policy_mu_);
    policy_->Report(it->second.policy, weight, Tick());
  }
}

void HostTier::SetSchedule(ScheduleTable table) {
  std::vector<SegmentKey> changed;
  {
    MutexLock policy(&policy_mu_);
    changed = policy_->SetSchedule(std::move(table));
  }
  // Lock order: shard, then policy. A segment committed between the swap
  // and its Rerank here was placed by the new table already.
  for (const SegmentKey& key : changed) {
    Shard& shard = ShardFor(key);
    MutexLock lock(&shard.mu);
    auto it = shard.entries.find(key);
    if (it == shard.entries.end() || !it->second.committed) continue;
    MutexLock policy(&policy_mu_);
    policy_->Rerank(it->second.policy);
  }
  AdvanceGeneration();  // a segment let go by its pin is evictable now
}

uint64_t HostTier::ReadyBytes() const {
  const uint64_t taken = used_bytes_.load(std::memory_order_relaxed) +
                         reserved_bytes_.load(std::memory_order_relaxed);
  const uint64_t free = taken >= capacity_bytes_ ? 0 : capacity_bytes_ - taken;
  uint64_t clean;
  {
    MutexLock lock(&policy_mu_);
    clean = policy_->linked_bytes();
  }
  return free + clean + persisting_bytes_.load(std::memory_order_relaxed);
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
    uint64_t best_rank = kNoDirty;
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
      best->PublishDirtyLocked();  // raced: republish and look again
      continue;
    }
    Entry& e = best->dirty.back();
    best->UnlinkDirtyLocked(e);
    e.persisting = true;
    persisting_bytes_.fetch_add(e.extent.length, std::memory_order_relaxed);
    out.push_back({e.policy.key, {e.extent.offset, e.size, e.extent.length}});
    bytes += e.size;
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
    if (e.refs == 0) LinkLocked(shard, e, /*persist_done=*/true);
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
    s.index_populated_bytes += shard->memory.populated_bytes();
    s.index_heap_bytes += shard->memory.heap_bytes();
  }
  MutexLock space(&space_mu_);
  s.largest_free_bytes = allocator_.Stats().largest_free_bytes;
  return s;
}

void HostTier::VisitCounters(TierCounterVisitor& v) const {
  const HostTierStats s = Stats();
  auto gauge = [&v](std::string_view name, uint64_t value) {
    v.Gauge(name, static_cast<double>(value));
  };
  gauge("capacity_bytes", s.capacity_bytes);
  gauge("used_bytes", s.used_bytes);
  gauge("reserved_bytes", s.reserved_bytes);
  gauge("dirty_bytes", s.dirty_bytes);
  gauge("largest_free_bytes", s.largest_free_bytes);
  gauge("segments", s.segments);
  gauge("referenced_segments", s.referenced_segments);
  gauge("dirty_segments", s.dirty_segments);
  gauge("index_populated_bytes", s.index_populated_bytes);
  gauge("index_heap_bytes", s.index_heap_bytes);
  v.Counter("inserts", s.inserts);
  v.Counter("dedup_hits", s.dedup_hits);
  v.Counter("evictions", s.evictions);
  v.Counter("evicted_bytes", s.evicted_bytes);
  v.Counter("aborts", s.aborts);
  v.Counter("backpressure_rejections", s.backpressure_rejections);
  v.Flag("hugepages", s.hugepages);
}

}  // namespace tierkv::storage
