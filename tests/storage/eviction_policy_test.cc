// Tests for storage/eviction_policy and its implementations (lru, 2q), on
// bare PolicyStates as one host tier shard drives them.
#include "storage/policy/eviction_policy.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>

#include "storage/policy/ghost_list.h"
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
    policy_.Link(s, now, LinkAt::kNow);
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
  for (auto kind : {EvictionPolicyKind::kLru, EvictionPolicyKind::kTwoQueue,
                    EvictionPolicyKind::kS3Fifo, EvictionPolicyKind::kTopk,
                    EvictionPolicyKind::kWeights}) {
    auto parsed = ParseEvictionPolicy(EvictionPolicyName(kind));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, kind);
    EXPECT_EQ(NewEvictionPolicy(kind)->kind(), kind);
  }
  auto bad = ParseEvictionPolicy("mru");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("lru, 2q, s3fifo, topk, weights"),
            std::string::npos);
}

TEST(LruPolicyTest, EvictsTheLeastRecentlyUsedAndRanksByLastUse) {
  auto policy = NewLruPolicy();
  Segments segs(*policy);
  EXPECT_EQ(policy->Victim(), nullptr);
  PolicyState& a = segs.Store(1);
  PolicyState& b = segs.Store(2);
  segs.Store(3);
  segs.Use(a);  // order now: 2, 3, 1
  EXPECT_EQ(policy->Victim(), &b);
  EXPECT_EQ(policy->linked_bytes(), 300u);
  // Referenced segments are out of the order; linked again as just used.
  policy->Unlink(b);
  EXPECT_EQ(segs.Evict(), 3u);
  policy->Link(b, segs.clock(), LinkAt::kNow);
  EXPECT_EQ(segs.Evict(), 1u);
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(policy->Victim(), nullptr);
  EXPECT_EQ(policy->linked_bytes(), 0u);
}

// A segment back from write-back goes where its last use puts it: the
// oldest (write_back) at the back, a recent one (write_through) near the
// front, whichever end is nearer.
TEST(LruPolicyTest, ASegmentLinkedAtItsLastUseTakesItsPlaceInTheOrder) {
  auto policy = NewLruPolicy();
  Segments segs(*policy);
  PolicyState& oldest = segs.Store(1);
  policy->Unlink(oldest);  // dirty: off the order while written back
  for (uint64_t n = 2; n <= 6; ++n) segs.Store(n);
  PolicyState& recent = segs.Store(7);
  policy->Unlink(recent);
  segs.Store(8);
  policy->Link(recent, segs.clock(), LinkAt::kLastUse);
  policy->Link(oldest, segs.clock(), LinkAt::kLastUse);
  EXPECT_EQ(policy->Victim(), &oldest);
  for (uint64_t want : {1, 2, 3, 4, 5, 6, 7, 8}) EXPECT_EQ(segs.Evict(), want);
}

