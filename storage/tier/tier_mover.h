// TierMover: moves segments between namespaces' leased tiers (host DRAM)
// and the tiers below them (a TierChain: NVMe, or whatever the placement
// names) in the background (DESIGN.md §4, "mover").
//
//   demotion  host -> the chain's demotion target. Workers take batches of
//             the oldest dirty host segments (LeasedTier::TakeDirty:
//             write_through takes every dirty segment, write_back only while
//             a shard runs short of clean space), write each batch with one
//             Tier::Write (for NVMe: queue-depth IO straight from the arena,
//             one catalog batch) and mark them clean. No bytes are queued,
//             so nothing can be dropped: when dirty data outruns the tier,
//             LeasedTier::Reserve answers Busy (backpressure) until a batch
//             lands.
//   promotion chain -> host. PromoteBatch() locates a round of
//             promotion_batch_bytes (one Lookup per tier), reserves arena
//             space and reads it with one chain read; Get calls it on
//             demand, and Prefetch() queues a batch for the workers (a
//             bounded queue of hints: a full queue drops the batch and
//             counts it; the Get that follows promotes on demand).
//             Background prefetches (IoClass::kBackground: weights) wait
//             in a queue of their own, go in slices of
//             background_slice_segments after every flush, KV prefetch and
//             demotion waiting, never on more than workers - 1 workers at
//             once (one, with a single worker), and within their
//             namespace's prefetch_bytes_per_second (a TokenBucket on the
//             mover's clock).
//   persist   PersistBatch() writes host segments to the demotion target
//             now: one durable Write for the batch. Persist() queues one
//             for the workers (a client's Flush), ahead of everything else.
//
// Thread safety: thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "storage/clock.h"
#include "storage/engine/write_policy.h"
#include "storage/tier/leased_tier.h"
#include "storage/tier/tier_chain.h"
#include "storage/tier/token_bucket.h"

namespace tierkv::storage {

struct TierMoverOptions {
  // Worker threads. Default: 2. 0 runs none (nothing moves in the
  // background; for tests).
  uint32_t workers = 2;
  // Largest demotion batch: segments and bytes per Tier::Write. Large
  // batches keep the device at queue depth and amortize the data and
  // catalog syncs. Default: 512 segments, 32 MiB.
  uint32_t demotion_batch_segments = 512;
  uint64_t demotion_batch_bytes = uint64_t{32} << 20;
  // Prefetch batches waiting for a worker; more are dropped. Default: 256.
  uint32_t prefetch_queue = 256;
  // Persist batches (Flush) waiting for a worker; more are answered Busy.
  // Default: 1024.
  uint32_t persist_queue = 1024;
  // Background prefetches are promoted this many segments at a time, so a
  // KV prefetch queued behind a large one waits at most for a slice.
  // Default: 4 (256 MiB of the largest weights chunks).
  uint32_t background_slice_segments = 4;
  // Largest promotion round: bytes reserved in DRAM and read with one chain
  // read (never more than a quarter of the host tier, so a round cannot
  // evict itself). Default: 16 MiB.
  uint64_t promotion_batch_bytes = uint64_t{16} << 20;
  // Demotions are written without syncs (Durability::kDeferred: crash safe
  // at once, power-loss safe after a sync) and synced as a group at most
  // this long after the first unsynced one (ext4's default journal commit
  // interval). An explicit Flush is always durable on return. Default: 5 s.
  std::chrono::milliseconds sync_interval{5000};
  // How long a Flush waits for a concurrent writer of the same segment
  // (another promoter or a client's Put) before reporting it missing.
  // Default: 200 ms.
  std::chrono::milliseconds reservation_wait{200};

