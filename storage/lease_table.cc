#include "storage/lease_table.h"

#include <unordered_set>

namespace tierkv::storage {

LeaseTable::~LeaseTable() {
  MutexLock lock(&mu_);
  for (auto& [id, lease] : leases_) EndLease(lease);
}

void LeaseTable::Account(uint64_t owner, const HostTier* tier, ptrdiff_t leases,
                         ptrdiff_t segments) {
  // Unsigned wrap-around makes += of a negative delta a subtraction.
  Usage& u = owners_[owner];
  u.leases += static_cast<size_t>(leases);
  u.segments += static_cast<size_t>(segments);
  if (u.leases == 0 && u.segments == 0) owners_.erase(owner);
  Usage& t = tiers_[tier];
  t.leases += static_cast<size_t>(leases);
  t.segments += static_cast<size_t>(segments);
  if (t.leases == 0 && t.segments == 0) tiers_.erase(tier);
}

size_t LeaseTable::Room(uint64_t owner, const HostTier* tier, size_t want,
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

size_t LeaseTable::leases_of(uint64_t owner) const {
  MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.leases;
}

size_t LeaseTable::leases_on(const HostTier* tier) const {
  MutexLock lock(&mu_);
  auto it = tiers_.find(tier);
  return it == tiers_.end() ? 0 : it->second.leases;
}

size_t LeaseTable::segments_of(uint64_t owner) const {
  MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.segments;
}

void LeaseTable::EndLease(Lease& lease) {
  Account(lease.owner, lease.tier, -1,
          -static_cast<ptrdiff_t>(lease.keys.size()));
  for (const auto& key : lease.keys) {
    if (lease.kind == LeaseKind::kWrite) {
      lease.tier->Abort(key);
    } else {
      lease.tier->Release(key);
    }
  }
  lease.keys.clear();
}

uint64_t LeaseTable::Add(uint64_t owner, LeaseKind kind, HostTier* tier,
                         std::vector<SegmentKey> keys,
                         std::chrono::milliseconds ttl) {
  MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  Account(owner, tier, 1, static_cast<ptrdiff_t>(keys.size()));
  leases_.emplace(
      id, Lease{owner, kind, tier, std::move(keys), clock_->Now() + ttl});
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
                                       bool dirty) {
  std::vector<Status> out;
  out.reserve(keys.size());
  MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.owner != owner ||
      it->second.kind != LeaseKind::kWrite) {
    out.assign(keys.size(),
               Status::NotFound("no such write lease (expired or not yours)"));
    return out;
  }
  Lease& lease = it->second;
  std::unordered_set<SegmentKey> to_commit(keys.begin(), keys.end());
  std::vector<SegmentKey> remaining;
  std::unordered_map<SegmentKey, Status> committed;
  for (const auto& key : lease.keys) {
    if (to_commit.count(key)) {
      committed.emplace(key, lease.tier->Commit(key, dirty));
    } else {
      remaining.push_back(key);
    }
  }
  Account(lease.owner, lease.tier, 0,
          static_cast<ptrdiff_t>(remaining.size()) -
              static_cast<ptrdiff_t>(lease.keys.size()));
  lease.keys = std::move(remaining);
  if (lease.keys.empty()) {
    Account(lease.owner, lease.tier, -1, 0);
    leases_.erase(it);
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

size_t LeaseTable::ReleaseOwner(uint64_t owner) {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.owner == owner) {
      EndLease(it->second);
      it = leases_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

size_t LeaseTable::ExpireDue() {
  const auto now = clock_->Now();
  MutexLock lock(&mu_);
  size_t n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires <= now) {
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
