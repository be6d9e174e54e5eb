// CacheEngine's client-addressed DRAM access: Reserve, Commit, Acquire and
// Pin under leases (and the lease limits they answer), promotion on a
// Get's miss (see cache_engine.h).
#include <fmt/format.h>

#include <tuple>

#include "storage/engine/cache_engine.h"

namespace tierkv::storage {

void CacheEngine::Reserve(uint64_t owner, EngineNamespace& ns,
                          std::vector<SegmentSize> items,
                          std::function<void(EngineReservation)> done) {
  EngineReservation r;
  r.items.reserve(items.size());
  std::vector<size_t> busy;
  LeaseRoomCheck room = CheckLeaseRoom(owner, ns, items.size());
  const std::vector<bool> held_below =
      ns.weights_ ? ChunksHeldBelow(ns, items) : std::vector<bool>{};
  for (size_t i = 0; i < items.size(); ++i) {
    if (i >= room.room) {
      r.items.push_back(room.error);
      continue;
    }
    if (Status s = CheckSize(ns, items[i].key, items[i].size); !s.ok()) {
      r.items.push_back(std::move(s));
      continue;
    }
    if (!held_below.empty() && held_below[i]) {
      // Content-addressed: the copy below has these very bytes. Neither
      // copied nor promoted (a re-import after a restart must not refill
      // DRAM); a Get or a prefetch promotes it when it is read.
      lower_tier_dedup_hits_.fetch_add(1, std::memory_order_relaxed);
      r.items.push_back(Reservation{.already_stored = true});
      continue;
    }
    r.items.push_back(ns.host_->Reserve(items[i].key, items[i].size));
    if (r.items.back().status().code() == StatusCode::kBusy) {
      busy.push_back(i);
    }
  }
  if (busy.empty() || !mover_) {
    FinishReserve(owner, ns, std::move(items), std::move(r), {}, false,
                  std::move(done));
    return;
  }
  // Waiting for the write-back blocks: never on the caller's thread.
  // Counted here, before the wait is queued, so the count is visible when
  // Reserve returns.
  backpressure_waits_.fetch_add(1, std::memory_order_relaxed);
  mover_->Kick();
  auto state = std::make_shared<
      std::tuple<std::vector<SegmentSize>, EngineReservation,
                 std::vector<size_t>, std::function<void(EngineReservation)>>>(
      std::move(items), std::move(r), std::move(busy), std::move(done));
  const bool queued = Submit([this, owner, &ns, state] {
    auto& [i, r, b, d] = *state;
    FinishReserve(owner, ns, std::move(i), std::move(r), std::move(b),
                  /*wait=*/true, std::move(d));
  });
  if (!queued) {
    backpressure_waits_.fetch_sub(1, std::memory_order_relaxed);
    auto& [i, r, b, d] = *state;
    FinishReserve(owner, ns, std::move(i), std::move(r), {}, false,
                  std::move(d));
  }
}

void CacheEngine::FinishReserve(uint64_t owner, EngineNamespace& ns,
                                std::vector<SegmentSize> items,
                                EngineReservation r, std::vector<size_t> busy,
                                bool wait,
                                std::function<void(EngineReservation)> done) {
  if (wait && !busy.empty()) {
    const auto deadline = options_.clock->Now() + options_.write_back_wait;
    for (size_t i : busy) {
      r.items[i] =
          ReserveAfterWriteBack(ns, items[i].key, items[i].size, deadline);
    }
  }
  std::vector<std::pair<size_t, LeasedSegment>> candidates;
  for (size_t i = 0; i < items.size(); ++i) {
    if (r.items[i].ok() && !r.items[i]->already_stored) {
      candidates.push_back({i, {items[i].key, items[i].size}});
    }
  }
  std::vector<LeasedSegment> reserved =
      AdmitLeaseBytes(owner, ns, candidates, [&](size_t i, Status refused) {
        ns.host_->Abort(items[i].key);
        r.items[i] = std::move(refused);
      });
  if (!reserved.empty()) {
    r.lease_id = leases_->Add(owner, LeaseKind::kWrite, ns.host_.get(),
                              std::move(reserved), options_.lease_ttl);
  }
  done(std::move(r));
}

Result<Reservation> CacheEngine::ReserveAfterWriteBack(
    EngineNamespace& ns, const SegmentKey& key, uint64_t size,
    Clock::TimePoint deadline) {
  Result<Reservation> r = Status::Busy("write-back backpressure");
  // Each retry needs a reason: a commit, abort or finished write-back in
  // the tier since the last attempt.
  while (r.status().code() == StatusCode::kBusy) {
    const uint64_t seen = ns.host_->Generation();
    r = ns.host_->Reserve(key, size);
    if (r.status().code() != StatusCode::kBusy) break;
    mover_->Kick();
    if (!ns.host_->WaitChange(seen, *options_.clock, deadline)) break;
  }
  if (r.status().code() == StatusCode::kBusy) {
    backpressure_busy_.fetch_add(1, std::memory_order_relaxed);
  }
  return r;
}

std::vector<Status> CacheEngine::Commit(uint64_t owner, EngineNamespace& ns,
                                        uint64_t lease_id,
                                        std::span<const SegmentKey> keys) {
  const bool dirty = ns.tiers_.policy != WritePolicy::kNone;
  if (!ns.weights_) {
    std::vector<Status> out =
        leases_->Commit(owner, lease_id, keys, dirty, DeepestFirst(ns));
    if (dirty && mover_) mover_->Kick();
    return out;
  }
  // Hashed before anything commits: a chunk that fails never becomes
  // readable, not even for a moment.
  std::vector<Status> out = VerifyChunks(ns, keys);
  std::vector<SegmentKey> good, bad;
  std::vector<size_t> good_at;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (out[i].ok()) {
      good.push_back(keys[i]);
      good_at.push_back(i);
    } else {
      bad.push_back(keys[i]);
    }
  }
  if (!bad.empty()) leases_->Abort(owner, lease_id, bad);
  std::vector<Status> committed =
      leases_->Commit(owner, lease_id, good, dirty, DeepestFirst(ns));
  for (size_t j = 0; j < good_at.size(); ++j) {
    out[good_at[j]] = std::move(committed[j]);
  }
  if (dirty && mover_) mover_->Kick();
  return out;
}

