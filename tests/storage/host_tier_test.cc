// Tests for storage/host_tier: reservations, references, write-back, and
// one space and eviction order across shards.
#include "storage/host/host_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/testing/manual_clock.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

SegmentKey Key(uint64_t n, uint16_t layer = 0) {
  return SegmentKey{PageHash{n, n * 31 + 7}, layer, 0};
}

std::unique_ptr<HostTier> MakeTier(uint64_t capacity, uint32_t shards) {
  auto tier = HostTier::Create(
      {.name = "t", .capacity_bytes = capacity, .shards = shards});
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  return std::move(tier).value();
}

// Reserve + write + commit, as a client does.
void PutSegment(HostTier& tier, const SegmentKey& key, uint64_t size, char fill,
                bool dirty = false) {
  auto r = tier.Reserve(key, size);
  ASSERT_OK(r);
  ASSERT_FALSE(r->already_stored);
  std::memset(tier.arena().base() + r->location.offset, fill, size);
  ASSERT_OK(tier.Commit(key, dirty));
}

TEST(HostTierTest, CommittedSegmentIsReadableAtItsOffset) {
  auto tier = MakeTier(8 << 20, 1);
  PutSegment(*tier, Key(1), 72 * 1024, 'a');
  auto loc = tier->Acquire(Key(1));
  ASSERT_OK(loc);
  EXPECT_EQ(loc->size, 72u * 1024);
  EXPECT_EQ(static_cast<char>(tier->arena().base()[loc->offset + 100]), 'a');
  tier->Release(Key(1));
  EXPECT_EQ(tier->Stats().segments, 1u);
}

