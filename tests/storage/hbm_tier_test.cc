// HbmTier: reservations become hits only once committed (and a namespace
// view is a LeasedTier holding nothing dirty), LRU eviction of
// unreferenced entries, references pin, quotas evict the namespace's own
// entries first, and a failed copy's reservation leaves nothing behind.
#include "storage/device/hbm_tier.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

SegmentKey Key(uint64_t page, uint16_t layer = 0) {
  return {PageHash{page, page * 7 + 1}, layer, 0};
}

// Reserve + Commit, as a finished copy does.
void Admit(HbmTier& t, uint32_t ns, const SegmentKey& k, uint64_t size) {
  ASSERT_OK(t.Reserve(ns, k, size));
  ASSERT_OK(t.Commit(ns, k));
}

TEST(HbmTierTest, ASegmentIsHitOnlyOnceCommitted) {
  HbmTier t(1 << 20, {0});
  auto at = t.Reserve(0, Key(1), 4096);
  ASSERT_OK(at);
  ASSERT_FALSE(at->already_stored);
  EXPECT_FALSE(t.Contains(0, Key(1)));
  EXPECT_EQ(t.Acquire(0, Key(1)).status().code(),
            StatusCode::kNotFound);  // the copy is not done
  EXPECT_EQ(t.Reserve(0, Key(1), 4096).status().code(),
            StatusCode::kBusy);  // being admitted by another copy
  ASSERT_OK(t.Commit(0, Key(1)));
  EXPECT_EQ(t.Commit(0, Key(1)).code(), StatusCode::kNotFound);  // once
  EXPECT_TRUE(t.Contains(0, Key(1)));
  EXPECT_FALSE(t.Contains(1, Key(1)));  // namespaces do not share
  auto again = t.Reserve(0, Key(1), 4096);
  ASSERT_OK(again);
  EXPECT_TRUE(again->already_stored);  // dedup: nothing to copy
  auto hit = t.Acquire(0, Key(1));
  ASSERT_OK(hit);
  EXPECT_EQ(hit->offset, at->location.offset);
  EXPECT_EQ(hit->size, 4096u);
  t.Release(0, Key(1));
  const HbmTierStats s = t.Stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.admissions, 1u);
}

TEST(HbmTierTest, ANamespaceViewIsALeasedTierThatHoldsNothingDirty) {
  HbmTier t(1 << 20, {512 << 10, 0});
  HbmNamespaceTier view(&t, 0);
  LeasedTier& leased = view;
  EXPECT_EQ(leased.name(), "hbm");
  EXPECT_EQ(leased.capacity_bytes(), 512u << 10);  // the quota
  EXPECT_EQ(HbmNamespaceTier(&t, 1).capacity_bytes(), 1u << 20);
  auto at = leased.Reserve(Key(1), 4096);
  ASSERT_OK(at);
  // A copy is never the only one: it cannot be dirty, and the refused
  // commit leaves no reservation behind.
  EXPECT_EQ(leased.Commit(Key(1), /*dirty=*/true).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Stats().used_bytes, 0u);
  ASSERT_OK(leased.Reserve(Key(1), 4096));
  // Committed referenced: not evictable until released.
  ASSERT_OK(leased.Commit(Key(1), /*dirty=*/false, /*acquire=*/true));
  EXPECT_TRUE(view.Contains(Key(1)));
  EXPECT_FALSE(HbmNamespaceTier(&t, 1).Contains(Key(1)));
  EXPECT_EQ(leased.Reserve(Key(2), 512 << 10).status().code(),
            StatusCode::kResourceExhausted);  // 1 is held, the quota full
  leased.Release(Key(1));
  ASSERT_OK(leased.Reserve(Key(2), 512 << 10));  // now 1 can go
  EXPECT_FALSE(view.Contains(Key(1)));
  EXPECT_TRUE(leased.TakeDirty(16, 1 << 20, /*only_needed=*/false).empty());
}

