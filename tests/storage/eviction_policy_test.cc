// Tests for storage/eviction_policy and its implementations (lru, 2q), on
// bare PolicyStates as one host tier shard drives them.
#include "storage/eviction_policy.h"

#include <gtest/gtest.h>

#include <deque>

#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

// Segments of one shard, with the shard's clock.
class Segments {
 public:
  explicit Segments(EvictionPolicy& policy) : policy_(policy) {}
  ~Segments() {
    for (auto& s : all_) policy_.Unlink(s);
  }
  // Stores segment n (admitted and linked, as a Commit).
  PolicyState& Store(uint64_t n, uint64_t bytes = 100) {
    PolicyState& s = all_.emplace_back();
    s.key = SegmentKey{PageHash{n, n}, 0, 0};
    s.bytes = bytes;
    const uint64_t now = ++clock_;
    policy_.Admit(s, now);
    policy_.Link(s, now, /*first_in_line=*/false);
    return s;
  }
  void Use(PolicyState& s) { policy_.Use(s, ++clock_); }
  // Evicts the victim; returns its page number.
  uint64_t Evict() {
    PolicyState* v = policy_.Victim();
    EXPECT_NE(v, nullptr);
    if (v == nullptr) return UINT64_MAX;
    policy_.Unlink(*v);
    policy_.Evicted(*v);
    return v->key.page.lo;
  }
  uint64_t clock() { return ++clock_; }

 private:
  EvictionPolicy& policy_;
  std::deque<PolicyState> all_;  // stable addresses
  uint64_t clock_ = 0;
};

TEST(EvictionPolicyTest, NamesParseBothWays) {
  for (auto kind : {EvictionPolicyKind::kLru, EvictionPolicyKind::kTwoQueue}) {
    auto parsed = ParseEvictionPolicy(EvictionPolicyName(kind));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, kind);
    EXPECT_EQ(NewEvictionPolicy(kind)->kind(), kind);
  }
  auto bad = ParseEvictionPolicy("mru");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("lru, 2q"), std::string::npos);
}

TEST(LruPolicyTest, EvictsTheLeastRecentlyUsedAndRanksByLastUse) {
  auto policy = NewLruPolicy();
  Segments segs(*policy);
  EXPECT_EQ(policy->VictimRank(), EvictionPolicy::kNoVictim);
  PolicyState& a = segs.Store(1);
  PolicyState& b = segs.Store(2);
  segs.Store(3);
  segs.Use(a);  // order now: 2, 3, 1
  EXPECT_EQ(policy->VictimRank(), b.last_use);
  EXPECT_EQ(policy->linked_bytes(), 300u);
  // Referenced segments are out of the order; linked again as just used.
  policy->Unlink(b);
  EXPECT_EQ(segs.Evict(), 3u);
  policy->Link(b, segs.clock(), /*first_in_line=*/false);
  EXPECT_EQ(segs.Evict(), 1u);
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(policy->Victim(), nullptr);
  EXPECT_EQ(policy->linked_bytes(), 0u);
}

TEST(LruPolicyTest, FirstInLineGoesBeforeEveryOtherSegment) {
  auto policy = NewLruPolicy();
  Segments segs(*policy);
  segs.Store(1);
  PolicyState& persisted = segs.Store(2);
  policy->Unlink(persisted);  // written back meanwhile (dirty)
  policy->Link(persisted, segs.clock(), /*first_in_line=*/true);
  EXPECT_EQ(policy->VictimRank(), 0u);
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(segs.Evict(), 1u);
}

TEST(TwoQueuePolicyTest, SegmentsUsedOnceGoFirstEvenWhenNewer) {
  auto policy = NewTwoQueuePolicy({.protected_fraction = 0.5});
  Segments segs(*policy);
  PolicyState& reused = segs.Store(1);
  segs.Store(2);
  segs.Use(reused);  // protected now
  segs.Store(3);
  segs.Store(4);
  // 2, 3, 4 were used once: the oldest of them goes first, then the next;
  // the reused one ranks above every probation segment.
  EXPECT_LT(policy->VictimRank(), uint64_t{1} << 62);
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(segs.Evict(), 3u);
  EXPECT_EQ(segs.Evict(), 4u);
  EXPECT_GE(policy->VictimRank(), uint64_t{1} << 62);
  EXPECT_EQ(segs.Evict(), 1u);
}

TEST(TwoQueuePolicyTest, ASegmentStoredAgainSoonAfterItsEvictionIsProtected) {
  auto policy = NewTwoQueuePolicy({.protected_fraction = 0.5});
  Segments segs(*policy);
  segs.Store(1);
  segs.Store(2);
  EXPECT_EQ(segs.Evict(), 1u);  // evicted unused: remembered
  PolicyState& back = segs.Store(1);
  EXPECT_TRUE(back.promoted);
  segs.Store(3);
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(segs.Evict(), 3u);
  EXPECT_EQ(segs.Evict(), 1u);
}

TEST(TwoQueuePolicyTest, ProtectedSegmentsKeepToTheirShare) {
  auto policy = NewTwoQueuePolicy({.protected_fraction = 0.5});
  Segments segs(*policy);
  std::vector<PolicyState*> s;
  for (uint64_t n = 1; n <= 4; ++n) s.push_back(&segs.Store(n));
  // Using all four would protect 100%: the least recent protected ones
  // move back to probation (as just demoted) to keep protected at half.
  for (PolicyState* p : s) segs.Use(*p);
  EXPECT_EQ(segs.Evict(), 1u);
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(segs.Evict(), 3u);
  EXPECT_EQ(segs.Evict(), 4u);
}

}  // namespace
}  // namespace tierkv::storage