TEST(HostTierTest, ReservedSegmentIsInvisibleUntilCommitted) {
  auto tier = MakeTier(8 << 20, 1);
  ASSERT_OK(tier->Reserve(Key(1), 4096));
  EXPECT_EQ(tier->Acquire(Key(1)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->Reserve(Key(1), 4096).status().code(), StatusCode::kBusy);
  tier->Abort(Key(1));
  EXPECT_EQ(tier->Stats().reserved_bytes, 0u);
  EXPECT_EQ(tier->Stats().aborts, 1u);
  ASSERT_OK(tier->Reserve(Key(1), 4096));
}

TEST(HostTierTest, ReservedSaysWhereAnUncommittedSegmentGoes) {
  auto tier = MakeTier(8 << 20, 1);
  auto r = tier->Reserve(Key(1), 4096);
  ASSERT_OK(r);
  auto at = tier->Reserved(Key(1));
  ASSERT_OK(at);
  EXPECT_EQ(at->offset, r->location.offset);
  EXPECT_EQ(at->size, 4096u);
  EXPECT_EQ(tier->SizeOf(Key(1)), 0u);  // not committed
  ASSERT_OK(tier->Commit(Key(1)));
  EXPECT_EQ(tier->Reserved(Key(1)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->SizeOf(Key(1)), 4096u);
  EXPECT_EQ(tier->Reserved(Key(2)).status().code(), StatusCode::kNotFound);
}

TEST(HostTierTest, DropRemovesUnreferencedSegmentsCleanOrDirty) {
  auto tier = MakeTier(8 << 20, 1);
  PutSegment(*tier, Key(1), 8192, 'a');
  PutSegment(*tier, Key(2), 8192, 'b', /*dirty=*/true);
  PutSegment(*tier, Key(3), 8192, 'c');
  ASSERT_OK(tier->Acquire(Key(3)));
  EXPECT_TRUE(tier->Drop(Key(1)));
  EXPECT_TRUE(tier->Drop(Key(2)));
  EXPECT_FALSE(tier->Drop(Key(3)));  // leased: left to eviction
  EXPECT_FALSE(tier->Drop(Key(4)));  // absent
  ASSERT_OK(tier->Reserve(Key(5), 4096));
  EXPECT_FALSE(tier->Drop(Key(5)));  // reserved, not committed
  const HostTierStats stats = tier->Stats();
  EXPECT_EQ(stats.segments, 1u);
  EXPECT_EQ(stats.dirty_segments, 0u);
  EXPECT_EQ(stats.dirty_bytes, 0u);
  EXPECT_FALSE(tier->Contains(Key(1)));
  EXPECT_FALSE(tier->Contains(Key(2)));
  tier->Release(Key(3));
  EXPECT_TRUE(tier->Drop(Key(3)));
  EXPECT_EQ(tier->Stats().used_bytes, 0u);
  // The space is free again: the key can be stored anew.
  PutSegment(*tier, Key(1), 8192, 'z');
}

TEST(HostTierTest, DuplicatePutIsDedupedWithoutUsingSpace) {
  auto tier = MakeTier(8 << 20, 2);
  PutSegment(*tier, Key(1), 10000, 'x');
  const uint64_t used = tier->Stats().used_bytes;
  auto again = tier->Reserve(Key(1), 10000);
  ASSERT_OK(again);
  EXPECT_TRUE(again->already_stored);
  EXPECT_EQ(tier->Stats().used_bytes, used);
  EXPECT_EQ(tier->Stats().dedup_hits, 1u);
}

TEST(HostTierTest, EvictsLeastRecentlyUsedSegmentFirst) {
  auto tier = MakeTier(1 << 20, 1);  // 16 segments of 64 KiB
  for (uint64_t i = 0; i < 16; ++i) PutSegment(*tier, Key(i), 65536, 'a');
  ASSERT_TRUE(tier->Touch(Key(0)));  // 0 is now most recent; 1 is oldest
  PutSegment(*tier, Key(100), 65536, 'b');
  EXPECT_TRUE(tier->Touch(Key(0)));
  EXPECT_FALSE(tier->Touch(Key(1)));
  EXPECT_TRUE(tier->Touch(Key(2)));
  EXPECT_EQ(tier->Stats().evictions, 1u);
}

TEST(HostTierTest, NeverEvictsReferencedSegments) {
  auto tier = MakeTier(1 << 20, 1);
  for (uint64_t i = 0; i < 16; ++i) PutSegment(*tier, Key(i), 65536, 'a');
  for (uint64_t i = 0; i < 8; ++i) ASSERT_OK(tier->Acquire(Key(i)));
  for (uint64_t i = 100; i < 140; ++i) PutSegment(*tier, Key(i), 65536, 'b');
  for (uint64_t i = 0; i < 8; ++i) EXPECT_TRUE(tier->Touch(Key(i))) << i;
  EXPECT_EQ(tier->Stats().referenced_segments, 8u);
  // With every segment referenced, a put fails cleanly.
  for (uint64_t i = 100; i < 140; ++i) (void)tier->Acquire(Key(i));
  EXPECT_EQ(tier->Reserve(Key(999), 65536).status().code(),
            StatusCode::kResourceExhausted);
}

TEST(HostTierTest, DirtySegmentsAreNeverEvictedAndFullShardsPushBack) {
  auto tier = MakeTier(1 << 20, 1);  // 16 segments of 64 KiB
  for (uint64_t i = 0; i < 16; ++i) {
    PutSegment(*tier, Key(i), 65536, 'd', /*dirty=*/true);
  }
  EXPECT_EQ(tier->Stats().dirty_segments, 16u);
  // No clean segment to evict: backpressure, and nothing is lost.
  EXPECT_EQ(tier->Reserve(Key(100), 65536).status().code(), StatusCode::kBusy);
  EXPECT_EQ(tier->Stats().backpressure_rejections, 1u);
  for (uint64_t i = 0; i < 16; ++i) EXPECT_TRUE(tier->Touch(Key(i))) << i;

  // The mover takes the oldest dirty segments (0 was touched first above,
  // so it is the oldest) and marks them persisted: they become evictable.
  auto taken = tier->TakeDirty(/*max_items=*/2, /*max_bytes=*/1 << 20,
                               /*only_needed=*/false);
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].key, Key(0));
  EXPECT_EQ(taken[1].key, Key(1));
  EXPECT_EQ(static_cast<char>(tier->arena().base()[taken[0].location.offset]),
            'd');
  // Taken, not finished: still not evictable, not taken twice.
  EXPECT_EQ(tier->Reserve(Key(100), 65536).status().code(), StatusCode::kBusy);
  EXPECT_EQ(tier->TakeDirty(16, 1 << 20, false).size(), 14u);
  // Finished newest first, so the oldest ends at the clean tail.
  tier->FinishPersist(taken[1].key, /*persisted=*/true, /*retry=*/false);
  tier->FinishPersist(taken[0].key, /*persisted=*/true, /*retry=*/false);
  EXPECT_EQ(tier->Stats().dirty_segments, 14u);
  PutSegment(*tier, Key(100), 65536, 'n');
  EXPECT_FALSE(tier->Touch(Key(0))) << "the persisted segment is evicted";
  EXPECT_TRUE(tier->Touch(Key(1)));
}

