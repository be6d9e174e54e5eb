// LeaseTable: leases by id, usage per owner and per tier.
#include "storage/lease/lease_table.h"

#include <algorithm>
#include <unordered_set>

namespace tierkv::storage {

LeaseTable::~LeaseTable() {
  MutexLock lock(&mu_);
  for (auto& [id, lease] : leases_) EndLease(lease);
}

LeaseTable::Usage LeaseTable::UsageOf(std::span<const LeasedSegment> segments,
                                      size_t leases) {
  Usage u{leases, segments.size(), 0};
  for (const LeasedSegment& s : segments) u.bytes += s.bytes;
  return u;
}

void LeaseTable::Account(uint64_t owner, const LeasedTier* tier,
                         const Usage& delta) {
  Usage& u = owners_[owner];
  u += delta;
  if (u.empty()) owners_.erase(owner);
  Usage& t = tiers_[tier];
  t += delta;
  if (t.empty()) tiers_.erase(tier);
}

size_t LeaseTable::Room(uint64_t owner, const LeasedTier* tier, size_t want,
                        const char** limit_name) const {
  MutexLock lock(&mu_);
  Usage u;
  if (auto it = owners_.find(owner); it != owners_.end()) u = it->second;
  size_t t = 0;
  if (auto it = tiers_.find(tier); it != tiers_.end()) t = it->second.segments;
  auto left = [](size_t limit, size_t used) {
    return used >= limit ? 0 : limit - used;
  };
  size_t room = want;
  const char* name = nullptr;
  auto cap = [&](size_t r, const char* n) {
    if (r < room) {
      room = r;
      name = n;
    }
  };
  if (u.leases >= limits_.max_leases_per_owner) cap(0, "leases per connection");
  cap(left(limits_.max_segments_per_owner, u.segments),
      "leased segments per connection");
  cap(left(limits_.max_segments_per_tier, t), "leased segments per namespace");
  if (limit_name) *limit_name = name;
  return room;
}

size_t LeaseTable::FitBytes(uint64_t owner, const LeasedTier* tier,
                            std::span<const uint64_t> sizes,
                            const char** limit_name) const {
  MutexLock lock(&mu_);
  uint64_t owner_bytes = 0, tier_bytes = 0;
  if (auto it = owners_.find(owner); it != owners_.end()) {
    owner_bytes = it->second.bytes;
  }
  if (auto it = tiers_.find(tier); it != tiers_.end()) {
    tier_bytes = it->second.bytes;
  }
  const uint64_t capacity = tier->capacity_bytes();
  auto percent = [capacity](uint32_t p) {  // exact, and no overflow
    return capacity / 100 * p + capacity % 100 * p / 100;
  };
  const uint64_t owner_limit = percent(limits_.max_bytes_percent_per_owner);
  const uint64_t tier_limit = percent(limits_.max_bytes_percent_per_tier);
  size_t n = 0;
  const char* name = nullptr;
  for (; n < sizes.size(); ++n) {
    owner_bytes += sizes[n];
    tier_bytes += sizes[n];
    if (owner_bytes > owner_limit) {
      name = "leased bytes per connection";
      break;
    }
    if (tier_bytes > tier_limit) {
      name = "leased bytes per namespace";
      break;
    }
  }
  if (limit_name) *limit_name = name;
  return n;
}

size_t LeaseTable::leases_of(uint64_t owner) const {
  MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.leases;
}

size_t LeaseTable::leases_on(const LeasedTier* tier) const {
  MutexLock lock(&mu_);
  auto it = tiers_.find(tier);
  return it == tiers_.end() ? 0 : it->second.leases;
}

size_t LeaseTable::segments_of(uint64_t owner) const {
  MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.segments;
}

uint64_t LeaseTable::bytes_of(uint64_t owner) const {
  MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.bytes;
}

void LeaseTable::EndLease(Lease& lease) {
  Account(lease.owner, lease.tier, -UsageOf(lease.segments, 1));
  for (const LeasedSegment& s : lease.segments) {
    if (lease.kind == LeaseKind::kWrite) {
      lease.tier->Abort(s.key);
    } else {
      lease.tier->Release(s.key);
    }
  }
  lease.segments.clear();
}

uint64_t LeaseTable::Add(uint64_t owner, LeaseKind kind, LeasedTier* tier,
                         std::vector<LeasedSegment> segments,
                         std::chrono::milliseconds ttl) {
  MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  Account(owner, tier, UsageOf(segments, 1));
  leases_.emplace(
      id, Lease{owner, kind, tier, std::move(segments), clock_->Now() + ttl});
  return id;
}

Status LeaseTable::Release(uint64_t owner, uint64_t lease_id) {
  MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.owner != owner) {
    return Status::NotFound("no such lease (expired or not yours)");
  }
  EndLease(it->second);
  leases_.erase(it);
  return Status::OK();
}

