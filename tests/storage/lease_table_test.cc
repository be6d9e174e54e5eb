// Tests for storage/lease_table: leases, expiry and the per-owner and
// per-tier limits.
#include "storage/lease/lease_table.h"

#include <gtest/gtest.h>

#include "storage/host/host_tier.h"
#include "tests/testing/manual_clock.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

using testing::ManualClock;

using std::chrono::milliseconds;

class LeaseTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tier_ =
        std::move(HostTier::Create({.capacity_bytes = 1 << 20, .shards = 1}))
            .value();
  }
  SegmentKey Key(uint64_t n) { return SegmentKey{PageHash{n, n}, 0, 0}; }
  // Segment n as a lease covers it (every test segment has 64 KiB).
  LeasedSegment Seg(uint64_t n) { return {Key(n), 65536}; }
  void Put(const SegmentKey& k) {
    ASSERT_OK(tier_->Reserve(k, 65536));
    ASSERT_OK(tier_->Commit(k));
  }

  ManualClock clock_;
  std::unique_ptr<HostTier> tier_;
};

TEST_F(LeaseTableTest, ExpiredReadLeaseMakesSegmentEvictableAgain) {
  LeaseTable leases(&clock_);
  for (uint64_t i = 0; i < 16; ++i) Put(Key(i));
  ASSERT_OK(tier_->Acquire(Key(0)));
  leases.Add(/*owner=*/1, LeaseKind::kRead, tier_.get(), {Seg(0)},
             milliseconds(100));
  EXPECT_EQ(tier_->Stats().referenced_segments, 1u);
  clock_.Advance(milliseconds(99));
  EXPECT_EQ(leases.ExpireDue(), 0u);
  clock_.Advance(milliseconds(1));
  EXPECT_EQ(leases.ExpireDue(), 1u);
  EXPECT_EQ(tier_->Stats().referenced_segments, 0u);
}

TEST_F(LeaseTableTest, ExpiredWriteLeaseReclaimsReservedSpace) {
  LeaseTable leases(&clock_);
  ASSERT_OK(tier_->Reserve(Key(1), 65536));
  ASSERT_OK(tier_->Reserve(Key(2), 65536));
  uint64_t id = leases.Add(1, LeaseKind::kWrite, tier_.get(), {Seg(1), Seg(2)},
                           milliseconds(10));
  auto committed = leases.Commit(1, id, std::vector{Key(1)});
  ASSERT_OK(committed[0]);
  clock_.Advance(milliseconds(10));
  EXPECT_EQ(leases.ExpireDue(), 1u);
  EXPECT_EQ(tier_->Stats().reserved_bytes, 0u);
  EXPECT_TRUE(tier_->Touch(Key(1)));
  EXPECT_FALSE(tier_->Touch(Key(2)));
}

TEST_F(LeaseTableTest, AbortDropsChosenReservationsOfAWriteLease) {
  LeaseTable leases(&clock_);
  for (uint64_t n : {1, 2, 3}) ASSERT_OK(tier_->Reserve(Key(n), 65536));
  const uint64_t id = leases.Add(1, LeaseKind::kWrite, tier_.get(),
                                 {Seg(1), Seg(2), Seg(3)}, milliseconds(100));
  leases.Abort(/*owner=*/2, id, std::vector{Key(1)});  // not its lease
  EXPECT_EQ(tier_->Stats().reserved_bytes, 3u * 65536);
  leases.Abort(1, id, std::vector{Key(1), Key(9)});
  EXPECT_EQ(tier_->Stats().reserved_bytes, 2u * 65536);
  EXPECT_EQ(leases.segments_of(1), 2u);
  const auto committed = leases.Commit(1, id, std::vector{Key(1), Key(2)});
  EXPECT_EQ(committed[0].code(), StatusCode::kNotFound);
  ASSERT_OK(committed[1]);
  leases.Abort(1, id, std::vector{Key(3)});  // the last one ends the lease
  EXPECT_EQ(leases.size(), 0u);
  EXPECT_EQ(leases.leases_of(1), 0u);
  EXPECT_EQ(tier_->Stats().reserved_bytes, 0u);
}

