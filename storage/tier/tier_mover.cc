// TierMover: batched demotion and persistence between the namespaces'
// leased tiers (host DRAM) and the chain below them, and the workers that
// run them (see tier_mover.h; promotion is in tier_mover_promotion.cc).
#include "storage/tier/tier_mover.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/sync_point.h"

namespace tierkv::storage {
Status TierMover::NotHostAddressable(const NamespaceTiers& tiers) {
  return Status::InvalidArgument(
      "namespace '" + tiers.ns.name + "': tier '" +
      std::string(tiers.top->name()) +
      "' is not host addressable; the mover cannot move its segments");
}

Status TierMoverOptions::Validate() const {
  if (workers > 64) {
    return Status::InvalidArgument("tier mover workers must be <= 64");
  }
  if (demotion_batch_segments == 0 || demotion_batch_bytes == 0) {
    return Status::InvalidArgument("tier mover demotion batch must be > 0");
  }
  if (prefetch_queue == 0 || persist_queue == 0) {
    return Status::InvalidArgument(
        "tier mover prefetch_queue and persist_queue must be > 0");
  }
  if (sync_interval.count() <= 0) {
    return Status::InvalidArgument("tier mover sync_interval must be > 0");
  }
  return Status::OK();
}

TierMover::TierMover(const TierMoverOptions& options, const Clock* clock,
                     const TierChain* chain,
                     std::vector<const NamespaceTiers*> namespaces)
    : options_(options),
      clock_(clock),
      chain_(chain),
      target_(chain->demotion_target()),
      namespaces_(std::move(namespaces)) {
  // Each worker sets up its io_uring ring (and registered buffers) now, not
  // on its first demotion: the daemon's fds and memory are then what they
  // will be, from start-up on.
  for (uint32_t i = 0; i < options.workers; ++i) {
    workers_.emplace_back([this] {
      chain_->PrepareThisThread();
      WorkerLoop();
    });
  }
}

TierMover::~TierMover() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

void TierMover::Kick() {
  {
    MutexLock lock(&mu_);
    if (kicked_) return;
    kicked_ = true;
  }
  work_cv_.Signal();
}

void TierMover::Prefetch(const NamespaceTiers* tiers,
                         std::vector<SegmentKey> keys, IoClass io,
                         std::vector<uint64_t> bytes) {
  if (keys.empty()) return;
  if (io == IoClass::kBackground) {
    {
      MutexLock lock(&mu_);
      if (stopping_ || background_.size() >= options_.prefetch_queue) {
        background_dropped_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      if (bytes.size() != keys.size()) bytes.clear();
      background_.push_back({tiers, std::move(keys), std::move(bytes)});
    }
    background_batches_.fetch_add(1, std::memory_order_relaxed);
    work_cv_.Signal();
    return;
  }
  {
    MutexLock lock(&mu_);
    if (stopping_ || prefetches_.size() >= options_.prefetch_queue) {
      prefetch_dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    prefetches_.push_back({tiers, std::move(keys)});
  }
  prefetch_batches_.fetch_add(1, std::memory_order_relaxed);
  work_cv_.Signal();
}

void TierMover::Persist(const NamespaceTiers* tiers,
                        std::vector<SegmentKey> keys,
                        std::function<void(std::vector<Status>)> done) {
  if (workers_.empty()) {
    done(PersistBatch(*tiers, keys));
    return;
  }
  {
    MutexLock lock(&mu_);
    if (!stopping_ && persists_.size() < options_.persist_queue) {
      persists_.push_back({tiers, std::move(keys), std::move(done)});
      work_cv_.Signal();
      return;
    }
  }
  done(std::vector<Status>(
      keys.size(), Status::Busy("too many Flush batches waiting; retry")));
}

std::deque<TierMover::BackgroundJob>::iterator TierMover::ReadyBackgroundLocked(
    Clock::TimePoint now, std::optional<Clock::TimePoint>* wake) {
  // One worker stays for KV prefetches, flushes and demotion.
  const uint32_t share =
      std::max<uint32_t>(1, options_.workers) - (options_.workers > 1 ? 1 : 0);
  if (background_running_ >= share) return background_.end();
  for (auto it = background_.begin(); it != background_.end(); ++it) {
    auto bucket = buckets_.find(it->tiers);
    if (bucket == buckets_.end()) return it;
    const Clock::TimePoint ready = bucket->second.ReadyAt(now);
    if (ready <= now) return it;
    if (wake != nullptr && (!*wake || ready < **wake)) *wake = ready;
  }
  return background_.end();
}

bool TierMover::TakeBackgroundSliceLocked(PrefetchJob* slice) {
  const Clock::TimePoint now = clock_->Now();
  auto it = ReadyBackgroundLocked(now);
  if (it == background_.end()) return false;
  BackgroundJob& job = *it;
  const size_t end = std::min(
      job.keys.size(),
      job.next + std::max<uint32_t>(1, options_.background_slice_segments));
  slice->tiers = job.tiers;
  slice->keys.assign(job.keys.begin() + job.next, job.keys.begin() + end);
  if (const uint64_t rate = job.tiers->prefetch_bytes_per_second;
      rate > 0 && !job.bytes.empty()) {
    uint64_t bytes = 0;
    for (size_t i = job.next; i < end; ++i) bytes += job.bytes[i];
    auto bucket = buckets_.try_emplace(job.tiers, rate, rate, now).first;
    bucket->second.Take(bytes, now);
  }
  job.next = end;
  if (job.next == job.keys.size()) background_.erase(it);
  background_running_++;
  return true;
}

void TierMover::WorkerLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && !HasQueuedWorkLocked()) {
      // Wake for a group sync that comes due, or for a capped background
      // prefetch whose bucket refills.
      std::optional<Clock::TimePoint> wake;
      if (unsynced_since_) wake = *unsynced_since_ + options_.sync_interval;
      (void)ReadyBackgroundLocked(clock_->Now(), &wake);
      if (!wake) {
        work_cv_.Wait(&mu_);
      } else if (!clock_->WaitUntil(work_cv_, &mu_, *wake)) {
        break;  // a sync is due or a bucket refilled: look again
      }
    }
    if (stopping_ && persists_.empty()) return;  // a Flush is answered
    if (!HasQueuedWorkLocked()) {
      lock.Unlock();
      SyncIfDue();
      lock.Lock();
      continue;
    }
    running_++;
    if (!persists_.empty()) {
      // A client waits on each: first of all.
      PersistJob job = std::move(persists_.front());
      persists_.pop_front();
      lock.Unlock();
      job.done(PersistBatch(*job.tiers, job.keys));
      lock.Lock();
    } else if (!prefetches_.empty()) {
      // Prefetches first: an engine is about to read them.
      PrefetchJob job = std::move(prefetches_.front());
      prefetches_.pop_front();
      lock.Unlock();
      IoClass io = IoClass::kKv;
      TIERKV_SYNC_POINT_CALLBACK(kBeforePrefetch, &io);
      PromoteBatch(*job.tiers, job.keys).clear();
      lock.Lock();
    } else if (PrefetchJob slice;
               !kicked_ && TakeBackgroundSliceLocked(&slice)) {
      // Last: nothing more urgent waits (demotion included), one slice.
      lock.Unlock();
      IoClass io = IoClass::kBackground;
      TIERKV_SYNC_POINT_CALLBACK(kBeforePrefetch, &io);
      PromoteBatch(*slice.tiers, slice.keys).clear();
      background_slices_.fetch_add(1, std::memory_order_relaxed);
      lock.Lock();
      background_running_--;
    } else if (!kicked_) {
      // A background job counted as ready was taken by another worker.
    } else {
      kicked_ = false;
      lock.Unlock();
      const bool wrote = DemoteOnce();
      SyncIfDue();
      lock.Lock();
      // There may be more: look again (another worker may help).
      if (wrote && !kicked_) {
        kicked_ = true;
        work_cv_.Signal();
      }
    }
    running_--;
    if (running_ == 0 && !HasQueuedWorkLocked()) {
      idle_cv_.SignalAll();
    }
  }
}

