// The tier mover between a real HostTier and a real NvmeStore (RocksDB
// catalog) on a fault-injecting memory device.
#include "storage/tier/tier_mover.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/sync_point.h"
#include "storage/device/hbm_tier.h"
#include "storage/host/host_tier.h"
#include "storage/nvme/nvme_tier.h"
#include "tests/testing/fault_injection_device.h"
#include "tests/testing/manual_clock.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::storage {
namespace {

using testing::FaultInjectionDevice;
using testing::MemoryDevice;

constexpr uint64_t kFp = 77;        // layout fingerprint
constexpr size_t kSeg = 72 * 1024;  // a GLM-5 latent page

SegmentKey Key(uint64_t n) { return SegmentKey{PageHash{n, n ^ 0xabc}, 3, 0}; }

class TierMoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto host = HostTier::Create(
        {.name = "ns", .capacity_bytes = 4 << 20, .shards = 1});
    ASSERT_OK(host);
    host_ = std::move(host).value();
    faults_ = std::make_shared<FaultInjectionDevice>(
        std::make_shared<MemoryDevice>(64 << 20));
    NvmeStoreOptions o;
    o.catalog_path = dir_.File("catalog");
    o.capacity_bytes = 64 << 20;
    o.device = faults_;
    auto nvme = NvmeStore::Open(o);
    ASSERT_OK(nvme);
    nvme_ = std::move(nvme).value();
    std::vector<std::unique_ptr<Tier>> below;
    below.push_back(std::make_unique<NvmeTier>(nvme_.get()));
    auto chain = TierChain::Create(std::move(below), {});
    ASSERT_OK(chain);
    chain_ = std::move(chain).value();
  }

  // The namespace as the mover sees it, with `policy`.
  const NamespaceTiers* Tiers(WritePolicy policy = WritePolicy::kNone) {
    pair_ = {{.id = 0, .name = "ns"}, host_.get(), policy, &fingerprint_};
    return &pair_;
  }

  std::vector<std::byte> Bytes(uint64_t n) {
    std::vector<std::byte> b(kSeg);
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = static_cast<std::byte>(n * 31 + i);
    return b;
  }
  // Puts segment n into DRAM; Busy (write-back backpressure) when only
  // dirty segments are left to evict.
  Status TryPutHost(uint64_t n, bool dirty) {
    auto r = host_->Reserve(Key(n), kSeg);
    if (!r.ok()) return r.status();
    if (r->already_stored) return Status::OK();
    auto b = Bytes(n);
    std::memcpy(host_->arena().base() + r->location.offset, b.data(), kSeg);
    return host_->Commit(Key(n), dirty);
  }
  void PutHost(uint64_t n, bool dirty = false) {
    ASSERT_OK(TryPutHost(n, dirty));
  }
  Status PersistOne(TierMover& mover, uint64_t n) {
    const SegmentKey key = Key(n);
    return mover.PersistBatch(*Tiers(), std::span(&key, 1))[0];
  }
  Status PromoteOne(TierMover& mover, uint64_t n) {
    const SegmentKey key = Key(n);
    return mover.PromoteBatch(*Tiers(), std::span(&key, 1))[0];
  }
  bool HostHolds(uint64_t n) {
    auto loc = host_->Acquire(Key(n));
    if (!loc.ok()) return false;
    bool same = std::memcmp(host_->arena().base() + loc->offset,
                            Bytes(n).data(), kSeg) == 0;
    host_->Release(Key(n));
    EXPECT_TRUE(same) << "host bytes of segment " << n << " differ";
    return same;
  }
  bool NvmeHolds(uint64_t n) {
    std::vector<std::byte> dst(kSeg);
    auto r = nvme_->Read("ns", Key(n), kFp, dst);
    return r.ok() && dst == Bytes(n);
  }

  testing::TempDir dir_;
  std::atomic<uint64_t> fingerprint_{kFp};
  NamespaceTiers pair_;
  std::unique_ptr<HostTier> host_;
  std::shared_ptr<FaultInjectionDevice> faults_;
  std::unique_ptr<NvmeStore> nvme_;
  std::unique_ptr<TierChain> chain_;  // after nvme_: destroyed first
};

