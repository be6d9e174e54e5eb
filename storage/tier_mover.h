// TierMover: moves segments between the host tier and the NVMe tier in the
// background (DESIGN.md §4, "mover").
//
//   demotion  host -> NVMe: write_back (bytes copied out at host eviction)
//             and write_through (bytes read from the host tier under a
//             reference after commit);
//   promotion NVMe -> host: segments a Match found only on NVMe, so that the
//             Get that usually follows hits DRAM.
//
// Both queues are bounded (backpressure): when one is full a job is dropped
// and counted, never blocking the caller. That is safe because tierkv is a
// cache: a dropped demotion means the segment is recomputed if needed later;
// a dropped promotion means the Get promotes on demand. Workers take jobs in
// FIFO order.
//
// PromoteNow() and PersistNow() are the synchronous forms used by Get (an
// on-demand promotion) and Flush (a durability barrier).
//
// Thread safety: thread-safe. Enqueue* may be called under a HostTier shard
// lock (from an eviction listener): they only copy and push.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "storage/host_tier.h"
#include "storage/nvme_store.h"

namespace tierkv::storage {

struct TierMoverOptions {
  // Worker threads. Default: 2. 0 runs none (jobs only queue; for tests).
  uint32_t workers = 2;
  uint32_t demotion_queue = 4096;   // jobs; Default: 4096
  uint32_t promotion_queue = 4096;  // jobs; Default: 4096
  // Demotions written per NVMe batch (one data sync + one catalog write).
  uint32_t demotion_batch = 64;  // Default: 64
};

struct TierMoverStats {
  uint64_t demotions_queued = 0;
  uint64_t demotions_done = 0;     // written (or already on NVMe)
  uint64_t demotions_dropped = 0;  // queue full
  uint64_t demotions_failed = 0;   // NVMe write failed or source vanished
  uint64_t promotions_queued = 0;
  uint64_t promotions_done = 0;
  uint64_t promotions_dropped = 0;
  uint64_t promotions_failed = 0;
  uint64_t demotion_queue_depth = 0;
  uint64_t promotion_queue_depth = 0;
};

// Where a segment goes: one namespace's tiers. Borrowed pointers; the owner
// keeps them alive until the mover is destroyed.
struct TierPair {
  std::string ns;
  HostTier* host = nullptr;
  NvmeStore* nvme = nullptr;
};

class TierMover {
 public:
  explicit TierMover(const TierMoverOptions& options);
  ~TierMover();  // drains nothing: pending jobs are dropped, workers joined

  TierMover(const TierMover&) = delete;
  TierMover& operator=(const TierMover&) = delete;

  // write_back: persist `bytes` (copied now) of a segment being evicted.
  void EnqueueEvicted(const TierPair& tiers, uint64_t layout_fingerprint,
                      const SegmentKey& key, std::span<const std::byte> bytes);
  // write_through: persist a committed host segment (read when the job runs).
  void EnqueueCommitted(const TierPair& tiers, uint64_t layout_fingerprint,
                        const SegmentKey& key);
  // Bring an NVMe-only segment into the host tier.
  void EnqueuePromotion(const TierPair& tiers, uint64_t layout_fingerprint,
                        const SegmentKey& key);

  // Copies a segment from NVMe into the host tier now. OK when the segment
  // is in the host tier afterwards (also if it already was); NotFound when
  // NVMe does not have it (or it failed its checksum); ResourceExhausted
  // when the host tier has no evictable space.
  static Status PromoteNow(const TierPair& tiers, uint64_t layout_fingerprint,
                           const SegmentKey& key);

  // Writes a host segment to NVMe now (durable when NvmeStore syncs). OK
  // also when NVMe already has it; NotFound when neither tier has it;
  // IOError from the device.
  static Status PersistNow(const TierPair& tiers, uint64_t layout_fingerprint,
                           const SegmentKey& key);

  TierMoverStats Stats() const;

  // Blocks until both queues are empty and no job runs (tests, shutdown).
  void TEST_Drain();

 private:
  struct Job {
    enum class Kind : uint8_t { kEvicted, kCommitted, kPromote } kind;
    TierPair tiers;
    uint64_t fingerprint;
    SegmentKey key;
    std::vector<std::byte> bytes;  // kEvicted only
  };
  void Push(Job job, std::deque<Job>& queue, uint32_t limit,
            std::atomic<uint64_t>& queued, std::atomic<uint64_t>& dropped);
  void WorkerLoop();
  void Promote(Job& job);
  // Writes demotion jobs as NVMe batches (possibly of mixed namespaces).
  void Demote(std::vector<Job>& jobs);

  const TierMoverOptions options_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<Job> demotions_;   // guarded by mu_
  std::deque<Job> promotions_;  // guarded by mu_
  uint32_t running_ = 0;        // guarded by mu_
  bool stopping_ = false;       // guarded by mu_
  std::vector<std::thread> workers_;

  std::atomic<uint64_t> demotions_queued_{0}, demotions_done_{0},
      demotions_dropped_{0}, demotions_failed_{0};
  std::atomic<uint64_t> promotions_queued_{0}, promotions_done_{0},
      promotions_dropped_{0}, promotions_failed_{0};
};

}  // namespace tierkv::storage