TEST_F(LeaseTableTest, OwnersCannotTouchEachOthersLeases) {
  LeaseTable leases(&clock_);
  ASSERT_OK(tier_->Reserve(Key(1), 4096));
  uint64_t id = leases.Add(1, LeaseKind::kWrite, tier_.get(), {Seg(1)},
                           milliseconds(1000));
  EXPECT_EQ(leases.Release(2, id).code(), StatusCode::kNotFound);
  EXPECT_EQ(leases.Commit(2, id, std::vector{Key(1)})[0].code(),
            StatusCode::kNotFound);
  EXPECT_EQ(leases.Commit(1, id, std::vector{Key(7)})[0].code(),
            StatusCode::kNotFound);
  EXPECT_EQ(leases.ReleaseOwner(1), 1u);
  EXPECT_EQ(tier_->Stats().reserved_bytes, 0u);
  EXPECT_EQ(leases.size(), 0u);
}

TEST_F(LeaseTableTest, CommittingEveryKeyEndsTheLease) {
  LeaseTable leases(&clock_);
  ASSERT_OK(tier_->Reserve(Key(1), 4096));
  ASSERT_OK(tier_->Reserve(Key(2), 4096));
  uint64_t id = leases.Add(1, LeaseKind::kWrite, tier_.get(), {Seg(1), Seg(2)},
                           milliseconds(1000));
  auto st = leases.Commit(1, id, std::vector{Key(2), Key(1)});
  EXPECT_OK(st[0]);
  EXPECT_OK(st[1]);
  EXPECT_EQ(leases.size(), 0u);
  EXPECT_EQ(tier_->Stats().segments, 2u);
}

TEST_F(LeaseTableTest, RoomFollowsEachLimitAndComesBackOnRelease) {
  LeaseTable leases(&clock_, {.max_leases_per_owner = 3,
                              .max_segments_per_owner = 10,
                              .max_segments_per_tier = 15});
  for (uint64_t i = 0; i < 8; ++i) Put(Key(i));
  auto lease = [&](uint64_t owner, std::vector<SegmentKey> keys) {
    std::vector<LeasedSegment> segments;
    for (const auto& k : keys) {
      EXPECT_OK(tier_->Acquire(k));
      segments.push_back({k, 65536});
    }
    return leases.Add(owner, LeaseKind::kRead, tier_.get(), std::move(segments),
                      milliseconds(1000));
  };
  EXPECT_EQ(leases.Room(1, tier_.get(), 100), 10u);  // segments per owner
  const uint64_t a = lease(1, {Key(0), Key(1), Key(2), Key(3)});
  const char* why = nullptr;
  EXPECT_EQ(leases.Room(1, tier_.get(), 100, &why), 6u);
  EXPECT_STREQ(why, "leased segments per connection");
  EXPECT_EQ(leases.Room(1, tier_.get(), 2), 2u);  // fits: nothing bites
  lease(1, {Key(4)});
  lease(1, {Key(5)});
  EXPECT_EQ(leases.Room(1, tier_.get(), 1, &why), 0u);  // 3 leases held
  EXPECT_STREQ(why, "leases per connection");
  // Another owner of the same tier: 15 - 12 segments left in the tier.
  lease(2, {Key(0), Key(1), Key(2), Key(3), Key(4), Key(5)});
  EXPECT_EQ(leases.Room(2, tier_.get(), 100, &why), 3u);
  EXPECT_STREQ(why, "leased segments per namespace");
  lease(2, {Key(6), Key(7), Key(6)});
  EXPECT_EQ(leases.Room(3, tier_.get(), 100, &why), 0u);  // tier is full
  EXPECT_STREQ(why, "leased segments per namespace");
  EXPECT_EQ(leases.leases_on(tier_.get()), 5u);  // 3 of owner 1, 2 of owner 2
  // Release, disconnect and partial commit all give the room back.
  ASSERT_OK(leases.Release(1, a));
  EXPECT_EQ(leases.segments_of(1), 2u);
  EXPECT_EQ(leases.leases_of(1), 2u);
  EXPECT_EQ(leases.Room(3, tier_.get(), 100), 4u);
  EXPECT_EQ(leases.ReleaseOwner(2), 2u);
  EXPECT_EQ(leases.segments_of(2), 0u);
  EXPECT_EQ(leases.Room(3, tier_.get(), 100), 10u);
}