  Status Validate() const;
};

struct TierMoverStats {
  uint64_t demotions_done = 0;     // segments written (or already on NVMe)
  uint64_t demotions_retried = 0;  // a concurrent write held the key
  uint64_t demotions_failed = 0;   // NVMe refused them (IOError, full)
  uint64_t demotion_batches = 0;
  uint64_t syncs = 0;              // group syncs of deferred demotions
  uint64_t sync_failures = 0;      // such syncs the device or catalog failed
  uint64_t promotions_done = 0;    // segments read into host
  uint64_t promotions_failed = 0;  // missing, corrupt or no host space
  uint64_t promoted_bytes = 0;     // of promotions_done (NVMe -> host)
  // Segments and bytes written to NVMe (host -> NVMe) by demotion and
  // Flush; unlike demotions_done, never counts segments already on NVMe.
  uint64_t written_segments = 0;
  uint64_t written_bytes = 0;
  uint64_t prefetch_batches = 0;  // queued
  uint64_t prefetch_dropped = 0;  // batches dropped: queue full
  uint64_t prefetch_queue_depth = 0;
  // Background prefetches (weights): slices promoted, and batches queued
  // or dropped (their queue holds prefetch_queue batches too).
  uint64_t background_slices = 0;
  uint64_t background_batches = 0;
  uint64_t background_dropped = 0;
};

// A prefetch's IO class. kKv: an engine reads it next (Match, Load): first
// after flushes. kBackground: ahead of a later use (weights hints and
// kWeightsPrefetch): after everything else, rate-capped per namespace.
enum class IoClass : uint8_t { kKv = 0, kBackground = 1 };

// One namespace, as the mover sees it. The pointers are borrowed: the
// owner keeps them alive until the mover is destroyed.
struct NamespaceTiers {
  TierNamespace ns;
  // The tier the namespace's clients lease (host DRAM): what demotion
  // drains and promotion fills. Must be host addressable
  // (LeasedTier::HostBytes) for either; segments of one that is not fail
  // with InvalidArgument.
  LeasedTier* top = nullptr;
  WritePolicy policy = WritePolicy::kNone;
  // The namespace's layout fingerprint (0 before a layout is registered),
  // stored with its data below DRAM.
  const std::atomic<uint64_t>* fingerprint = nullptr;
  // Most bytes per second its background prefetches may promote (a burst
  // of one second's worth); 0: uncapped.
  uint64_t prefetch_bytes_per_second = 0;

  uint64_t Fingerprint() const {
    return fingerprint->load(std::memory_order_acquire);
  }
};

class TierMover {
 public:
  // Starts the workers over `namespaces` (borrowed, fixed for the mover's
  // life), whose dirty segments they persist by each one's policy into
  // `chain`'s demotion target and promote from `chain` (borrowed). Every
  // deadline (group syncs, waits for a concurrent writer, `wait_until`,
  // PersistDirty's) is on `clock` (borrowed).
  // REQUIRES: options.Validate() is OK; the chain is not empty.
  TierMover(const TierMoverOptions& options, const Clock* clock,
            const TierChain* chain,
            std::vector<const NamespaceTiers*> namespaces);
  // Joins the workers once queued persists ran; queued prefetches are
  // dropped.
  ~TierMover();

  TierMover(const TierMover&) = delete;
  TierMover& operator=(const TierMover&) = delete;

  // Wakes the workers: dirty segments were committed or a Reserve met
  // backpressure. Cheap; call after each batch of commits.
  void Kick();

  // Queues promotion of `keys` (segments below DRAM only) into the host
  // tier, in their order. kBackground: `bytes` holds each key's size below
  // DRAM (what the namespace's cap is charged; empty: nothing).
  void Prefetch(const NamespaceTiers* tiers, std::vector<SegmentKey> keys,
                IoClass io = IoClass::kKv, std::vector<uint64_t> bytes = {});

  // Reads `keys` from the chain into the host tier, one chain read per
  // round of promotion_batch_bytes. A key whose reservation is Busy (another
  // writer of it, or write-back backpressure) is retried whenever its host
  // shard changes, until `wait_until`. One Status per key: OK when the segment
  // is in the host tier afterwards (also if it already was, or another
  // promoter won); NotFound when no tier below has it (or its copy failed
  // verification); Busy or ResourceExhausted when the host tier had no room
  // for it in time. With `hold`, every OK key also holds a reference on
  // its host segment (as LeasedTier::Acquire), taken when it was committed,
  // so nothing evicts it before the caller reads it (a promotion racing a
  // full tier under a score-based policy lost its segment in that gap);
  // the caller Releases it. A key found stored but gone before it could be
  // referenced is NotFound. With `sources`, (*sources)[i] is the kind of
  // the tier below DRAM key i came from (kMiss when not OK).
  // Waits for its rounds on the calling thread.
  std::vector<Status> PromoteBatch(
      const NamespaceTiers& tiers, std::span<const SegmentKey> keys,
      Clock::TimePoint wait_until = {}, bool hold = false,
      std::vector<tierkv::Tier>* sources = nullptr);

