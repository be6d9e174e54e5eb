// HbmTier (see hbm_tier.h).
#include "storage/device/hbm_tier.h"

#include <fmt/format.h>

namespace tierkv::storage {
namespace {

// Device copies are fastest 256-byte aligned (cudaMalloc's own alignment).
constexpr uint64_t kAlignment = 256;

}  // namespace

size_t HbmTier::KeyHash::operator()(const Key& k) const {
  return std::hash<SegmentKey>()(k.key) ^ (size_t{k.ns} * 0x9e3779b97f4a7c15);
}

HbmTier::HbmTier(uint64_t capacity_bytes, std::vector<uint64_t> quota_bytes)
    : capacity_(capacity_bytes / kAlignment * kAlignment),
      allocator_(capacity_, kAlignment) {
  MutexLock lock(&mu_);
  for (uint64_t q : quota_bytes) {
    NamespaceState n;
    n.quota = q == 0 ? capacity_ : std::min(q, capacity_);
    n.policy = NewEvictionPolicy(kPolicy);
    namespaces_.push_back(std::move(n));
  }
}

bool HbmTier::Contains(uint32_t ns, const SegmentKey& key) const {
  MutexLock lock(&mu_);
  auto it = entries_.find({ns, key});
  return it != entries_.end() && it->second.committed;
}

Result<SegmentLocation> HbmTier::Acquire(uint32_t ns, const SegmentKey& key) {
  MutexLock lock(&mu_);
  auto it = entries_.find({ns, key});
  if (it == entries_.end() || !it->second.committed) {
    ++misses_;
    return Status::NotFound("HBM tier: segment not held");
  }
  Entry& e = it->second;
  UnlinkLocked(ns, e);
  ++e.refs;
  ++hits_;
  return SegmentLocation{e.extent.offset, e.size};
}

void HbmTier::Release(uint32_t ns, const SegmentKey& key) {
  MutexLock lock(&mu_);
  auto it = entries_.find({ns, key});
  if (it == entries_.end() || it->second.refs == 0) return;
  if (--it->second.refs == 0) LinkLocked(ns, it->second);  // a use
}

Result<Reservation> HbmTier::Reserve(uint32_t ns, const SegmentKey& key,
                                     uint64_t size) {
  MutexLock lock(&mu_);
  if (ns >= namespaces_.size() || size == 0) {
    return Status::InvalidArgument("HBM tier: bad namespace or size");
  }
  const Key k{ns, key};
  if (auto it = entries_.find(k); it != entries_.end()) {
    if (!it->second.committed) {
      return Status::Busy("HBM tier: segment is being admitted");
    }
    return Reservation{.already_stored = true};
  }
  NamespaceState& n = namespaces_[ns];
  const uint64_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded > n.quota) {
    return NoRoomLocked(size, "larger than the namespace's quota");
  }
  // The namespace's own entries first, down to its quota ...
  while (n.used + rounded > n.quota) {
    if (!EvictOneLocked(ns)) {
      return NoRoomLocked(size, "the namespace's quota is all in use");
    }
  }
  // ... then the whole tier's least recent, until the allocation fits.
  std::optional<Extent> extent;
  while (!(extent = allocator_.Allocate(size))) {
    if (!EvictOneLocked(std::nullopt)) {
      return NoRoomLocked(size, "the tier is all in use");
    }
  }
  Entry& e = entries_[k];
  e.extent = *extent;
  e.size = size;
  e.policy.key = key;
  e.policy.bytes = extent->length;
  n.used += extent->length;
  used_ += extent->length;
  return Reservation{.location = {extent->offset, size}};
}

Status HbmTier::Commit(uint32_t ns, const SegmentKey& key, bool acquire) {
  MutexLock lock(&mu_);
  auto it = entries_.find({ns, key});
  if (it == entries_.end() || it->second.committed) {
    return Status::NotFound("HBM tier: segment is not reserved");
  }
  Entry& e = it->second;
  e.committed = true;
  ++segments_;
  ++namespaces_[ns].segments;
  ++admissions_;
  EvictionPolicy& policy = *namespaces_[ns].policy;
  const uint64_t now = ++clock_;
  policy.Admit(e.policy, now);
  if (acquire) {
    e.refs = 1;  // evictable from its Release on
  } else {
    policy.Link(e.policy, now, LinkAt::kNow);
  }
  return Status::OK();
}

void HbmTier::Abort(uint32_t ns, const SegmentKey& key) {
  MutexLock lock(&mu_);
  auto it = entries_.find({ns, key});
  if (it == entries_.end() || it->second.committed) return;
  DropLocked(it);
}