TEST_F(LeaseTableTest, CommitAnswersEachKeyInItsPlaceInOrderOrNot) {
  LeaseTable leases(&clock_);
  for (uint64_t n = 1; n <= 4; ++n) ASSERT_OK(tier_->Reserve(Key(n), 4096));
  const uint64_t id =
      leases.Add(1, LeaseKind::kWrite, tier_.get(),
                 {Seg(1), Seg(2), Seg(3), Seg(4)}, milliseconds(1000));
  // A duplicate commits once; a key the lease never reserved is NotFound.
  auto st = leases.Commit(1, id, std::vector{Key(1), Key(3), Key(3), Key(9)});
  ASSERT_EQ(st.size(), 4u);
  EXPECT_OK(st[0]);
  EXPECT_OK(st[1]);
  EXPECT_EQ(st[2].code(), StatusCode::kNotFound);
  EXPECT_EQ(st[3].code(), StatusCode::kNotFound);
  EXPECT_EQ(leases.size(), 1u);
  // The rest in reservation order (the common case) ends the lease.
  st = leases.Commit(1, id, std::vector{Key(2), Key(4)});
  ASSERT_EQ(st.size(), 2u);
  EXPECT_OK(st[0]);
  EXPECT_OK(st[1]);
  EXPECT_EQ(leases.size(), 0u);
  EXPECT_EQ(tier_->Stats().segments, 4u);
}

TEST_F(LeaseTableTest, PartialCommitsReturnTheirShareOfTheRoom) {
  LeaseTable leases(&clock_, {.max_segments_per_owner = 4});
  ASSERT_OK(tier_->Reserve(Key(1), 65536));
  ASSERT_OK(tier_->Reserve(Key(2), 65536));
  const uint64_t id = leases.Add(1, LeaseKind::kWrite, tier_.get(),
                                 {Seg(1), Seg(2)}, milliseconds(100));
  EXPECT_EQ(leases.Room(1, tier_.get(), 100), 2u);
  ASSERT_OK(leases.Commit(1, id, std::vector{Key(1)})[0]);
  EXPECT_EQ(leases.Room(1, tier_.get(), 100), 3u);
  ASSERT_OK(leases.Commit(1, id, std::vector{Key(2)})[0]);
  EXPECT_EQ(leases.leases_of(1), 0u);
  EXPECT_EQ(leases.Room(1, tier_.get(), 100), 4u);
}

// Bytes count against a percentage of the tier's capacity (1 MiB here):
// one owner up to 50%, all owners of the tier up to 90%, by default.
TEST_F(LeaseTableTest, LeasedBytesFollowTheirLimitsAndComeBackOnRelease) {
  LeaseTable leases(&clock_);
  for (uint64_t i = 0; i < 16; ++i) Put(Key(i));
  const std::vector<uint64_t> nine(9, 65536);
  const char* why = nullptr;
  EXPECT_EQ(leases.FitBytes(1, tier_.get(), nine, &why), 8u);  // 512 KiB
  EXPECT_STREQ(why, "leased bytes per connection");
  std::vector<LeasedSegment> first;
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_OK(tier_->Acquire(Key(i)));
    first.push_back(Seg(i));
  }
  const uint64_t a = leases.Add(1, LeaseKind::kRead, tier_.get(),
                                std::move(first), milliseconds(1000));
  EXPECT_EQ(leases.bytes_of(1), 512u << 10);
  EXPECT_EQ(leases.FitBytes(1, tier_.get(), nine, &why), 0u);
  // Another owner: 90% of 1 MiB is 943,718 B, 512 KiB are taken.
  EXPECT_EQ(leases.FitBytes(2, tier_.get(), nine, &why), 6u);
  EXPECT_STREQ(why, "leased bytes per namespace");
  ASSERT_OK(leases.Release(1, a));
  EXPECT_EQ(leases.bytes_of(1), 0u);
  EXPECT_EQ(leases.FitBytes(2, tier_.get(), nine, &why), 8u);
  // A partial commit returns the committed segment's bytes.
  ASSERT_OK(tier_->Reserve(Key(20), 65536));
  ASSERT_OK(tier_->Reserve(Key(21), 65536));
  const uint64_t w = leases.Add(3, LeaseKind::kWrite, tier_.get(),
                                {Seg(20), Seg(21)}, milliseconds(1000));
  EXPECT_EQ(leases.bytes_of(3), 128u << 10);
  ASSERT_OK(leases.Commit(3, w, std::vector{Key(20)})[0]);
  EXPECT_EQ(leases.bytes_of(3), 64u << 10);
  EXPECT_EQ(leases.ReleaseOwner(3), 1u);
  EXPECT_EQ(leases.bytes_of(3), 0u);
}

}  // namespace
}  // namespace tierkv::storage
