#include "storage/lease_table.h"

#include <unordered_set>

namespace tierkv::storage {

LeaseTable::~LeaseTable() {
  MutexLock lock(&mu_);
  for (auto& [id, lease] : leases_) EndLease(lease);
}

void LeaseTable::EndLease(Lease& lease) {
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
  lease.keys = std::move(remaining);
  if (lease.keys.empty()) leases_.erase(it);
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