  // PromoteBatch's answer: a Status per key and where each OK key came
  // from (kMiss when not OK).
  struct Promoted {
    std::vector<Status> results;
    std::vector<tierkv::Tier> sources;
  };
  // Runs `job` on a thread allowed to wait; false when it cannot (the job
  // is dropped).
  using Executor = std::function<bool(std::function<void()>)>;
  // PromoteBatch that holds no thread while the chain reads: a round's
  // read completes on the tier's thread, which commits it and plans the
  // next round there (planning never waits). Only a wait for a Busy key's
  // shard to change is handed to `post`; a refused post ends the
  // promotion with those keys Busy. `done` runs once, on whichever thread
  // finished the last round (possibly the caller's, before this returns).
  // `tiers` must outlive `done`.
  // `scope` says which tiers below DRAM it may read (TierScope::kLocal: on
  // a peer's behalf).
  void PromoteBatchAsync(const NamespaceTiers& tiers,
                         std::vector<SegmentKey> keys,
                         Clock::TimePoint wait_until, bool hold, Executor post,
                         std::function<void(Promoted)> done,
                         TierScope scope = TierScope::kAll);

  // Writes host segments `keys` to the demotion target now with one durable
  // Tier::Write, then syncs it. One Status per key: OK when there (now or
  // before); NotFound when in neither tier; IOError / ResourceExhausted
  // from the target; Busy when another write of the key did not finish
  // within reservation_wait.
  std::vector<Status> PersistBatch(const NamespaceTiers& tiers,
                                   std::span<const SegmentKey> keys);
  // PersistBatch on a worker, ahead of prefetches and demotions; `done`
  // gets its answer there (on the caller's thread, before this returns,
  // with no workers). Busy for every key when persist_queue batches
  // already wait or the mover is ending; batches queued before it ends
  // still run.
  void Persist(const NamespaceTiers* tiers, std::vector<SegmentKey> keys,
               std::function<void(std::vector<Status>)> done);

  // Writes every dirty segment of every namespace with a write policy to
  // the demotion target (batches as in demotion, the workers helping), then
  // syncs once: for a graceful shutdown, so a restarted daemon serves what DRAM
  // held. Stops starting batches at `deadline`. Returns the segments written;
  // those still dirty at the deadline stay in DRAM only.
  uint64_t PersistDirty(Clock::TimePoint deadline);

  TierMoverStats Stats() const;

  // Sync point a worker passes before promoting a prefetch, with a
  // `const IoClass*` argument (tests: the order of KV and background work).
  static constexpr char kBeforePrefetch[] = "TierMover::BeforePrefetch";
  // Sync point (common/sync_point.h) a worker passes after a group sync of
  // demotions came due on the clock and ran (tests: advance a manual clock,
  // then wait for it).
  static constexpr char kAfterGroupSync[] = "TierMover::AfterGroupSync";

  // Blocks until no dirty segment the policies would persist is left and
  // no job runs (tests, shutdown).
  void TEST_Drain();

 private:
  // The answer for a segment of a tier the CPU cannot address
  // (NamespaceTiers::top must be host addressable for the mover to move it).
  static Status NotHostAddressable(const NamespaceTiers& tiers);
  // A PromoteBatchAsync in progress (tier_mover_promotion.cc).
  struct Promotion;
  // Plans and reads rounds until one waits for a read or a Busy key, or
  // the promotion is over (then its `done` runs).
  void RunPromotion(const std::shared_ptr<Promotion>& p);
  // Locates p's todo keys and reserves host space for the round.
  void PlanRound(Promotion& p);
  // Commits (or aborts) what the round read.
  void CommitRound(Promotion& p, const TierChain::ReadResult& got);
  // Sets p's next todo after a round; false when the promotion continues
  // elsewhere (a posted wait) and the caller must let go of it.
  bool AdvanceRound(const std::shared_ptr<Promotion>& p);