void TierMover::SyncIfDue() {
  {
    MutexLock lock(&mu_);
    if (!unsynced_since_ ||
        clock_->Now() < *unsynced_since_ + options_.sync_interval) {
      return;
    }
    unsynced_since_.reset();  // what is written from now on waits again
  }
  SyncChain("demoted");
  TIERKV_SYNC_POINT(kAfterGroupSync);
}

void TierMover::SyncChain(const char* what) {
  if (!chain_->HasUnsyncedWrites()) return;
  if (Status s = chain_->Sync(); s.ok()) {
    syncs_.fetch_add(1, std::memory_order_relaxed);
  } else {
    // The written segments stay readable; try again an interval later.
    sync_failures_.fetch_add(1, std::memory_order_relaxed);
    {
      MutexLock lock(&mu_);
      if (!unsynced_since_) unsynced_since_ = clock_->Now();
    }
    spdlog::warn("tier mover: syncing {} segments failed: {}", what,
                 s.ToString());
  }
}

std::vector<Status> TierMover::WriteAndAnnounce(
    const NamespaceTiers& tiers, std::span<const TierWriteItem> items,
    Durability durability) {
  std::vector<Status> statuses =
      WriteAndWait(*target_, tiers.ns, tiers.Fingerprint(), items, durability);
  for (size_t k = 0; k < items.size(); ++k) {
    if (!statuses[k].ok()) continue;  // AlreadyExists: nothing was written
    written_segments_.fetch_add(1, std::memory_order_relaxed);
    written_bytes_.fetch_add(items[k].data.size(), std::memory_order_relaxed);
  }
  {
    MutexLock lock(&mu_);
    write_generation_++;
    if (durability == Durability::kDeferred && !unsynced_since_) {
      unsynced_since_ = clock_->Now();
    }
  }
  persisted_cv_.SignalAll();
  return statuses;
}