void CacheEngine::Acquire(uint64_t owner, EngineNamespace& ns,
                          std::vector<SegmentKey> keys,
                          std::function<void(EngineRead)> done,
                          TierScope scope) {
  EngineRead read;
  read.items.reserve(keys.size());
  read.source.assign(keys.size(), tierkv::Tier::kMiss);
  std::vector<size_t> missing;
  LeaseRoomCheck room = CheckLeaseRoom(owner, ns, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i >= room.room) {
      read.items.push_back(room.error);
      continue;
    }
    Result<SegmentLocation> loc = ns.host_->Acquire(keys[i]);
    if (loc.ok()) {
      read.source[i] = tierkv::Tier::kHost;
    } else if (!chain_->empty() && loc.status().IsNotFound()) {
      missing.push_back(i);
    }
    read.items.push_back(std::move(loc));
  }
  if (missing.empty()) {
    FinishAcquire(owner, ns, std::move(keys), std::move(read), {}, {},
                  std::move(done));
    return;
  }
  // Promotion reads below DRAM: never on the caller's (socket) thread, and
  // no worker waits for the read either: a worker plans it (Locate,
  // Reserve) and its completion, on the tier's thread, finishes the
  // Acquire. The references taken above travel with it.
  auto state = std::make_shared<AcquireState>(
      AcquireState{std::move(keys), std::move(read), std::move(missing),
                   std::move(done), scope});
  if (!Submit(
          [this, owner, &ns, state] { PromoteForAcquire(owner, ns, state); })) {
    for (size_t i : state->missing) {
      state->read.items[i] =
          Status::Busy("daemon workers are saturated; retry");
    }
    FinishAcquire(owner, ns, std::move(state->keys), std::move(state->read), {},
                  {}, std::move(state->done));
  }
}

void CacheEngine::PromoteForAcquire(
    uint64_t owner, EngineNamespace& ns,
    const std::shared_ptr<AcquireState>& state) {
  std::vector<SegmentKey> wanted;
  wanted.reserve(state->missing.size());
  for (size_t i : state->missing) wanted.push_back(state->keys[i]);
  BeginTierRead();
  // Held: a promoted segment is referenced from its commit on, so a
  // concurrent reservation cannot evict it before this read takes it.
  mover_->PromoteBatchAsync(
      ns.tiers_, std::move(wanted),
      options_.clock->Now() + options_.write_back_wait, /*hold=*/true,
      // A wait for write-back room is a worker's to do.
      [this](std::function<void()> job) { return Submit(std::move(job)); },
      [this, owner, &ns, state](TierMover::Promoted promoted) {
        FinishAcquire(owner, ns, std::move(state->keys), std::move(state->read),
                      std::move(state->missing), std::move(promoted),
                      std::move(state->done));
        EndTierRead();
      },
      state->scope);
}

void CacheEngine::FinishAcquire(uint64_t owner, EngineNamespace& ns,
                                std::vector<SegmentKey> keys, EngineRead read,
                                std::vector<size_t> missing,
                                TierMover::Promoted promoted,
                                std::function<void(EngineRead)> done) {
  for (size_t m = 0; m < missing.size(); ++m) {
    const size_t i = missing[m];
    if (!promoted.results[m].ok()) {
      read.items[i] = std::move(promoted.results[m]);
      continue;
    }
    // The read's own reference, then the promotion's handed back.
    read.items[i] = ns.host_->Acquire(keys[i]);
    ns.host_->Release(keys[i]);
    if (read.items[i].ok()) read.source[i] = promoted.sources[m];
  }
  std::vector<std::pair<size_t, LeasedSegment>> candidates;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (read.items[i].ok()) {
      candidates.push_back({i, {keys[i], read.items[i]->size}});
    }
  }
  std::vector<LeasedSegment> leased =
      AdmitLeaseBytes(owner, ns, candidates, [&](size_t i, Status refused) {
        ns.host_->Release(keys[i]);
        read.items[i] = std::move(refused);
        read.source[i] = tierkv::Tier::kMiss;
      });
  if (!leased.empty()) {
    read.lease_id = leases_->Add(owner, LeaseKind::kRead, ns.host_.get(),
                                 std::move(leased), options_.lease_ttl);
  }
  done(std::move(read));
}