TEST(HostTierTest, WriteBackTakesDirtySegmentsOnlyWhenCleanSpaceRunsShort) {
  auto tier = HostTier::Create({.name = "t",
                                .capacity_bytes = 1 << 20,
                                .shards = 1,
                                .clean_reserve_fraction = 0.25});
  ASSERT_OK(tier);
  for (uint64_t i = 0; i < 8; ++i) {
    PutSegment(**tier, Key(i), 65536, 'd', /*dirty=*/true);
  }
  // Half the tier is free: nothing needs writing back yet.
  EXPECT_TRUE((*tier)->TakeDirty(64, 1 << 20, /*only_needed=*/true).empty());
  for (uint64_t i = 8; i < 14; ++i) {
    PutSegment(**tier, Key(i), 65536, 'd', /*dirty=*/true);
  }
  // 2 of 16 slots free, below the reserve of 4: clean up to twice the
  // reserve (8 ready slots), taking 6, oldest first.
  auto taken = (*tier)->TakeDirty(64, 1 << 20, /*only_needed=*/true);
  ASSERT_EQ(taken.size(), 6u);
  EXPECT_EQ(taken[0].key, Key(0));
  EXPECT_EQ(taken[5].key, Key(5));
  // Taken segments count as ready now: nothing more is needed.
  EXPECT_TRUE((*tier)->TakeDirty(64, 1 << 20, /*only_needed=*/true).empty());
}

TEST(HostTierTest, FailedWriteBackRetriesOrGivesUpWithoutLosingTheSegment) {
  auto tier = MakeTier(1 << 20, 1);
  PutSegment(*tier, Key(1), 65536, 'a', /*dirty=*/true);
  auto taken = tier->TakeDirty(8, 1 << 20, false);
  ASSERT_EQ(taken.size(), 1u);
  tier->FinishPersist(Key(1), /*persisted=*/false, /*retry=*/true);
  EXPECT_EQ(tier->Stats().dirty_segments, 1u);
  ASSERT_EQ(tier->TakeDirty(8, 1 << 20, false).size(), 1u);
  tier->FinishPersist(Key(1), /*persisted=*/false, /*retry=*/false);
  EXPECT_EQ(tier->Stats().dirty_segments, 0u);
  EXPECT_TRUE(tier->Touch(Key(1))) << "still cached in DRAM";
}

TEST(HostTierTest, GenerationAdvancesOnCommitAbortAndWriteBack) {
  // The deadline is on the caller's clock: an unmoved manual clock never
  // times out, so each wait below returns only because the tier changed.
  auto tier = MakeTier(1 << 20, 1);
  testing::ManualClock clock;
  const auto now = clock.Now();
  uint64_t seen = tier->Generation();
  EXPECT_FALSE(tier->WaitChange(seen, clock, now)) << "deadline reached";
  ASSERT_OK(tier->Reserve(Key(1), 4096));
  std::thread committer([&] { EXPECT_OK(tier->Commit(Key(1), true)); });
  EXPECT_TRUE(tier->WaitChange(seen, clock, now + std::chrono::hours(1)));
  committer.join();
  seen = tier->Generation();
  ASSERT_EQ(tier->TakeDirty(1, 1 << 20, false).size(), 1u);
  tier->FinishPersist(Key(1), /*persisted=*/true, /*retry=*/false);
  EXPECT_TRUE(tier->WaitChange(seen, clock, now));
  seen = tier->Generation();
  ASSERT_OK(tier->Reserve(Key(2), 4096));
  tier->Abort(Key(2));
  EXPECT_TRUE(tier->WaitChange(seen, clock, now));

  // A waiter with no change to see gives up once the clock passes.
  seen = tier->Generation();
  std::thread advancer([&] { clock.Advance(std::chrono::hours(1)); });
  EXPECT_FALSE(tier->WaitChange(seen, clock, now + std::chrono::hours(1)));
  advancer.join();
}

