// HbmTier: tier T0, segments kept in the daemon's device pool (DESIGN.md
// §3), in front of host DRAM for loads into engines' device pools.
//
// The tier is an inclusive cache: what it holds is a copy of a segment
// that was loaded from, or stored into, the tiers below, so dropping an
// entry loses nothing and eviction is a plain unlink (the host copy is
// kept, or was written back by the host tier's own policy). Segments are
// immutable (content-addressed by page hash), so a copy never goes stale.
//
// Space: one device pool, allocated once by the daemon, carved by an
// ExtentAllocator (best fit, 256-byte aligned: the pool's "slab" for
// segments of every (layer, part) size). Eviction: through EvictionPolicy
// (`lru`), one per namespace over its entries nobody references; the
// tier's victim is the least recent of the namespaces' victims, so the
// whole tier is exact LRU, in O(namespaces). Quotas: a namespace may hold
// at most its quota; past it, its own least recent entries go first, so
// one tenant cannot flush another's HBM working set.
//
// Bytes move outside the tier: Reserve hands out an offset in the pool,
// the caller copies into it on a device stream and Commits after the
// copy's event (or Aborts); Acquire pins an entry while a copy reads it.
//
// Thread safety: thread-safe (one mutex; every call is O(1) amortized).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "storage/alloc/extent_allocator.h"
#include "storage/policy/eviction_policy.h"
#include "storage/policy/eviction_policy_kind.h"
#include "storage/tier/leased_tier.h"
#include "storage/tier/tier.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::storage {

struct HbmTierStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // committed and reserved, rounded
  uint64_t segments = 0;    // committed
  uint64_t hits = 0;        // Acquire found the segment
  uint64_t misses = 0;
  uint64_t admissions = 0;          // Commit
  uint64_t admission_failures = 0;  // Reserve found no room
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  struct Namespace {
    uint64_t quota_bytes = 0;
    uint64_t used_bytes = 0;
    uint64_t segments = 0;
  };
  std::vector<Namespace> namespaces;  // by namespace index
};

class HbmTier {
 public:
  // `quota_bytes[n]`: what namespace n may hold (0: the whole capacity).
  HbmTier(uint64_t capacity_bytes, std::vector<uint64_t> quota_bytes);

  HbmTier(const HbmTier&) = delete;
  HbmTier& operator=(const HbmTier&) = delete;

  // True when the committed segment is here (for Match; takes no ref).
  bool Contains(uint32_t ns, const SegmentKey& key) const;
  // References the committed segment (not evictable until Release): where
  // it is in the pool and its size. NotFound on a miss.
  Result<SegmentLocation> Acquire(uint32_t ns, const SegmentKey& key);
  void Release(uint32_t ns, const SegmentKey& key);

  // Room for a new segment (evicting as needed): its offset in the pool,
  // or already_stored when it is here. Busy while another copy of it is
  // being admitted; ResourceExhausted when no room can be made (everything
  // referenced, or larger than the quota or the pool).
  Result<Reservation> Reserve(uint32_t ns, const SegmentKey& key,
                              uint64_t size);
  // The reserved segment's bytes are in place: it can be hit; with
  // `acquire` it is referenced at once (Release it). NotFound when `key`
  // is not reserved.
  Status Commit(uint32_t ns, const SegmentKey& key, bool acquire = false);
  // The copy failed: the reservation is dropped.
  void Abort(uint32_t ns, const SegmentKey& key);

  // What namespace `ns` may hold (0 for an unknown `ns`).
  uint64_t quota_bytes(uint32_t ns) const;

  HbmTierStats Stats() const;

  // Its name and eviction policy in stats and metrics.
  static constexpr std::string_view name() { return "hbm"; }
  std::string_view policy() const { return EvictionPolicyName(kPolicy); }
  // Stats() in the tier counter vocabulary (tier_counters.h): the whole
  // tier, and namespace `ns`'s share (quota_bytes, used_bytes, segments;
  // nothing for an unknown `ns`).
  void VisitCounters(TierCounterVisitor& visitor) const;
  void VisitNamespaceCounters(uint32_t ns, TierCounterVisitor& visitor) const;