TEST(EvictionPolicyTest, InsertByRankKeepsRanksDescendingFromTheFront) {
  std::deque<PolicyState> states(40);
  PolicyList list;
  std::mt19937 rng(3);
  for (auto& s : states) {
    s.rank = rng() % 50;
    InsertByRank(list, s);
    uint64_t previous = UINT64_MAX;
    for (const PolicyState& x : list) {
      ASSERT_LE(x.rank, previous);
      previous = x.rank;
    }
  }
  list.clear();
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
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(segs.Evict(), 3u);
  EXPECT_EQ(segs.Evict(), 4u);
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

// S3-FIFO: new segments leave in insertion order unless used meanwhile;
// a used one gets another round in main.
TEST(S3FifoPolicyTest, NewSegmentsGoFirstInOrderAndUsedOnesGetAnotherRound) {
  // 300 B of capacity, small's share 90 B: less than one segment of
  // 100 B; small is evicted from while it holds more.
  auto policy = NewS3FifoPolicy({.capacity_bytes = 300});
  Segments segs(*policy);
  PolicyState& used = segs.Store(1);
  segs.Store(2);
  segs.Store(3);
  segs.Store(4);
  segs.Use(used);
  // Small's oldest unused segments go; 1 (used) moves to main on the
  // way, and goes once small is down to its share.
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(segs.Evict(), 3u);
  EXPECT_EQ(segs.Evict(), 4u);
  EXPECT_EQ(segs.Evict(), 1u);  // main's, unused since it moved
}

TEST(S3FifoPolicyTest, ASegmentStoredAgainAfterItsEvictionGoesToMain) {
  auto policy = NewS3FifoPolicy({.capacity_bytes = 300});
  Segments segs(*policy);
  segs.Store(1);
  EXPECT_EQ(segs.Evict(), 1u);  // evicted from small unused: remembered
  PolicyState& back = segs.Store(1);
  EXPECT_TRUE(back.promoted);
  for (uint64_t n = 2; n <= 5; ++n) segs.Store(n);
  // 2..5 fill small past its share: they go before 1, which is in main.
  for (uint64_t want : {2, 3, 4, 5, 1}) EXPECT_EQ(segs.Evict(), want);
}

// A reader's release is a reinsertion (O(1)); a segment back from
// write-back takes its old place.
TEST(S3FifoPolicyTest, ReleasedSegmentsGoBackNewestWrittenBackOnesInPlace) {
  auto policy = NewS3FifoPolicy({.capacity_bytes = 1000});
  Segments segs(*policy);
  PolicyState& first = segs.Store(1);
  PolicyState& second = segs.Store(2);
  segs.Store(3);
  policy->Unlink(first);  // being read
  policy->Link(first, segs.clock(), LinkAt::kNow);
  policy->Unlink(second);  // being written back
  policy->Link(second, segs.clock(), LinkAt::kLastUse);
  for (uint64_t want : {2, 3, 1}) EXPECT_EQ(segs.Evict(), want);
}

TEST(TopkPolicyTest, WhatTheIndexerKeepsSelectingStays) {
  auto policy = NewTopkPolicy({});
  Segments segs(*policy);
  PolicyState& favourite = segs.Store(1);
  PolicyState& liked = segs.Store(2);
  segs.Store(3);
  segs.Store(4);
  policy->Report(favourite, 10, segs.clock());
  policy->Report(liked, 5, segs.clock());
  // Unreported segments go first (the older score first), then by score.
  for (uint64_t want : {3, 4, 2, 1}) EXPECT_EQ(segs.Evict(), want);
}

TEST(TopkPolicyTest, AnOldFavouriteFadesAsItsScoreDecays) {
  auto policy = NewTopkPolicy({.half_life_ticks = 1});
  Segments segs(*policy);
  PolicyState& old = segs.Store(1);
  policy->Report(old, 7, segs.clock());  // score 8 at tick 2
  for (int i = 0; i < 10; ++i) segs.clock();
  segs.Store(2);  // score 1 at tick 13: 8 halved 11 times is far less
  EXPECT_EQ(segs.Evict(), 1u);
  EXPECT_EQ(segs.Evict(), 2u);
}

// A page the indexer keeps selecting that once left DRAM comes back with
// its score (remembered while the tier holds as many others), not at 1.
TEST(TopkPolicyTest, AnEvictedSegmentStoredAgainKeepsItsScore) {
  auto policy = NewTopkPolicy({});
  Segments segs(*policy);
  PolicyState& hot = segs.Store(1);
  policy->Report(hot, 10, segs.clock());
  segs.Store(2);
  segs.Store(3);
  for (uint64_t want : {2, 3, 1}) EXPECT_EQ(segs.Evict(), want);
  PolicyState& back = segs.Store(1);  // promoted back from NVMe
  EXPECT_GT(back.score, 10);
  segs.Store(4);
  EXPECT_EQ(segs.Evict(), 4u);
  EXPECT_EQ(segs.Evict(), 1u);
}

TEST(TopkPolicyTest, ReportsWhileReferencedCountWhenLinkedAgain) {
  auto policy = NewTopkPolicy({});
  Segments segs(*policy);
  PolicyState& read = segs.Store(1);
  segs.Store(2);
  policy->Unlink(read);  // being read
  policy->Report(read, 20, segs.clock());
  policy->Link(read, segs.clock(), LinkAt::kNow);
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(segs.Evict(), 1u);
}

SegmentKey KeyOf(uint64_t n) { return SegmentKey{PageHash{n, n}, 0, 0}; }

// Unhinted chunks first (least recently used first), then the farthest
// next use first: segments 1..6, where 3 and 4 belong to a version needed
// in 500 ms, 5 and 6 to one needed in 100 ms.
TEST(WeightsPolicyTest, UnhintedGoFirstThenTheFarthestNextUse) {
  auto policy = NewWeightsPolicy();
  Segments segs(*policy);
  ScheduleTable table;
  table[KeyOf(3)] = {.next_use_ms = 500};
  table[KeyOf(4)] = {.next_use_ms = 500};
  table[KeyOf(5)] = {.next_use_ms = 100};
  table[KeyOf(6)] = {.next_use_ms = 100};
  (void)policy->SetSchedule(table);
  PolicyState& nearest = segs.Store(5);  // the oldest
  segs.Store(3);
  PolicyState& one = segs.Store(1);
  segs.Store(2);
  segs.Store(6);
  segs.Store(4);
  segs.Use(nearest);  // a use does not move a hinted chunk
  EXPECT_EQ(policy->Victim(), &one);
  segs.Use(one);  // now 2 is the least recent unhinted
  for (uint64_t want : {2, 1, 3, 4, 5, 6}) EXPECT_EQ(segs.Evict(), want);
}

// A new table re-ranks linked segments at once (Rerank, as HostTier does
// for the keys SetSchedule names), and a pinned one is never a victim
// until its pin ends.
TEST(WeightsPolicyTest, RerankFollowsANewScheduleAndPinsHoldBack) {
  auto policy = NewWeightsPolicy();
  Segments segs(*policy);
  PolicyState& a = segs.Store(1);
  PolicyState& b = segs.Store(2);
  EXPECT_EQ(policy->Victim(), &a);
  ScheduleTable table;
  table[KeyOf(1)] = {.pinned = true};
  table[KeyOf(2)] = {.next_use_ms = 10};
  auto changed = policy->SetSchedule(table);
  EXPECT_EQ(changed.size(), 2u);
  for (PolicyState* s : {&a, &b}) policy->Rerank(*s);
  EXPECT_EQ(policy->Victim(), &b);
  EXPECT_EQ(policy->linked_bytes(), 100u);  // a is held back
  PolicyState& c = segs.Store(3);
  EXPECT_EQ(policy->Victim(), &c);  // unhinted before hinted
  EXPECT_EQ(segs.Evict(), 3u);
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(policy->Victim(), nullptr);  // only the pinned one is left
  // Unlinked while pinned (a reader took it), linked again: still held.
  policy->Unlink(a);
  policy->Link(a, segs.clock(), LinkAt::kNow);
  EXPECT_EQ(policy->Victim(), nullptr);
  // The pin ends: the old table's keys are named, and a is evictable.
  changed = policy->SetSchedule({});
  EXPECT_EQ(changed.size(), 2u);
  policy->Rerank(a);
  EXPECT_EQ(policy->Victim(), &a);
  EXPECT_EQ(segs.Evict(), 1u);
}

// A chunk evicted and promoted again keeps its standing: the table is the
// catalog's, not the resident segments'.
TEST(WeightsPolicyTest, AChunkStoredAgainKeepsItsStanding) {
  auto policy = NewWeightsPolicy();
  Segments segs(*policy);
  ScheduleTable table;
  table[KeyOf(1)] = {.next_use_ms = 5};
  (void)policy->SetSchedule(table);
  segs.Store(1);
  EXPECT_EQ(segs.Evict(), 1u);
  segs.Store(1);
  segs.Store(2);
  EXPECT_EQ(segs.Evict(), 2u);
  EXPECT_EQ(segs.Evict(), 1u);
}

TEST(GhostListTest, RemembersTheNewestKeysUpToItsLimit) {
  GhostList<int> ghosts;
  auto key = [](uint64_t n) { return SegmentKey{PageHash{n, n}, 0, 0}; };
  ghosts.Remember(key(1), 10, 2);
  ghosts.Remember(key(2), 20, 2);
  ghosts.Remember(key(1), 11, 2);  // newest now; its old memory is stale
  ghosts.Remember(key(3), 30, 2);  // over the limit: key 2 is forgotten
  EXPECT_EQ(ghosts.Take(key(2)), std::nullopt);
  EXPECT_EQ(ghosts.Take(key(1)), 11);
  EXPECT_EQ(ghosts.Take(key(1)), std::nullopt);  // taking forgets
  EXPECT_EQ(ghosts.Take(key(3)), 30);
  EXPECT_EQ(GhostLimit(0.0, 100), 0u);
  EXPECT_EQ(GhostLimit(2.0, 9), 20u);
}

}  // namespace
}  // namespace tierkv::storage