TEST(HostTierTest, AReservationTakesTheSpaceOfAVictimOfItsSize) {
  auto tier = MakeTier(1 << 20, 1);  // 16 segments of 64 KiB
  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; i < 16; ++i) {
    auto r = tier->Reserve(Key(i), 65536);
    ASSERT_OK(r);
    offsets.push_back(r->location.offset);
    ASSERT_OK(tier->Commit(Key(i), false));
  }
  // Same size: the least recently used segment's extent, as it was.
  auto same = tier->Reserve(Key(100), 65536);
  ASSERT_OK(same);
  EXPECT_EQ(same->location.offset, offsets[0]);
  EXPECT_EQ(same->location.extent, 65536u);
  ASSERT_OK(tier->Commit(Key(100), false));
  EXPECT_FALSE(tier->Touch(Key(0)));
  // Another size: victims go back to the allocator until a free extent
  // fits (segments 1 and 2, adjacent, coalesce to 128 KiB).
  auto larger = tier->Reserve(Key(101), 100 * 1024);
  ASSERT_OK(larger);
  EXPECT_EQ(larger->location.offset, std::min(offsets[1], offsets[2]));
  ASSERT_OK(tier->Commit(Key(101), false));
  const HostTierStats s = tier->Stats();
  EXPECT_EQ(s.evictions, 3u);
  EXPECT_EQ(s.segments, 15u);
  EXPECT_EQ(s.used_bytes, 14 * 65536u + 100 * 1024u);
  EXPECT_EQ(s.largest_free_bytes, 128 * 1024u - 100 * 1024u);
}

// ReserveIndex populates the nodes of a fresh arena's entries ahead: up to
// the reserved count they come from populated memory (the heap's share
// does not grow), beyond it from the heap; evictions recycle nodes.
TEST(HostTierTest, ReservedIndexMemoryHoldsAFreshArenasEntries) {
  auto tier = MakeTier(64 << 20, 1);  // 16384 segments of 4 KiB
  EXPECT_EQ(tier->Stats().index_populated_bytes, 0u);
  tier->ReserveIndex(1000);
  const HostTierStats reserved = tier->Stats();
  EXPECT_GE(reserved.index_populated_bytes, 1000 * sizeof(SegmentKey));
  for (uint64_t i = 0; i < 1000; ++i) PutSegment(*tier, Key(i), 4096, 'a');
  EXPECT_EQ(tier->Stats().index_heap_bytes, reserved.index_heap_bytes);
  // A smaller count later changes nothing.
  tier->ReserveIndex(10);
  EXPECT_EQ(tier->Stats().index_populated_bytes,
            reserved.index_populated_bytes);
  for (uint64_t i = 1000; i < 3000; ++i) PutSegment(*tier, Key(i), 4096, 'b');
  EXPECT_GT(tier->Stats().index_heap_bytes, reserved.index_heap_bytes);
  // Full, then 4000 more: each Put evicts one, and its node is reused (a
  // Put's new node is allocated before its victim's goes: the first
  // evicting Put may take one more).
  for (uint64_t i = 3000; i <= 16384; ++i) PutSegment(*tier, Key(i), 4096, 'c');
  const HostTierStats full = tier->Stats();
  EXPECT_EQ(full.segments, 16384u);
  EXPECT_EQ(full.evictions, 1u);
  for (uint64_t i = 16385; i < 20385; ++i) {
    PutSegment(*tier, Key(i), 4096, 'd');
  }
  const HostTierStats after = tier->Stats();
  EXPECT_EQ(after.evictions, 4001u);
  EXPECT_EQ(after.index_heap_bytes, full.index_heap_bytes);
  EXPECT_EQ(after.index_populated_bytes, full.index_populated_bytes);
}

// The reservation is bounded by the arena (a layout of tiny segments asks
// for far more entries than it could ever hold), and skipped for a tier
// that commits memory on first use.
TEST(HostTierTest, IndexReservationIsBoundedAndFollowsPrefault) {
  auto tier = MakeTier(16 << 20, 2);
  tier->ReserveIndex(UINT64_MAX / 2);
  const uint64_t populated = tier->Stats().index_populated_bytes;
  EXPECT_GT(populated, 0u);
  // The share, and per shard a partial page.
  EXPECT_LE(populated, (16u << 20) / HostTier::kMaxIndexShare + 2 * 4096);

  auto lazy = HostTier::Create({.name = "lazy",
                                .capacity_bytes = 16 << 20,
                                .shards = 2,
                                .prefault = false});
  ASSERT_OK(lazy);
  (*lazy)->ReserveIndex(1000);
  EXPECT_EQ((*lazy)->Stats().index_populated_bytes, 0u);
}