Result<EnginePin> CacheEngine::Pin(uint64_t owner, EngineNamespace& ns,
                                   std::span<const SegmentKey> keys,
                                   std::chrono::milliseconds ttl) {
  if (ttl.count() <= 0 || ttl > options_.max_pin_ttl) {
    return Status::InvalidArgument(fmt::format("pin ttl must be in [1, {}] ms",
                                               options_.max_pin_ttl.count()));
  }
  EnginePin out;
  std::vector<std::pair<size_t, LeasedSegment>> candidates;
  LeaseRoomCheck room = CheckLeaseRoom(owner, ns, keys.size());
  for (const SegmentKey& key : keys) {
    if (out.items.size() >= room.room) {
      out.items.push_back(room.error);
      continue;
    }
    auto found = ns.host_->Acquire(key);
    out.items.push_back(found.status());
    if (found.ok())
      candidates.push_back({out.items.size() - 1, {key, found->size}});
  }
  std::vector<LeasedSegment> pinned =
      AdmitLeaseBytes(owner, ns, candidates, [&](size_t i, Status refused) {
        ns.host_->Release(keys[i]);
        out.items[i] = std::move(refused);
      });
  if (!pinned.empty()) {
    out.lease_id = leases_->Add(owner, LeaseKind::kPin, ns.host_.get(),
                                std::move(pinned), ttl);
  }
  return out;
}

bool CacheEngine::DeepestFirst(const EngineNamespace& ns) {
  return ns.host_->eviction_policy() != EvictionPolicyKind::kLru;
}

CacheEngine::LeaseRoomCheck CacheEngine::CheckLeaseRoom(
    uint64_t owner, const EngineNamespace& ns, size_t want) const {
  const char* limit = nullptr;
  LeaseRoomCheck check;
  check.room = leases_->Room(owner, ns.host_.get(), want, &limit);
  if (check.room < want) check.error = LeaseLimitStatus(owner, limit);
  return check;
}

Status CacheEngine::LeaseLimitStatus(uint64_t owner, const char* limit) const {
  const LeaseLimits& l = leases_->limits();
  return Status::ResourceExhausted(fmt::format(
      "lease limit reached ({}: this connection holds {} leases over {} "
      "segments, {} B; limits leases.max_per_connection {}, "
      "leases.max_segments_per_connection {}, "
      "leases.max_segments_per_namespace {}, "
      "leases.max_bytes_percent_per_connection {}, "
      "leases.max_bytes_percent_per_namespace {}); release earlier reads",
      limit ? limit : "limits", leases_->leases_of(owner),
      leases_->segments_of(owner), leases_->bytes_of(owner),
      l.max_leases_per_owner, l.max_segments_per_owner, l.max_segments_per_tier,
      l.max_bytes_percent_per_owner, l.max_bytes_percent_per_tier));
}

std::vector<LeasedSegment> CacheEngine::AdmitLeaseBytes(
    uint64_t owner, const EngineNamespace& ns,
    const std::vector<std::pair<size_t, LeasedSegment>>& candidates,
    const std::function<void(size_t item, Status)>& refuse) const {
  std::vector<uint64_t> sizes;
  sizes.reserve(candidates.size());
  for (const auto& [i, segment] : candidates) sizes.push_back(segment.bytes);
  const char* limit = nullptr;
  const size_t fit = leases_->FitBytes(owner, ns.host_.get(), sizes, &limit);
  std::vector<LeasedSegment> admitted;
  admitted.reserve(fit);
  for (size_t c = 0; c < fit; ++c) admitted.push_back(candidates[c].second);
  if (fit < candidates.size()) {
    const Status refused = LeaseLimitStatus(owner, limit);
    for (size_t c = fit; c < candidates.size(); ++c) {
      refuse(candidates[c].first, refused);
    }
  }
  return admitted;
}

Status CacheEngine::Release(uint64_t owner, uint64_t lease_id) {
  return leases_->Release(owner, lease_id);
}

size_t CacheEngine::ReleaseOwner(uint64_t owner) {
  {
    MutexLock lock(&owners_mu_);
    owners_.erase(owner);  // running transfers keep their regions mapped
  }
  return leases_->ReleaseOwner(owner);
}

size_t CacheEngine::ExpireLeases() { return leases_->ExpireDue(); }

size_t CacheEngine::active_leases() const { return leases_->size(); }

}  // namespace tierkv::storage