TEST(HbmTierTest, TheLeastRecentUnreferencedSegmentGoesFirst) {
  // Room for 4 segments of 256 KiB.
  HbmTier t(1 << 20, {0});
  for (uint64_t p = 1; p <= 4; ++p) Admit(t, 0, Key(p), 256 << 10);
  // Page 1 used again (most recent), page 2 referenced (pinned).
  ASSERT_OK(t.Acquire(0, Key(1)));
  t.Release(0, Key(1));
  ASSERT_OK(t.Acquire(0, Key(2)));
  Admit(t, 0, Key(5), 256 << 10);  // evicts 3: 2 is pinned, 1 is recent
  EXPECT_TRUE(t.Contains(0, Key(1)));
  EXPECT_TRUE(t.Contains(0, Key(2)));
  EXPECT_FALSE(t.Contains(0, Key(3)));
  Admit(t, 0, Key(6), 256 << 10);  // then 4
  EXPECT_FALSE(t.Contains(0, Key(4)));
  Admit(t, 0, Key(7), 256 << 10);  // then 1; 2 stays pinned
  EXPECT_FALSE(t.Contains(0, Key(1)));
  EXPECT_TRUE(t.Contains(0, Key(2)));
  // Everything left is pinned or reserved: no room, nothing lost.
  ASSERT_OK(t.Acquire(0, Key(5)));
  ASSERT_OK(t.Acquire(0, Key(6)));
  ASSERT_OK(t.Acquire(0, Key(7)));
  EXPECT_EQ(t.Reserve(0, Key(8), 256 << 10).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(t.Stats().evictions, 3u);
  EXPECT_EQ(t.Stats().admission_failures, 1u);
  t.Release(0, Key(2));
  EXPECT_OK(t.Reserve(0, Key(8), 256 << 10));  // 2 can go now
  EXPECT_FALSE(t.Contains(0, Key(2)));
}

TEST(HbmTierTest, AQuotaEvictsTheNamespacesOwnSegmentsFirst) {
  // 1 MiB; namespace 0 may hold 512 KiB, namespace 1 all of it.
  HbmTier t(1 << 20, {512 << 10, 0});
  Admit(t, 1, Key(100), 256 << 10);  // the oldest in the tier
  Admit(t, 0, Key(1), 256 << 10);
  Admit(t, 0, Key(2), 256 << 10);
  Admit(t, 0, Key(3), 256 << 10);  // over its quota: evicts its own 1
  EXPECT_FALSE(t.Contains(0, Key(1)));
  EXPECT_TRUE(t.Contains(1, Key(100)));  // not the other tenant's
  const HbmTierStats s = t.Stats();
  EXPECT_EQ(s.namespaces[0].used_bytes, 512u << 10);
  EXPECT_EQ(s.namespaces[0].quota_bytes, 512u << 10);
  EXPECT_EQ(s.namespaces[1].used_bytes, 256u << 10);
  EXPECT_EQ(t.Reserve(0, Key(9), 768 << 10).status().code(),
            StatusCode::kResourceExhausted);  // larger than the quota
  // Namespace 1 filling the tier evicts the least recent of all.
  Admit(t, 1, Key(101), 256 << 10);
  Admit(t, 1, Key(102), 256 << 10);  // full: evicts 100, the oldest
  EXPECT_FALSE(t.Contains(1, Key(100)));
  EXPECT_TRUE(t.Contains(0, Key(2)));
}

TEST(HbmTierTest, TheWholeTierIsOneLruAcrossNamespaces) {
  // Each namespace's entries are ordered by its own policy; the tier's
  // victim is the least recent of theirs, so the tier stays exact LRU.
  HbmTier t(1 << 20, {0, 0, 0});
  Admit(t, 2, Key(1), 256 << 10);
  Admit(t, 0, Key(2), 256 << 10);
  Admit(t, 1, Key(3), 256 << 10);
  Admit(t, 0, Key(4), 256 << 10);
  ASSERT_OK(t.Acquire(2, Key(1)));  // 1 used again: newest
  t.Release(2, Key(1));
  const std::pair<uint32_t, uint64_t> order[] = {
      {0, 2}, {1, 3}, {0, 4}, {2, 1}};
  for (uint64_t n = 0; n < 4; ++n) {
    Admit(t, 1, Key(10 + n), 256 << 10);  // evicts the tier's least recent
    const auto [ns, page] = order[n];
    EXPECT_FALSE(t.Contains(ns, Key(page))) << "eviction " << n;
    for (uint64_t later = n + 1; later < 4; ++later) {
      EXPECT_TRUE(t.Contains(order[later].first, Key(order[later].second)))
          << "eviction " << n;
    }
  }
  EXPECT_EQ(t.Stats().evictions, 4u);
}

TEST(HbmTierTest, AnAbortedReservationLeavesNothing) {
  HbmTier t(1 << 20, {0});
  ASSERT_OK(t.Reserve(0, Key(1), 1 << 20));
  EXPECT_EQ(t.Reserve(0, Key(2), 4096).status().code(),
            StatusCode::kResourceExhausted);  // reserved space is not evictable
  t.Abort(0, Key(1));
  EXPECT_FALSE(t.Contains(0, Key(1)));
  EXPECT_EQ(t.Stats().used_bytes, 0u);
  Admit(t, 0, Key(2), 1 << 20);  // the whole tier is free again
  t.Abort(0, Key(2));            // a committed segment is not aborted
  EXPECT_TRUE(t.Contains(0, Key(2)));
}

}  // namespace
}  // namespace tierkv::storage
