// The tier mover between a real HostTier and a real NvmeStore (RocksDB
// catalog) on a fault-injecting memory device.
#include "storage/tier_mover.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "tests/testing/fault_injection_device.h"
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
  }

  TierPair Tiers() { return {"ns", host_.get(), nvme_.get()}; }

  std::vector<std::byte> Bytes(uint64_t n) {
    std::vector<std::byte> b(kSeg);
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = static_cast<std::byte>(n * 31 + i);
    return b;
  }
  void PutHost(uint64_t n) {
    auto loc = host_->Reserve(Key(n), kSeg);
    ASSERT_OK(loc);
    auto b = Bytes(n);
    std::memcpy(host_->arena().base() + loc->offset, b.data(), kSeg);
    ASSERT_OK(host_->Commit(Key(n)));
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
  std::unique_ptr<HostTier> host_;
  std::shared_ptr<FaultInjectionDevice> faults_;
  std::unique_ptr<NvmeStore> nvme_;
};

TEST_F(TierMoverTest, WriteBackPersistsWhatHostEvicts) {
  TierMover mover({.workers = 1});
  host_->SetEvictionListener(
      [&](const SegmentKey& k, std::span<const std::byte> b) {
        mover.EnqueueEvicted(Tiers(), kFp, k, b);
      });
  for (uint64_t n = 0; n < 80; ++n) PutHost(n);  // 4 MiB holds 56
  mover.TEST_Drain();
  EXPECT_GE(host_->Stats().evictions, 24u);
  for (uint64_t n = 0; n < 24; ++n) {
    EXPECT_FALSE(host_->Touch(Key(n)));
    EXPECT_TRUE(NvmeHolds(n)) << n;
  }
  EXPECT_EQ(mover.Stats().demotions_done, host_->Stats().evictions);
}

TEST_F(TierMoverTest, WriteThroughAndPromotionRoundTrip) {
  TierMover mover({.workers = 2});
  for (uint64_t n = 0; n < 10; ++n) {
    PutHost(n);
    mover.EnqueueCommitted(Tiers(), kFp, Key(n));
  }
  mover.TEST_Drain();
  for (uint64_t n = 0; n < 10; ++n) EXPECT_TRUE(NvmeHolds(n));
  // Push them out of DRAM, then bring them back asynchronously.
  for (uint64_t n = 100; n < 160; ++n) PutHost(n);
  EXPECT_FALSE(host_->Touch(Key(0)));
  for (uint64_t n = 0; n < 10; ++n)
    mover.EnqueuePromotion(Tiers(), kFp, Key(n));
  mover.TEST_Drain();
  for (uint64_t n = 0; n < 10; ++n) EXPECT_TRUE(HostHolds(n)) << n;
  EXPECT_EQ(mover.Stats().promotions_done, 10u);
}

TEST_F(TierMoverTest, FullDeviceFailsPersistWithIOErrorAndLosesNothing) {
  PutHost(1);
  ASSERT_OK(TierMover::PersistNow(Tiers(), kFp, Key(1)));
  PutHost(2);
  faults_->FailWrites(ENOSPC);
  Status s = TierMover::PersistNow(Tiers(), kFp, Key(2));
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("No space"), std::string_view::npos)
      << s.ToString();
  EXPECT_TRUE(HostHolds(2)) << "DRAM keeps serving the segment";
  EXPECT_TRUE(NvmeHolds(1)) << "what NVMe stored before is intact";
  faults_->ClearFaults();
  faults_->FailNthIo(1, EIO);
  EXPECT_EQ(TierMover::PersistNow(Tiers(), kFp, Key(2)).code(),
            StatusCode::kIOError);
  faults_->ClearFaults();
  EXPECT_OK(TierMover::PersistNow(Tiers(), kFp, Key(2)));
  EXPECT_TRUE(NvmeHolds(2));
}

TEST_F(TierMoverTest, PromotionOfCorruptSegmentIsAMissNeverBadBytes) {
  PutHost(5);
  ASSERT_OK(TierMover::PersistNow(Tiers(), kFp, Key(5)));
  auto entry = nvme_->TEST_Entry("ns", Key(5));
  ASSERT_TRUE(entry.has_value());
  ASSERT_OK(faults_->CorruptStoredBytes(entry->offset + 100, 1));
  for (uint64_t n = 100; n < 160; ++n) PutHost(n);  // evict 5 from DRAM
  ASSERT_FALSE(host_->Touch(Key(5)));
  EXPECT_EQ(TierMover::PromoteNow(Tiers(), kFp, Key(5)).code(),
            StatusCode::kNotFound);
  EXPECT_FALSE(host_->Touch(Key(5)));
  EXPECT_EQ(nvme_->Stats().checksum_failures, 1u);
  EXPECT_EQ(host_->Stats().reserved_bytes, 0u)
      << "the failed promotion aborted";
}

TEST_F(TierMoverTest, FullQueuesDropInsteadOfBlocking) {
  TierMover mover({.workers = 0, .demotion_queue = 2, .promotion_queue = 1});
  for (uint64_t n = 0; n < 20; ++n)
    mover.EnqueuePromotion(Tiers(), kFp, Key(n));
  for (uint64_t n = 0; n < 5; ++n) mover.EnqueueCommitted(Tiers(), kFp, Key(n));
  const auto s = mover.Stats();
  EXPECT_EQ(s.promotions_queued, 1u);
  EXPECT_EQ(s.promotions_dropped, 19u);
  EXPECT_EQ(s.demotions_queued, 2u);
  EXPECT_EQ(s.demotions_dropped, 3u);
  EXPECT_EQ(s.promotion_queue_depth, 1u);
}

TEST_F(TierMoverTest, ReadsRacingEvictionAndPromotionNeverSeeTornData) {
  TierMover mover({.workers = 2});
  host_->SetEvictionListener(
      [&](const SegmentKey& k, std::span<const std::byte> b) {
        mover.EnqueueEvicted(Tiers(), kFp, k, b);
      });
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
          (void)TierMover::PromoteNow(Tiers(), kFp, Key(n));
        }
      }
    }
  });
  for (int round = 0; round < 5; ++round) {
    for (uint64_t n = 0; n < 80; ++n) {
      auto loc = host_->Reserve(Key(n), kSeg);
      if (loc.ok()) {
        std::memcpy(host_->arena().base() + loc->offset, Bytes(n).data(), kSeg);
        ASSERT_OK(host_->Commit(Key(n)));
      }
    }
  }
  stop = true;
  reader.join();
  mover.TEST_Drain();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace tierkv::storage