TEST_F(TierMoverTest, PersistAnswersFromAWorkerAndQueuedOnesRunAtTheEnd) {
  for (uint64_t n = 0; n < 8; ++n) PutHost(n);
  std::vector<std::vector<Status>> answers(8);
  std::vector<std::thread::id> answered_on(8);
  const NamespaceTiers* tiers = Tiers();  // once: the worker reads it
  {
    TierMover mover({.workers = 1}, SteadyClock::Default(), chain_.get(),
                    {tiers});
    // Queued one by one, then the mover ends at once: each still runs and
    // answers, on the mover's worker.
    for (uint64_t n = 0; n < 8; ++n) {
      mover.Persist(tiers, {Key(n), Key(1000 + n)},
                    [&answers, &answered_on, n](std::vector<Status> got) {
                      answers[n] = std::move(got);
                      answered_on[n] = std::this_thread::get_id();
                    });
    }
  }
  for (uint64_t n = 0; n < 8; ++n) {
    ASSERT_EQ(answers[n].size(), 2u) << "batch " << n << " was not answered";
    EXPECT_OK(answers[n][0]);
    EXPECT_TRUE(answers[n][1].IsNotFound()) << answers[n][1].ToString();
    EXPECT_NE(answered_on[n], std::this_thread::get_id());
    EXPECT_TRUE(NvmeHolds(n)) << n;
  }
}

TEST_F(TierMoverTest, PersistWithoutWorkersRunsOnTheCaller) {
  PutHost(1);
  const NamespaceTiers* tiers = Tiers();
  TierMover inline_mover({.workers = 0}, SteadyClock::Default(), chain_.get(),
                         {tiers});
  std::vector<Status> got;
  std::thread::id on;
  inline_mover.Persist(tiers, {Key(1)}, [&](std::vector<Status> r) {
    got = std::move(r);
    on = std::this_thread::get_id();
  });
  ASSERT_EQ(got.size(), 1u);
  EXPECT_OK(got[0]);
  EXPECT_EQ(on, std::this_thread::get_id());
  EXPECT_TRUE(NvmeHolds(1));
}

TEST_F(TierMoverTest, WriteBackPersistsBeforeEvictionAndDropsNothing) {
  TierMover mover({.workers = 1}, SteadyClock::Default(), chain_.get(),
                  {Tiers(WritePolicy::kWriteBack)});
  // 4 MiB of DRAM holds 56 segments; put 200 as fast as possible. A Put
  // that meets backpressure waits for the mover, as a client would retry.
  uint64_t busy = 0;
  for (uint64_t n = 0; n < 200; ++n) {
    Status s = TryPutHost(n, /*dirty=*/true);
    mover.Kick();
    while (s.code() == StatusCode::kBusy) {
      busy++;
      mover.TEST_Drain();
      s = TryPutHost(n, /*dirty=*/true);
      mover.Kick();
    }
    ASSERT_OK(s);
  }
  mover.TEST_Drain();
  EXPECT_GE(host_->Stats().evictions, 144u);
  for (uint64_t n = 0; n < 200; ++n) {
    EXPECT_TRUE(host_->Touch(Key(n)) || NvmeHolds(n)) << "lost segment " << n;
  }
  const TierMoverStats s = mover.Stats();
  EXPECT_EQ(s.demotions_failed, 0u);
  EXPECT_GE(s.demotions_done, host_->Stats().evictions);
  EXPECT_LT(s.demotion_batches, s.demotions_done) << "batched writes";
  EXPECT_EQ(host_->Stats().backpressure_rejections, busy);
}