 private:
  struct Key {
    uint32_t ns = 0;
    SegmentKey key;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Entry {
    Extent extent;
    uint64_t size = 0;
    uint32_t refs = 0;
    bool committed = false;
    // Linked into its namespace's policy while evictable (committed and
    // unreferenced).
    PolicyState policy;
  };
  struct NamespaceState {
    uint64_t quota = 0;
    uint64_t used = 0;
    uint64_t segments = 0;
    std::unique_ptr<EvictionPolicy> policy;
  };

  Status NoRoomLocked(uint64_t size, std::string_view why) REQUIRES(mu_);
  // `e` became evictable again, as used now (its last release).
  void LinkLocked(uint32_t ns, Entry& e) REQUIRES(mu_);
  void UnlinkLocked(uint32_t ns, Entry& e) REQUIRES(mu_);
  // Evicts the least recent evictable entry of `ns` (or of the whole tier
  // for nullopt); false when there is none.
  bool EvictOneLocked(std::optional<uint32_t> ns) REQUIRES(mu_);
  void DropLocked(std::unordered_map<Key, Entry, KeyHash>::iterator it)
      REQUIRES(mu_);

  // Every namespace's order (see the top).
  static constexpr EvictionPolicyKind kPolicy = EvictionPolicyKind::kLru;

  const uint64_t capacity_;
  mutable Mutex mu_;
  ExtentAllocator allocator_ GUARDED_BY(mu_);
  // Node-based: an entry (and the PolicyState a policy links) keeps its
  // address until erased.
  std::unordered_map<Key, Entry, KeyHash> entries_ GUARDED_BY(mu_);
  std::vector<NamespaceState> namespaces_ GUARDED_BY(mu_);
  uint64_t clock_ GUARDED_BY(mu_) = 0;  // one tick per policy event
  uint64_t used_ GUARDED_BY(mu_) = 0;
  uint64_t segments_ GUARDED_BY(mu_) = 0;
  uint64_t hits_ GUARDED_BY(mu_) = 0;
  uint64_t misses_ GUARDED_BY(mu_) = 0;
  uint64_t admissions_ GUARDED_BY(mu_) = 0;
  uint64_t admission_failures_ GUARDED_BY(mu_) = 0;
  uint64_t evictions_ GUARDED_BY(mu_) = 0;
  uint64_t evicted_bytes_ GUARDED_BY(mu_) = 0;
};

// Namespace `ns`'s share of an HbmTier as a LeasedTier (the engine's
// leased paths and the lease table see HBM and host alike). Holds no state
// of its own. Nothing in HBM is dirty (the tier holds copies): Commit with
// `dirty` is InvalidArgument and TakeDirty finds nothing.
class HbmNamespaceTier final : public LeasedTier {
 public:
  // `tier` is borrowed and must outlive the view.
  HbmNamespaceTier(HbmTier* tier, uint32_t ns) : tier_(tier), ns_(ns) {}

  std::string_view name() const override { return HbmTier::name(); }
  std::string_view policy() const override { return tier_->policy(); }
  uint64_t capacity_bytes() const override { return tier_->quota_bytes(ns_); }
  Result<Reservation> Reserve(const SegmentKey& key, uint64_t size) override {
    return tier_->Reserve(ns_, key, size);
  }
  Status Commit(const SegmentKey& key, bool dirty = false,
                bool acquire = false) override;
  void Abort(const SegmentKey& key) override { tier_->Abort(ns_, key); }
  Result<SegmentLocation> Acquire(const SegmentKey& key) override {
    return tier_->Acquire(ns_, key);
  }
  void Release(const SegmentKey& key) override { tier_->Release(ns_, key); }
  std::vector<DirtySegment> TakeDirty(size_t, uint64_t, bool) override {
    return {};
  }
  void FinishPersist(const SegmentKey&, bool, bool) override {}
  void VisitCounters(TierCounterVisitor& visitor) const override {
    tier_->VisitNamespaceCounters(ns_, visitor);
  }

  // True when the committed segment is here (for Match; not a use).
  bool Contains(const SegmentKey& key) const {
    return tier_->Contains(ns_, key);
  }

 private:
  HbmTier* const tier_;
  const uint32_t ns_;
};

}  // namespace tierkv::storage