bool TierMover::DemoteOnce() {
  const size_t n = namespaces_.size();
  const uint32_t start =
      next_namespace_.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    const NamespaceTiers& tiers = *namespaces_[(start + i) % n];
    if (tiers.policy == WritePolicy::kNone) continue;
    if (DemoteBatch(tiers, /*only_needed=*/tiers.policy ==
                               WritePolicy::kWriteBack) > 0) {
      return true;
    }
  }
  return false;
}

size_t TierMover::DemoteBatch(const NamespaceTiers& tiers, bool only_needed) {
  std::vector<DirtySegment> batch =
      tiers.top->TakeDirty(options_.demotion_batch_segments,
                           options_.demotion_batch_bytes, only_needed);
  if (batch.empty()) return 0;
  // Taken segments are immutable and cannot be evicted until
  // FinishPersist, so the device reads them straight from the tier's memory.
  std::vector<Status> statuses(batch.size());
  std::vector<TierWriteItem> items;
  std::vector<size_t> item_of;  // batch index per item
  items.reserve(batch.size());
  for (size_t k = 0; k < batch.size(); ++k) {
    const SegmentLocation& at = batch[k].location;
    const std::span<std::byte> bytes = tiers.top->HostBytes(at);
    if (bytes.empty()) {
      statuses[k] = NotHostAddressable(tiers);
      continue;
    }
    // The whole extent is the segment's: a block-aligned one can be
    // written in place, padding and all (TierWriteItem::readable_bytes).
    items.push_back({batch[k].key, bytes, at.owned_bytes()});
    item_of.push_back(k);
  }
  std::vector<Status> written =
      WriteAndAnnounce(tiers, items, Durability::kDeferred);
  for (size_t j = 0; j < items.size(); ++j) {
    statuses[item_of[j]] = std::move(written[j]);
  }
  // Newest first, so that the clean list keeps the batch's age order.
  size_t failed = 0;
  Status failure;
  for (size_t k = batch.size(); k-- > 0;) {
    const Status& s = statuses[k];
    const bool persisted = s.ok() || s.IsAlreadyExists();
    const bool busy = s.code() == StatusCode::kBusy;
    tiers.top->FinishPersist(batch[k].key, persisted, /*retry=*/busy);
    (persisted ? demotions_done_
     : busy    ? demotions_retried_
               : demotions_failed_)
        .fetch_add(1, std::memory_order_relaxed);
    if (!persisted && !busy && failed++ == 0) failure = s;
  }
  // One line per batch, and at most one every 10 s: a full disk fails
  // every batch (tierkv_mover_segments_total{result="failed"} counts all).
  const auto now = clock_->Now().time_since_epoch();
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
  int64_t last = last_failure_log_ms_.load(std::memory_order_relaxed);
  if (failed > 0 && now_ms - last >= 10000 &&
      last_failure_log_ms_.compare_exchange_strong(last, now_ms)) {
    spdlog::warn(
        "namespace '{}': write-back of {} segments failed ({}); they stay in "
        "host DRAM as cache entries only (logged at most every 10 s)",
        tiers.ns.name, failed, failure.ToString());
  }
  demotion_batches_.fetch_add(1, std::memory_order_relaxed);
  return batch.size();
}

uint64_t TierMover::PersistDirty(Clock::TimePoint deadline) {
  uint64_t written = 0;
  for (const NamespaceTiers* tiers : namespaces_) {
    if (tiers->policy == WritePolicy::kNone) continue;
    // A segment that failed to write goes back to the dirty list and would
    // be taken again: stop at the first batch that writes nothing new.
    const uint64_t failed_before =
        demotions_failed_.load(std::memory_order_relaxed);
    while (clock_->Now() < deadline) {
      const size_t n = DemoteBatch(*tiers, /*only_needed=*/false);
      if (n == 0) break;
      written += n;
      if (demotions_failed_.load(std::memory_order_relaxed) != failed_before) {
        break;
      }
    }
  }
  SyncChain("persisted");
  return written;
}