uint64_t HbmTier::quota_bytes(uint32_t ns) const {
  MutexLock lock(&mu_);
  return ns < namespaces_.size() ? namespaces_[ns].quota : 0;
}

Status HbmTier::NoRoomLocked(uint64_t size, std::string_view why) {
  ++admission_failures_;
  return Status::ResourceExhausted(
      fmt::format("HBM tier: no room for {} B ({})", size, why));
}

void HbmTier::LinkLocked(uint32_t ns, Entry& e) {
  if (e.policy.linked || !e.committed) return;
  EvictionPolicy& policy = *namespaces_[ns].policy;
  const uint64_t now = ++clock_;
  policy.Use(e.policy, now);
  policy.Link(e.policy, now, LinkAt::kNow);
}

void HbmTier::UnlinkLocked(uint32_t ns, Entry& e) {
  if (e.policy.linked) namespaces_[ns].policy->Unlink(e.policy);
}

bool HbmTier::EvictOneLocked(std::optional<uint32_t> ns) {
  // The namespace's victim, or the least recent of every namespace's.
  uint32_t from = 0;
  PolicyState* victim = nullptr;
  for (uint32_t n = 0; n < namespaces_.size(); ++n) {
    if (ns && n != *ns) continue;
    PolicyState* v = namespaces_[n].policy->Victim();
    if (v != nullptr && (victim == nullptr || v->last_use < victim->last_use)) {
      victim = v;
      from = n;
    }
  }
  if (victim == nullptr) return false;
  EvictionPolicy& policy = *namespaces_[from].policy;
  policy.Unlink(*victim);
  policy.Evicted(*victim);
  auto it = entries_.find({from, victim->key});
  ++evictions_;
  evicted_bytes_ += it->second.size;
  DropLocked(it);
  return true;
}

void HbmTier::DropLocked(std::unordered_map<Key, Entry, KeyHash>::iterator it) {
  Entry& e = it->second;
  UnlinkLocked(it->first.ns, e);
  NamespaceState& n = namespaces_[it->first.ns];
  n.used -= e.extent.length;
  used_ -= e.extent.length;
  if (e.committed) {
    --n.segments;
    --segments_;
  }
  allocator_.Free(e.extent);
  entries_.erase(it);
}

HbmTierStats HbmTier::Stats() const {
  MutexLock lock(&mu_);
  HbmTierStats s;
  s.capacity_bytes = capacity_;
  s.used_bytes = used_;
  s.segments = segments_;
  s.hits = hits_;
  s.misses = misses_;
  s.admissions = admissions_;
  s.admission_failures = admission_failures_;
  s.evictions = evictions_;
  s.evicted_bytes = evicted_bytes_;
  for (const NamespaceState& n : namespaces_) {
    s.namespaces.push_back({n.quota, n.used, n.segments});
  }
  return s;
}

void HbmTier::VisitCounters(TierCounterVisitor& v) const {
  const HbmTierStats s = Stats();
  v.Gauge("capacity_bytes", static_cast<double>(s.capacity_bytes));
  v.Gauge("used_bytes", static_cast<double>(s.used_bytes));
  v.Gauge("segments", static_cast<double>(s.segments));
  v.Counter("hits", s.hits);
  v.Counter("misses", s.misses);
  v.Counter("admissions", s.admissions);
  v.Counter("admission_failures", s.admission_failures);
  v.Counter("evictions", s.evictions);
  v.Counter("evicted_bytes", s.evicted_bytes);
}

Status HbmNamespaceTier::Commit(const SegmentKey& key, bool dirty,
                                bool acquire) {
  if (dirty) {
    tier_->Abort(ns_, key);
    return Status::InvalidArgument(
        "HBM tier: holds copies only, a segment cannot be dirty here");
  }
  return tier_->Commit(ns_, key, acquire);
}

void HbmTier::VisitNamespaceCounters(uint32_t ns, TierCounterVisitor& v) const {
  uint64_t quota = 0, used = 0, segments = 0;
  {
    MutexLock lock(&mu_);
    if (ns >= namespaces_.size()) return;
    const NamespaceState& n = namespaces_[ns];
    quota = n.quota;
    used = n.used;
    segments = n.segments;
  }
  v.Gauge("quota_bytes", static_cast<double>(quota));
  v.Gauge("used_bytes", static_cast<double>(used));
  v.Gauge("segments", static_cast<double>(segments));
}

}  // namespace tierkv::storage
