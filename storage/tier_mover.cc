#include "storage/tier_mover.h"

#include <algorithm>
#include <chrono>
#include <tuple>

namespace tierkv::storage {
namespace {
// How long a promotion waits for a concurrent writer of the same segment.
constexpr std::chrono::microseconds kMaxPromotionWait{200000};
}  // namespace

TierMover::TierMover(const TierMoverOptions& options) : options_(options) {
  for (uint32_t i = 0; i < options.workers; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

TierMover::~TierMover() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void TierMover::Push(Job job, std::deque<Job>& queue, uint32_t limit,
                     std::atomic<uint64_t>& queued,
                     std::atomic<uint64_t>& dropped) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queue.size() >= limit) {
      dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue.push_back(std::move(job));
  }
  queued.fetch_add(1, std::memory_order_relaxed);
  work_cv_.notify_one();
}

void TierMover::EnqueueEvicted(const TierPair& tiers, uint64_t fingerprint,
                               const SegmentKey& key,
                               std::span<const std::byte> bytes) {
  if (tiers.nvme->Contains(tiers.ns, key, fingerprint)) return;  // already safe
  Push(Job{Job::Kind::kEvicted, tiers, fingerprint, key,
           std::vector<std::byte>(bytes.begin(), bytes.end())},
       demotions_, options_.demotion_queue, demotions_queued_,
       demotions_dropped_);
}

void TierMover::EnqueueCommitted(const TierPair& tiers, uint64_t fingerprint,
                                 const SegmentKey& key) {
  Push(Job{Job::Kind::kCommitted, tiers, fingerprint, key, {}}, demotions_,
       options_.demotion_queue, demotions_queued_, demotions_dropped_);
}

void TierMover::EnqueuePromotion(const TierPair& tiers, uint64_t fingerprint,
                                 const SegmentKey& key) {
  Push(Job{Job::Kind::kPromote, tiers, fingerprint, key, {}}, promotions_,
       options_.promotion_queue, promotions_queued_, promotions_dropped_);
}

void TierMover::WorkerLoop() {
  std::unique_lock lock(mu_);
  std::vector<Job> batch;
  while (true) {
    work_cv_.wait(lock, [this] {
      return stopping_ || !demotions_.empty() || !promotions_.empty();
    });
    if (stopping_) return;
    batch.clear();
    // Promotions first, one at a time: an engine is waiting for them.
    // Demotions in batches: one NVMe sync covers many segments.
    if (!promotions_.empty()) {
      batch.push_back(std::move(promotions_.front()));
      promotions_.pop_front();
    } else {
      while (!demotions_.empty() && batch.size() < options_.demotion_batch) {
        batch.push_back(std::move(demotions_.front()));
        demotions_.pop_front();
      }
    }
    running_++;
    lock.unlock();
    if (batch.front().kind == Job::Kind::kPromote) {
      Promote(batch.front());
    } else {
      Demote(batch);
    }
    lock.lock();
    running_--;
    if (running_ == 0 && demotions_.empty() && promotions_.empty()) {
      idle_cv_.notify_all();
    }
  }
}

void TierMover::Promote(Job& job) {
  Status s = PromoteNow(job.tiers, job.fingerprint, job.key);
  (s.ok() ? promotions_done_ : promotions_failed_)
      .fetch_add(1, std::memory_order_relaxed);
}

void TierMover::Demote(std::vector<Job>& jobs) {
  // Group by (store, namespace, layout): NvmeStore::Write takes one of each.
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) {
    return std::tie(a.tiers.nvme, a.tiers.ns, a.fingerprint) <
           std::tie(b.tiers.nvme, b.tiers.ns, b.fingerprint);
  });
  for (size_t begin = 0; begin < jobs.size();) {
    size_t end = begin;
    while (end < jobs.size() &&
           jobs[end].tiers.nvme == jobs[begin].tiers.nvme &&
           jobs[end].tiers.ns == jobs[begin].tiers.ns &&
           jobs[end].fingerprint == jobs[begin].fingerprint) {
      ++end;
    }
    const TierPair& tiers = jobs[begin].tiers;
    std::vector<NvmeWriteItem> items;
    std::vector<SegmentKey> referenced;  // host segments read in place
    for (size_t i = begin; i < end; ++i) {
      Job& job = jobs[i];
      if (job.kind == Job::Kind::kEvicted) {
        items.push_back({job.key, job.bytes});
        continue;
      }
      if (tiers.nvme->Contains(tiers.ns, job.key, job.fingerprint)) {
        demotions_done_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      auto loc = tiers.host->Acquire(job.key);  // held until written
      if (!loc.ok()) {  // evicted before we got to it (write_back may follow)
        demotions_failed_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      referenced.push_back(job.key);
      items.push_back(
          {job.key, std::span<const std::byte>(
                        tiers.host->arena().base() + loc->offset, loc->size)});
    }
    if (!items.empty()) {
      for (const Status& s :
           tiers.nvme->Write(tiers.ns, jobs[begin].fingerprint, items)) {
        // Busy: a concurrent Flush is writing the same segment.
        (s.ok() || s.IsAlreadyExists() || s.code() == StatusCode::kBusy
             ? demotions_done_
             : demotions_failed_)
            .fetch_add(1, std::memory_order_relaxed);
      }
    }
    for (const auto& key : referenced) tiers.host->Release(key);
    begin = end;
  }
}

Status TierMover::PromoteNow(const TierPair& tiers, uint64_t fingerprint,
                             const SegmentKey& key) {
  auto size = tiers.nvme->Lookup(tiers.ns, key, fingerprint);
  if (!size) return Status::NotFound("segment not on NVMe");
  auto loc = tiers.host->Reserve(key, *size);
  // Busy: another promoter (or a client's Put) is filling this segment
  // right now. Wait a little for it rather than report a miss.
  for (auto backoff = std::chrono::microseconds(50), waited = backoff * 0;
       !loc.ok() && loc.status().code() == StatusCode::kBusy &&
       waited < kMaxPromotionWait;
       waited += backoff,
            backoff = std::min(backoff * 2, std::chrono::microseconds(5000))) {
    std::this_thread::sleep_for(backoff);
    loc = tiers.host->Reserve(key, *size);
  }
  if (!loc.ok()) {
    // AlreadyExists: another request promoted it first.
    if (loc.status().IsAlreadyExists()) return Status::OK();
    return loc.status();
  }
  std::span<std::byte> dst(tiers.host->arena().base() + loc->offset, loc->size);
  auto read = tiers.nvme->Read(tiers.ns, key, fingerprint, dst);
  if (!read.ok() || *read != loc->size) {
    tiers.host->Abort(key);
    return read.ok() ? Status::Corruption("NVMe segment changed size")
                     : read.status();
  }
  return tiers.host->Commit(key);
}

Status TierMover::PersistNow(const TierPair& tiers, uint64_t fingerprint,
                             const SegmentKey& key) {
  // Busy means another writer (the mover, another Flush) is persisting the
  // same segment right now: wait for it to finish, then look again.
  for (auto backoff = std::chrono::microseconds(50);;
       backoff = std::min(backoff * 2, std::chrono::microseconds(10000))) {
    if (tiers.nvme->Contains(tiers.ns, key, fingerprint)) return Status::OK();
    auto loc = tiers.host->Acquire(key);  // holds it against eviction
    if (!loc.ok()) return Status::NotFound("segment in neither tier");
    NvmeWriteItem item{
        key, std::span<const std::byte>(
                 tiers.host->arena().base() + loc->offset, loc->size)};
    Status s = tiers.nvme->Write(tiers.ns, fingerprint, std::span(&item, 1))[0];
    tiers.host->Release(key);
    if (s.code() != StatusCode::kBusy)
      return s.IsAlreadyExists() ? Status::OK() : s;
    std::this_thread::sleep_for(backoff);
  }
}

TierMoverStats TierMover::Stats() const {
  TierMoverStats s;
  s.demotions_queued = demotions_queued_.load(std::memory_order_relaxed);
  s.demotions_done = demotions_done_.load(std::memory_order_relaxed);
  s.demotions_dropped = demotions_dropped_.load(std::memory_order_relaxed);
  s.demotions_failed = demotions_failed_.load(std::memory_order_relaxed);
  s.promotions_queued = promotions_queued_.load(std::memory_order_relaxed);
  s.promotions_done = promotions_done_.load(std::memory_order_relaxed);
  s.promotions_dropped = promotions_dropped_.load(std::memory_order_relaxed);
  s.promotions_failed = promotions_failed_.load(std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  s.demotion_queue_depth = demotions_.size();
  s.promotion_queue_depth = promotions_.size();
  return s;
}

void TierMover::TEST_Drain() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [this] {
    return running_ == 0 && demotions_.empty() && promotions_.empty();
  });
}

}  // namespace tierkv::storage