  // Takes and writes one demotion batch; false when there was nothing.
  bool DemoteOnce();
  // Takes one batch of `tiers`' dirty segments (`only_needed`: see
  // LeasedTier::TakeDirty) and writes it; the segments written, 0 if none.
  size_t DemoteBatch(const NamespaceTiers& tiers, bool only_needed);
  void WorkerLoop();
  // Writes `items` of `tiers` with one Tier::Write to the demotion target
  // and wakes PersistBatch calls waiting for a concurrent write to finish.
  std::vector<Status> WriteAndAnnounce(const NamespaceTiers& tiers,
                                       std::span<const TierWriteItem> items,
                                       Durability durability);
  // Syncs the chain once the oldest unsynced demotion is sync_interval old.
  void SyncIfDue() EXCLUDES(mu_);
  // Syncs the chain if it has unsynced writes, counting the outcome.
  void SyncChain(const char* what);

  const TierMoverOptions options_;
  const Clock* const clock_;
  const TierChain* const chain_;
  Tier* const target_;  // chain_->demotion_target()
  const std::vector<const NamespaceTiers*> namespaces_;

  mutable Mutex mu_;
  CondVar work_cv_;
  CondVar idle_cv_;
  // Bumped after every NVMe write batch (persisted_cv_ signalled).
  uint64_t write_generation_ GUARDED_BY(mu_) = 0;
  CondVar persisted_cv_;
  struct PrefetchJob {
    const NamespaceTiers* tiers;
    std::vector<SegmentKey> keys;
  };
  std::deque<PrefetchJob> prefetches_ GUARDED_BY(mu_);
  struct PersistJob {
    const NamespaceTiers* tiers;
    std::vector<SegmentKey> keys;
    std::function<void(std::vector<Status>)> done;
  };
  std::deque<PersistJob> persists_ GUARDED_BY(mu_);
  struct BackgroundJob {
    const NamespaceTiers* tiers;
    std::vector<SegmentKey> keys;
    std::vector<uint64_t> bytes;  // per key, or empty
    size_t next = 0;              // keys before it were taken
  };
  std::deque<BackgroundJob> background_ GUARDED_BY(mu_);
  uint32_t background_running_ GUARDED_BY(mu_) = 0;
  // Per capped namespace: its prefetch_bytes_per_second bucket.
  std::unordered_map<const NamespaceTiers*, TokenBucket> buckets_
      GUARDED_BY(mu_);
  // The first background job that may run at `now` (a worker free for it
  // and its namespace's bucket ready), or background_.end(); with `wake`,
  // the earliest time a bucket holds one back until.
  std::deque<BackgroundJob>::iterator ReadyBackgroundLocked(
      Clock::TimePoint now, std::optional<Clock::TimePoint>* wake = nullptr)
      REQUIRES(mu_);
  // Takes the next slice of a ready background job (charging its
  // namespace's bucket); false when none is ready.
  bool TakeBackgroundSliceLocked(PrefetchJob* slice) REQUIRES(mu_);
  // Whether a worker has anything queued to do now (a background job held
  // back by its cap or by the workers' share is not).
  bool HasQueuedWorkLocked() REQUIRES(mu_) {
    return kicked_ || !prefetches_.empty() || !persists_.empty() ||
           ReadyBackgroundLocked(clock_->Now()) != background_.end();
  }
  bool kicked_ GUARDED_BY(mu_) = false;
  uint32_t running_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
  std::atomic<uint32_t> next_namespace_{0};

  // When the oldest demotion not yet synced was written, if any.
  std::optional<Clock::TimePoint> unsynced_since_ GUARDED_BY(mu_);
  std::atomic<uint64_t> syncs_{0}, sync_failures_{0};
  std::atomic<uint64_t> demotions_done_{0}, demotions_retried_{0},
      demotions_failed_{0}, demotion_batches_{0};
  std::atomic<uint64_t> promotions_done_{0}, promotions_failed_{0},
      prefetch_batches_{0}, prefetch_dropped_{0};
  std::atomic<uint64_t> background_slices_{0}, background_batches_{0},
      background_dropped_{0};
  // clock_ ms of the last write-back failure logged.
  std::atomic<int64_t> last_failure_log_ms_{INT64_MIN / 2};
  std::atomic<uint64_t> promoted_bytes_{0}, written_segments_{0},
      written_bytes_{0};
};

}  // namespace tierkv::storage