// Shards partition the index only: a full tier evicts its least recently
// used segments whichever shards hold them (a per-shard LRU would evict
// each shard's own oldest as its keys come), and a segment may be as large
// as the whole tier.
TEST(HostTierTest, ShardsShareOneSpaceAndOneLruOrder) {
  auto tier = MakeTier(8 << 20, 8);  // 128 segments of 64 KiB
  for (uint64_t i = 0; i < 128; ++i) PutSegment(*tier, Key(i), 65536, 'z');
  EXPECT_EQ(tier->Stats().evictions, 0u);
  for (uint64_t i = 0; i < 64; i += 2) ASSERT_TRUE(tier->Touch(Key(i)));
  // The 64 least recently used are the odd keys below 64 and 64..95.
  for (uint64_t i = 1000; i < 1064; ++i) PutSegment(*tier, Key(i), 65536, 'n');
  EXPECT_EQ(tier->Stats().evictions, 64u);
  for (uint64_t i = 0; i < 128; ++i) {
    const bool recent = (i < 64 && i % 2 == 0) || i >= 96;
    EXPECT_EQ(tier->Touch(Key(i)), recent) << i;
  }
  // Larger than capacity / shards.
  PutSegment(*tier, Key(5000), 3 << 20, 'b');
  auto s = tier->Stats();
  EXPECT_LE(s.used_bytes, s.capacity_bytes);
  EXPECT_EQ(s.inserts - s.evictions, s.segments);
  EXPECT_EQ(tier->Reserve(Key(1), (8 << 20) + 1).status().code(),
            StatusCode::kInvalidArgument);
}

// `2q`: segments stored once go before segments used again, across shards.
TEST(HostTierTest, TwoQueuePolicyEvictsSegmentsUsedOnceFirst) {
  auto tier =
      HostTier::Create({.name = "t",
                        .capacity_bytes = 8 << 20,
                        .shards = 8,
                        .eviction_policy = EvictionPolicyKind::kTwoQueue});
  ASSERT_OK(tier);
  for (uint64_t i = 0; i < 128; ++i) PutSegment(**tier, Key(i), 65536, 'z');
  // The oldest 32 are used again (a prefix matched by a later request).
  for (uint64_t i = 0; i < 32; ++i) ASSERT_TRUE((*tier)->Touch(Key(i)));
  for (uint64_t i = 1000; i < 1032; ++i) {
    PutSegment(**tier, Key(i), 65536, 'n');
  }
  for (uint64_t i = 0; i < 32; ++i) EXPECT_TRUE((*tier)->Touch(Key(i))) << i;
  for (uint64_t i = 32; i < 64; ++i) EXPECT_FALSE((*tier)->Touch(Key(i))) << i;
}

TEST(HostTierTest, RejectsBadOptions) {
  EXPECT_FALSE(HostTier::Create({.capacity_bytes = 1 << 20, .shards = 8}).ok());
  EXPECT_FALSE(HostTier::Create({.capacity_bytes = 8 << 20, .shards = 0}).ok());
  EXPECT_FALSE(HostTier::Create(
                   {.capacity_bytes = 8 << 20, .shards = 1, .alignment = 48})
                   .ok());
}

TEST(HostTierTest, ConcurrentPutsAndReadsKeepAccountingExact) {
  auto tier = MakeTier(16 << 20, 4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 2000; ++i) {
        SegmentKey k = Key(i % 500, static_cast<uint16_t>(t));
        auto r = tier->Reserve(k, 8192 + 64 * (i % 7));
        if (r.ok() && !r->already_stored) {
          std::memset(tier->arena().base() + r->location.offset, t,
                      r->location.size);
          EXPECT_OK(tier->Commit(k));
        }
        if (tier->Acquire(k).ok()) tier->Release(k);
      }
    });
  }
  for (auto& th : threads) th.join();
  auto s = tier->Stats();
  EXPECT_EQ(s.referenced_segments, 0u);
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.inserts - s.evictions, s.segments);
}

}  // namespace
}  // namespace tierkv::storage