std::vector<Status> TierMover::PersistBatch(const NamespaceTiers& tiers,
                                            std::span<const SegmentKey> keys) {
  std::vector<Status> results(keys.size());
  const uint64_t fingerprint = tiers.Fingerprint();
  const auto deadline = clock_->Now() + options_.reservation_wait;
  std::vector<size_t> pending(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) pending[i] = i;
  std::vector<SegmentKey> probe;
  while (!pending.empty()) {
    std::vector<TierWriteItem> items;
    std::vector<size_t> item_of;
    probe.clear();
    for (size_t i : pending) probe.push_back(keys[i]);
    const std::vector<uint64_t> stored =
        target_->Lookup(tiers.ns, fingerprint, probe);
    for (size_t p = 0; p < pending.size(); ++p) {
      const size_t i = pending[p];
      if (stored[p] != 0) {
        results[i] = Status::OK();
        continue;
      }
      auto loc = tiers.top->Acquire(keys[i]);  // held until written
      if (!loc.ok()) {
        results[i] = Status::NotFound("segment in neither tier");
        continue;
      }
      const std::span<std::byte> bytes = tiers.top->HostBytes(*loc);
      if (bytes.empty()) {
        tiers.top->Release(keys[i]);
        results[i] = NotHostAddressable(tiers);
        continue;
      }
      items.push_back({keys[i], bytes, loc->owned_bytes()});
      item_of.push_back(i);
    }
    uint64_t generation;
    {
      MutexLock lock(&mu_);
      generation = write_generation_;
    }
    std::vector<Status> statuses;
    if (!items.empty()) {
      statuses = WriteAndAnnounce(tiers, items, Durability::kDurable);
    }
    for (const TierWriteItem& item : items) tiers.top->Release(item.key);
    pending.clear();
    for (size_t k = 0; k < items.size(); ++k) {
      const size_t i = item_of[k];
      if (statuses[k].code() == StatusCode::kBusy) {
        pending.push_back(i);  // a concurrent write of the key: wait for it
      } else {
        results[i] = statuses[k].IsAlreadyExists() ? Status::OK() : statuses[k];
      }
    }
    if (pending.empty()) break;
    // Wait for a write batch other than ours to finish, then look again.
    MutexLock lock(&mu_);
    bool in_time = true;
    while (write_generation_ <= generation + 1 && in_time) {
      in_time = clock_->WaitUntil(persisted_cv_, &mu_, deadline);
    }
    if (!in_time) {
      for (size_t i : pending) {
        results[i] = Status::Busy(
            "another write of this segment did not finish in time");
      }
      break;
    }
  }
  // Segments found already there may have come from deferred demotions:
  // one sync makes them durable too (a no-op when the durable Write above
  // already covered them).
  if (std::any_of(results.begin(), results.end(),
                  [](const Status& r) { return r.ok(); })) {
    if (Status s = target_->Sync(); !s.ok()) {
      for (Status& r : results) {
        if (r.ok()) r = s;
      }
    }
  }
  return results;
}

TierMoverStats TierMover::Stats() const {
  TierMoverStats s;
  s.demotions_done = demotions_done_.load(std::memory_order_relaxed);
  s.demotions_retried = demotions_retried_.load(std::memory_order_relaxed);
  s.demotions_failed = demotions_failed_.load(std::memory_order_relaxed);
  s.demotion_batches = demotion_batches_.load(std::memory_order_relaxed);
  s.promotions_done = promotions_done_.load(std::memory_order_relaxed);
  s.promotions_failed = promotions_failed_.load(std::memory_order_relaxed);
  s.promoted_bytes = promoted_bytes_.load(std::memory_order_relaxed);
  s.written_segments = written_segments_.load(std::memory_order_relaxed);
  s.written_bytes = written_bytes_.load(std::memory_order_relaxed);
  s.prefetch_batches = prefetch_batches_.load(std::memory_order_relaxed);
  s.prefetch_dropped = prefetch_dropped_.load(std::memory_order_relaxed);
  s.background_slices = background_slices_.load(std::memory_order_relaxed);
  s.background_batches = background_batches_.load(std::memory_order_relaxed);
  s.background_dropped = background_dropped_.load(std::memory_order_relaxed);
  MutexLock lock(&mu_);
  s.prefetch_queue_depth = prefetches_.size();
  s.syncs = syncs_.load(std::memory_order_relaxed);
  s.sync_failures = sync_failures_.load(std::memory_order_relaxed);
  return s;
}

void TierMover::TEST_Drain() {
  MutexLock lock(&mu_);
  while (running_ != 0 || HasQueuedWorkLocked()) idle_cv_.Wait(&mu_);
}

}  // namespace tierkv::storage