std::vector<Status> LeaseTable::Commit(uint64_t owner, uint64_t lease_id,
                                       std::span<const SegmentKey> keys,
                                       bool dirty, bool last_first) {
  MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.owner != owner ||
      it->second.kind != LeaseKind::kWrite) {
    return std::vector<Status>(
        keys.size(),
        Status::NotFound("no such write lease (expired or not yours)"));
  }
  Lease& lease = it->second;
  std::vector<LeasedSegment> remaining, done;
  // The common case, without a hash set: `keys` is a subsequence of the
  // lease's segments, in reservation order (a client commits what it
  // copied, in the order it reserved). Then done[i] is keys[i].
  size_t matched = 0;
  for (const LeasedSegment& s : lease.segments) {
    const bool next = matched < keys.size() && s.key == keys[matched];
    (next ? done : remaining).push_back(s);
    matched += next;
  }
  const bool in_order = matched == keys.size();
  if (!in_order) {  // any order, duplicates and strangers: match by key
    const std::unordered_set<SegmentKey> to_commit(keys.begin(), keys.end());
    done.clear();
    remaining.clear();
    for (const LeasedSegment& s : lease.segments) {
      (to_commit.count(s.key) ? done : remaining).push_back(s);
    }
  }
  std::vector<Status> statuses(done.size());  // of done[i]
  for (size_t n = 0; n < done.size(); ++n) {
    const size_t i = last_first ? done.size() - 1 - n : n;
    statuses[i] = lease.tier->Commit(done[i].key, dirty);
  }
  lease.segments = std::move(remaining);
  const bool ended = lease.segments.empty();
  Account(lease.owner, lease.tier, -UsageOf(done, ended ? 1 : 0));
  if (ended) leases_.erase(it);  // `lease` is gone
  if (in_order) return statuses;
  std::vector<Status> out;
  out.reserve(keys.size());
  std::unordered_map<SegmentKey, Status> committed;
  for (size_t i = 0; i < done.size(); ++i) {
    committed.emplace(done[i].key, std::move(statuses[i]));
  }
  for (const auto& key : keys) {
    auto c = committed.find(key);
    if (c == committed.end()) {
      out.push_back(Status::NotFound("segment is not reserved by this lease"));
    } else {
      out.push_back(c->second);
      committed.erase(c);  // a duplicate key in `keys` commits once
    }
  }
  return out;
}

void LeaseTable::Abort(uint64_t owner, uint64_t lease_id,
                       std::span<const SegmentKey> keys) {
  MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.owner != owner ||
      it->second.kind != LeaseKind::kWrite) {
    return;
  }
  Lease& lease = it->second;
  const std::unordered_set<SegmentKey> to_abort(keys.begin(), keys.end());
  std::vector<LeasedSegment> remaining, aborted;
  for (const LeasedSegment& s : lease.segments) {
    (to_abort.count(s.key) ? aborted : remaining).push_back(s);
  }
  for (const LeasedSegment& s : aborted) lease.tier->Abort(s.key);
  lease.segments = std::move(remaining);
  const bool ended = lease.segments.empty();
  Account(lease.owner, lease.tier, -UsageOf(aborted, ended ? 1 : 0));
  if (ended) leases_.erase(it);
}

size_t LeaseTable::ReleaseOwner(uint64_t owner) {
  MutexLock lock(&mu_);
  return EndLeasesLocked(
      [owner](const Lease& lease) { return lease.owner == owner; });
}

size_t LeaseTable::ExpireDue() {
  const auto now = clock_->Now();
  MutexLock lock(&mu_);
  return EndLeasesLocked(
      [now](const Lease& lease) { return lease.expires <= now; });
}

size_t LeaseTable::EndLeasesLocked(
    const std::function<bool(const Lease&)>& ends) {
  size_t n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (ends(it->second)) {
      EndLease(it->second);
      it = leases_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

size_t LeaseTable::size() const {
  MutexLock lock(&mu_);
  return leases_.size();
}

}  // namespace tierkv::storage