TEST_F(TierMoverTest, WriteThroughPersistsEveryCommitAndPromotesInOneBatch) {
  TierMover mover({.workers = 2}, SteadyClock::Default(), chain_.get(),
                  {Tiers(WritePolicy::kWriteThrough)});
  for (uint64_t n = 0; n < 10; ++n) PutHost(n, /*dirty=*/true);
  mover.Kick();
  mover.TEST_Drain();
  for (uint64_t n = 0; n < 10; ++n) EXPECT_TRUE(NvmeHolds(n)) << n;
  EXPECT_EQ(host_->Stats().dirty_segments, 0u);
  // Push them out of DRAM, then bring all ten back with one ReadBatch.
  for (uint64_t n = 100; n < 160; ++n) PutHost(n);
  EXPECT_FALSE(host_->Touch(Key(0)));
  std::vector<SegmentKey> keys;
  for (uint64_t n = 0; n < 10; ++n) keys.push_back(Key(n));
  const uint64_t reads_before = nvme_->Stats().reads;
  for (const Status& s : mover.PromoteBatch(*Tiers(), keys)) EXPECT_OK(s);
  EXPECT_EQ(nvme_->Stats().reads - reads_before, 10u);
  for (uint64_t n = 0; n < 10; ++n) EXPECT_TRUE(HostHolds(n)) << n;
  EXPECT_EQ(mover.Stats().promotions_done, 10u);
  EXPECT_EQ(host_->Stats().dirty_segments, 0u) << "promoted = clean";
  // Asynchronous prefetch of the same keys: already in DRAM, still OK.
  mover.Prefetch(Tiers(), keys);
  mover.TEST_Drain();
  EXPECT_EQ(mover.Stats().prefetch_batches, 1u);
}

// With block-aligned arena extents the mover writes segments to NVMe
// straight from the arena and promotes them straight into it; with the
// default 64 B alignment every one goes through a bounce buffer. Same
// bytes either way.
TEST_F(TierMoverTest, BlockAlignedExtentsAreDemotedAndPromotedInPlace) {
  constexpr size_t kOdd = kSeg + 3;  // not a whole number of blocks
  for (const uint64_t alignment : {uint64_t{4096}, uint64_t{64}}) {
    SCOPED_TRACE(alignment);
    auto made = HostTier::Create({.name = "ns",
                                  .capacity_bytes = 4 << 20,
                                  .shards = 1,
                                  .alignment = alignment});
    ASSERT_OK(made);
    std::unique_ptr<HostTier> host = std::move(made).value();
    const NamespaceTiers tiers{{.id = 0, .name = "ns"},
                               host.get(),
                               WritePolicy::kWriteThrough,
                               &fingerprint_};
    TierMover mover({.workers = 1}, SteadyClock::Default(), chain_.get(),
                    {&tiers});
    const uint64_t base = alignment * 1000;  // keys apart per round
    auto bytes = [&](uint64_t n) {
      std::vector<std::byte> b = Bytes(n);
      b.resize(kOdd, std::byte{0x5A});
      return b;
    };
    for (uint64_t n = base; n < base + 8; ++n) {
      auto r = host->Reserve(Key(n), kOdd);
      ASSERT_OK(r);
      std::memcpy(host->arena().base() + r->location.offset, bytes(n).data(),
                  kOdd);
      ASSERT_OK(host->Commit(Key(n), /*dirty=*/true));
    }
    const NvmeStoreStats before = nvme_->Stats();
    mover.Kick();
    mover.TEST_Drain();
    const NvmeStoreStats demoted = nvme_->Stats();
    EXPECT_EQ(demoted.writes - before.writes, 8u);
    EXPECT_EQ(demoted.bounced_writes - before.bounced_writes,
              alignment == 4096 ? 0u : 8u);
    // Out of DRAM (evicted by newer clean segments), then promoted back.
    for (uint64_t n = base + 100; n < base + 160; ++n) {
      auto r = host->Reserve(Key(n), kSeg);
      if (r.ok() && !r->already_stored) ASSERT_OK(host->Commit(Key(n)));
    }
    std::vector<SegmentKey> keys;
    for (uint64_t n = base; n < base + 8; ++n) {
      ASSERT_FALSE(host->Touch(Key(n))) << n;
      keys.push_back(Key(n));
    }
    for (const Status& s : mover.PromoteBatch(tiers, keys)) EXPECT_OK(s);
    EXPECT_EQ(nvme_->Stats().bounced_reads - demoted.bounced_reads,
              alignment == 4096 ? 0u : 8u);
    for (uint64_t n = base; n < base + 8; ++n) {
      auto loc = host->Acquire(Key(n));
      ASSERT_OK(loc);
      EXPECT_EQ(loc->size, kOdd);
      EXPECT_EQ(std::memcmp(host->arena().base() + loc->offset, bytes(n).data(),
                            kOdd),
                0)
          << n;
      host->Release(Key(n));
    }
  }
}

// The mover works on any LeasedTier; one whose memory the CPU cannot
// address (a device pool) is refused segment by segment, and what the
// mover reserved or referenced there is given back.
TEST_F(TierMoverTest, ATierTheCpuCannotAddressIsRefusedAndLeftAsItWas) {
  TierMover mover({.workers = 1}, SteadyClock::Default(), chain_.get(),
                  {Tiers()});
  PutHost(0);
  ASSERT_OK(PersistOne(mover, 0));  // on NVMe now
  HbmTier hbm(1 << 20, {0});
  HbmNamespaceTier device_memory(&hbm, 0);
  const NamespaceTiers on_device{{.id = 0, .name = "ns"},
                                 &device_memory,
                                 WritePolicy::kNone,
                                 &fingerprint_};
  const SegmentKey zero = Key(0);
  EXPECT_EQ(mover.PromoteBatch(on_device, std::span(&zero, 1))[0].code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(hbm.Contains(0, zero));
  EXPECT_EQ(hbm.Stats().used_bytes, 0u) << "the reservation was aborted";
  // A segment held there cannot be persisted from there either, and is not
  // left referenced: the whole pool can still be reserved (evicting it).
  ASSERT_OK(device_memory.Reserve(Key(1), kSeg));
  ASSERT_OK(device_memory.Commit(Key(1)));
  const SegmentKey one = Key(1);
  EXPECT_EQ(mover.PersistBatch(on_device, std::span(&one, 1))[0].code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(NvmeHolds(1));
  ASSERT_OK(device_memory.Reserve(Key(2), 1 << 20));
  EXPECT_FALSE(device_memory.Contains(Key(1)));
}

// A held promotion is referenced from its commit on: a full tier evicts
// everything else before it, until the reader releases it.
TEST_F(TierMoverTest, AHeldPromotionCannotBeEvictedBeforeItIsRead) {
  TierMover mover({.workers = 1}, SteadyClock::Default(), chain_.get(),
                  {Tiers(WritePolicy::kWriteThrough)});
  PutHost(0, /*dirty=*/true);
  mover.Kick();
  mover.TEST_Drain();
  ASSERT_TRUE(NvmeHolds(0));
  for (uint64_t n = 100; n < 160; ++n) PutHost(n);  // 0 leaves DRAM
  ASSERT_FALSE(host_->Touch(Key(0)));
  const SegmentKey key = Key(0);
  ASSERT_OK(mover.PromoteBatch(*Tiers(), std::span(&key, 1), {},
                               /*hold=*/true)[0]);
  EXPECT_EQ(host_->Stats().referenced_segments, 1u);
  for (uint64_t n = 200; n < 300; ++n) PutHost(n);  // the tier turns over
  EXPECT_TRUE(HostHolds(0));
  host_->Release(key);
  EXPECT_EQ(host_->Stats().referenced_segments, 0u);
  for (uint64_t n = 300; n < 400; ++n) PutHost(n);
  EXPECT_FALSE(host_->Touch(key)) << "evictable again once released";
}

TEST_F(TierMoverTest, PersistBatchOfAThousandKeysSyncsDataOnce) {
  auto host =
      HostTier::Create({.name = "ns", .capacity_bytes = 64 << 20, .shards = 4});
  ASSERT_OK(host);
  host_ = std::move(host).value();
  TierMover mover({.workers = 0}, SteadyClock::Default(), chain_.get(),
                  {Tiers()});
  std::vector<SegmentKey> keys;
  for (uint64_t n = 0; n < 1000; ++n) {
    auto r = host_->Reserve(Key(n), 8192);
    ASSERT_OK(r);
    ASSERT_OK(host_->Commit(Key(n)));
    keys.push_back(Key(n));
  }
  const uint64_t flushes_before = faults_->Stats().flush_ops;
  for (const Status& s : mover.PersistBatch(*Tiers(), keys)) EXPECT_OK(s);
  EXPECT_EQ(faults_->Stats().flush_ops - flushes_before, 1u);
  EXPECT_EQ(nvme_->Stats().segments, 1000u);
}

TEST_F(TierMoverTest, FullDeviceFailsPersistWithIOErrorAndLosesNothing) {
  TierMover mover({.workers = 0}, SteadyClock::Default(), chain_.get(),
                  {Tiers()});
  PutHost(1);
  ASSERT_OK(PersistOne(mover, 1));
  PutHost(2);
  faults_->FailWrites(ENOSPC);
  Status s = PersistOne(mover, 2);
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("No space"), std::string_view::npos)
      << s.ToString();
  EXPECT_TRUE(HostHolds(2)) << "DRAM keeps serving the segment";
  EXPECT_TRUE(NvmeHolds(1)) << "what NVMe stored before is intact";
  faults_->ClearFaults();
  faults_->FailNthIo(1, EIO);
  EXPECT_EQ(PersistOne(mover, 2).code(), StatusCode::kIOError);
  faults_->ClearFaults();
  EXPECT_OK(PersistOne(mover, 2));
  EXPECT_TRUE(NvmeHolds(2));
  EXPECT_EQ(PersistOne(mover, 3).code(), StatusCode::kNotFound);
}

TEST_F(TierMoverTest, FailedWriteBackLeavesTheSegmentCachedAndEvictable) {
  TierMover mover({.workers = 1}, SteadyClock::Default(), chain_.get(),
                  {Tiers(WritePolicy::kWriteThrough)});
  faults_->FailWrites(ENOSPC);
  PutHost(1, /*dirty=*/true);
  mover.Kick();
  mover.TEST_Drain();
  EXPECT_EQ(mover.Stats().demotions_failed, 1u);
  EXPECT_EQ(host_->Stats().dirty_segments, 0u) << "not retried forever";
  EXPECT_TRUE(HostHolds(1));
}

TEST_F(TierMoverTest, PromotionOfCorruptSegmentIsAMissNeverBadBytes) {
  TierMover mover({.workers = 0}, SteadyClock::Default(), chain_.get(),
                  {Tiers()});
  PutHost(5);
  ASSERT_OK(PersistOne(mover, 5));
  auto entry = nvme_->TEST_Entry("ns", Key(5));
  ASSERT_TRUE(entry.has_value());
  ASSERT_OK(faults_->CorruptStoredBytes(entry->offset + 100, 1));
  for (uint64_t n = 100; n < 160; ++n) PutHost(n);  // evict 5 from DRAM
  ASSERT_FALSE(host_->Touch(Key(5)));
  EXPECT_EQ(PromoteOne(mover, 5).code(), StatusCode::kNotFound);
  EXPECT_FALSE(host_->Touch(Key(5)));
  EXPECT_EQ(nvme_->Stats().checksum_failures, 1u);
  EXPECT_EQ(host_->Stats().reserved_bytes, 0u)
      << "the failed promotion aborted";
}

TEST_F(TierMoverTest, FullPrefetchQueueDropsHintsInsteadOfBlocking) {
  TierMover mover({.workers = 0, .prefetch_queue = 1}, SteadyClock::Default(),
                  chain_.get(), {Tiers()});
  for (uint64_t n = 0; n < 20; ++n) mover.Prefetch(Tiers(), {Key(n)});
  const auto s = mover.Stats();
  EXPECT_EQ(s.prefetch_batches, 1u);
  EXPECT_EQ(s.prefetch_dropped, 19u);
  EXPECT_EQ(s.prefetch_queue_depth, 1u);
}

TEST_F(TierMoverTest,
       ReadsRacingWriteBackEvictionAndPromotionNeverSeeTornData) {
  TierMover mover({.workers = 2}, SteadyClock::Default(), chain_.get(),
                  {Tiers(WritePolicy::kWriteBack)});
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread reader([&] {
    while (!stop.load()) {
      for (uint64_t n = 0; n < 40; ++n) {
        auto loc = host_->Acquire(Key(n));
        if (loc.ok()) {
          if (std::memcmp(host_->arena().base() + loc->offset, Bytes(n).data(),
                          kSeg))
            bad++;
          host_->Release(Key(n));
        } else {
          (void)PromoteOne(mover, n);
        }
      }
    }
  });
  for (int round = 0; round < 5; ++round) {
    for (uint64_t n = 0; n < 80; ++n) {
      if (TryPutHost(n, /*dirty=*/true).code() == StatusCode::kBusy) {
        mover.Kick();
      }
    }
    mover.Kick();
  }
  stop = true;
  reader.join();
  mover.TEST_Drain();
  EXPECT_EQ(bad.load(), 0);
}

#ifdef TIERKV_SYNC_POINTS
// Issue 28: a KV promotion queued behind a large weights prefetch runs
// after the background job's current slice, not after the whole job.
TEST_F(TierMoverTest, AKvPrefetchOvertakesAQueuedBackgroundPrefetch) {
  const NamespaceTiers* tiers = Tiers();
  for (uint64_t n = 0; n < 13; ++n) {
    PutHost(n);
    {
      TierMover persist({.workers = 0}, SteadyClock::Default(), chain_.get(),
                        {tiers});
      ASSERT_OK(PersistOne(persist, n));
    }
    ASSERT_TRUE(host_->Drop(Key(n)));
  }
  Mutex mu;
  CondVar cv;
  std::vector<IoClass> order;
  bool first_slice_reached = false;
  bool go = false;
  SyncPoint& sp = SyncPoint::Get();
  sp.SetCallback(TierMover::kBeforePrefetch, [&](void* arg) {
    MutexLock lock(&mu);
    order.push_back(*static_cast<const IoClass*>(arg));
    if (order.size() == 1) {
      first_slice_reached = true;
      cv.SignalAll();
      while (!go) cv.Wait(&mu);
    }
  });
  sp.EnableProcessing();
  {
    TierMover mover({.workers = 1, .background_slice_segments = 4},
                    SteadyClock::Default(), chain_.get(), {tiers});
    std::vector<SegmentKey> weights;
    for (uint64_t n = 0; n < 12; ++n) weights.push_back(Key(n));
    mover.Prefetch(tiers, weights, IoClass::kBackground);
    {
      MutexLock lock(&mu);
      while (!first_slice_reached) cv.Wait(&mu);
    }
    mover.Prefetch(tiers, {Key(12)});  // KV, queued behind 8 more keys
    {
      MutexLock lock(&mu);
      go = true;
      cv.SignalAll();
    }
    mover.TEST_Drain();
    EXPECT_EQ(mover.Stats().background_slices, 3u);
  }
  sp.DisableProcessing();
  sp.ClearAllCallbacks();
  EXPECT_EQ(order,
            (std::vector<IoClass>{IoClass::kBackground, IoClass::kKv,
                                  IoClass::kBackground, IoClass::kBackground}));
  for (uint64_t n = 0; n < 13; ++n) EXPECT_TRUE(HostHolds(n)) << n;
}
#endif  // TIERKV_SYNC_POINTS

// prefetch_bytes_per_second is a token bucket on the mover's clock: a
// second's worth at once, then as much as the clock lets through.
TEST_F(TierMoverTest, BackgroundPrefetchesKeepToTheirNamespaceCap) {
  NamespaceTiers capped = *Tiers();
  capped.prefetch_bytes_per_second = 4 * kSeg;
  for (uint64_t n = 0; n < 12; ++n) {
    PutHost(n);
    {
      TierMover persist({.workers = 0}, SteadyClock::Default(), chain_.get(),
                        {&capped});
      ASSERT_OK(PersistOne(persist, n));
    }
    ASSERT_TRUE(host_->Drop(Key(n)));
  }
  testing::ManualClock clock;
  TierMover mover({.workers = 2, .background_slice_segments = 1}, &clock,
                  chain_.get(), {&capped});
  std::vector<SegmentKey> keys;
  for (uint64_t n = 0; n < 12; ++n) keys.push_back(Key(n));
  mover.Prefetch(&capped, keys, IoClass::kBackground,
                 std::vector<uint64_t>(keys.size(), kSeg));
  auto in_dram = [&] {
    size_t held = 0;
    for (uint64_t n = 0; n < 12; ++n) held += host_->Contains(Key(n)) ? 1 : 0;
    return held;
  };
  mover.TEST_Drain();  // returns once the rest waits for its tokens
  EXPECT_EQ(in_dram(), 4u);
  clock.Advance(std::chrono::seconds(1));
  mover.TEST_Drain();
  EXPECT_EQ(in_dram(), 8u);
  clock.Advance(std::chrono::milliseconds(500));
  mover.TEST_Drain();
  EXPECT_EQ(in_dram(), 10u);
  // In layer order: the first keys came first.
  for (uint64_t n = 0; n < 10; ++n) EXPECT_TRUE(host_->Contains(Key(n))) << n;
}

}  // namespace
}  // namespace tierkv::storage
