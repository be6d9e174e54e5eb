// The offline prefix-cache simulators: tools/prefix_cache_sim.cc.
#include "tools/prefix_cache_sim.h"

#include <gtest/gtest.h>

#include <chrono>
#include <unordered_set>
#include <vector>

#include "tests/tools/synthetic_trace.h"
#include "tools/prefix_hit_rules.h"

namespace tierkv::tools {
namespace {

std::vector<TraceRequest> Requests(
    const std::vector<std::vector<uint64_t>>& prompts) {
  return testing::FullBlockRequests(prompts);
}

uint64_t HitBlocks(const std::vector<TraceRequest>& trace, OfflinePolicy policy,
                   uint64_t capacity) {
  return PrefixCacheSimulator(trace).Run(policy, capacity).hit_blocks;
}

TEST(PrefixCacheSim, PartialLastBlockIsNeverCached) {
  // 1024 tokens: block 1 is full, but block 2 holds the last prompt token,
  // which the engine always computes: only block 1 is cacheable.
  const std::vector<TraceRequest> trace = {
      {.input_length = 1024, .hash_ids = {1, 2}},
      {.input_length = 1024, .hash_ids = {1, 2}}};
  for (auto policy : {OfflinePolicy::kLru, OfflinePolicy::kBelady}) {
    const PrefixCacheResult r = PrefixCacheSimulator(trace).Run(policy, 100);
    EXPECT_EQ(r.hit_blocks, 1u) << OfflinePolicyName(policy);
    EXPECT_EQ(r.hit_tokens, 512u);
    EXPECT_EQ(r.input_tokens, 2048u);
    EXPECT_DOUBLE_EQ(r.TokenHitRate(), 0.25);
    EXPECT_EQ(r.accessed_blocks, 2u);
    EXPECT_EQ(r.inserted_blocks, 1u);
  }
}

TEST(PrefixCacheSim, LeadingMatchStopsAtTheFirstMissingBlock) {
  // Capacity 3: request 2 evicts block 1, leaving 2 and 3 without their
  // prefix; request 3 then hits nothing although 2 and 3 are present.
  const auto trace = Requests({{1, 2, 3}, {9}, {1, 2, 3}});
  const PrefixCacheResult r =
      PrefixCacheSimulator(trace).Run(OfflinePolicy::kLru, 3);
  EXPECT_EQ(r.hit_blocks, 0u);
  EXPECT_EQ(r.hit_tokens, 0u);
  // Request 3 re-inserts 1, 2 and 3 in order, each evicting the LRU block.
  EXPECT_EQ(r.inserted_blocks, 7u);
  EXPECT_EQ(r.evicted_blocks, 4u);
}

TEST(PrefixCacheSim, LruEvictsTheLeastRecentlyUsedBlock) {
  // Capacity 2, one block per request: 1 2 1 3 2 1.
  //   1 miss {1}; 2 miss {1 2}; 1 hit {2 1}; 3 miss, evicts 2 {1 3};
  //   2 miss, evicts 1 {3 2}; 1 miss, evicts 3 {2 1}.
  const auto trace = Requests({{1}, {2}, {1}, {3}, {2}, {1}});
  EXPECT_EQ(HitBlocks(trace, OfflinePolicy::kLru, 2), 1u);
}

TEST(PrefixCacheSim, BeladyEvictsTheBlockUsedFarthestInTheFuture) {
  // The same sequence: 3 is never used again, so MIN drops it at once and
  // keeps 1 and 2, which both hit again.
  const auto trace = Requests({{1}, {2}, {1}, {3}, {2}, {1}});
  const PrefixCacheResult r =
      PrefixCacheSimulator(trace).Run(OfflinePolicy::kBelady, 2);
  EXPECT_EQ(r.hit_blocks, 3u);
  EXPECT_EQ(r.hit_tokens, 3 * kTraceBlockTokens);
  EXPECT_EQ(r.evicted_blocks, 1u);
}

TEST(PrefixCacheSim, BeladyKeepsTheSoonerOfTwoReusedBlocks) {
  // Capacity 2: 1 2 3 1 2. LRU loses everything (each insert evicts the
  // block needed next); MIN evicts 3 (never used again) and hits 1 and 2.
  const auto trace = Requests({{1}, {2}, {3}, {1}, {2}});
  EXPECT_EQ(HitBlocks(trace, OfflinePolicy::kLru, 2), 0u);
  EXPECT_EQ(HitBlocks(trace, OfflinePolicy::kBelady, 2), 2u);
}

TEST(PrefixCacheSim, NothingHitsWithoutCapacity) {
  const auto trace = Requests({{1, 2}, {1, 2}});
  EXPECT_EQ(HitBlocks(trace, OfflinePolicy::kLru, 0), 0u);
  EXPECT_EQ(HitBlocks(trace, OfflinePolicy::kBelady, 0), 0u);
}

TEST(PrefixCacheSim, WithRoomForEverythingBothHitEveryBlockSeenBefore) {
  const auto trace = testing::MultiTurnTrace({.seed = 7});
  // Independently: an unbounded cache hits each block seen before, up to
  // the first block never seen.
  std::unordered_set<uint64_t> seen;
  uint64_t expected = 0;
  for (const TraceRequest& r : trace) {
    const auto blocks = CacheableBlocks(r);
    size_t leading = 0;
    while (leading < blocks.size() && seen.count(blocks[leading])) ++leading;
    expected += leading;
    seen.insert(blocks.begin(), blocks.end());
  }
  ASSERT_GT(expected, 0u);
  const PrefixCacheSimulator sim(trace);
  EXPECT_EQ(sim.distinct_blocks(), seen.size());
  EXPECT_EQ(sim.Run(OfflinePolicy::kLru, seen.size()).hit_blocks, expected);
  EXPECT_EQ(sim.Run(OfflinePolicy::kBelady, seen.size()).hit_blocks, expected);
}

TEST(PrefixCacheSim, BeladyHitsAtLeastAsMuchAsLruOnRandomTraces) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const auto trace = testing::MultiTurnTrace(
        {.system_prompts = 1 + static_cast<uint32_t>(seed % 5),
         .sessions = 20 + static_cast<uint32_t>(seed * 7 % 60),
         .max_turns = 2 + static_cast<uint32_t>(seed % 7),
         .seed = seed});
    const PrefixCacheSimulator sim(trace);
    for (uint64_t capacity : {1, 8, 40, 100, 400}) {
      const auto lru = sim.Run(OfflinePolicy::kLru, capacity);
      const auto belady = sim.Run(OfflinePolicy::kBelady, capacity);
      EXPECT_GE(belady.hit_tokens, lru.hit_tokens)
          << "seed " << seed << ", capacity " << capacity;
    }
  }
}

TEST(PrefixCacheSim, ScalesToMooncakeSizedTraces) {
  // ~4,000 requests and ~100,000 block accesses, like Mooncake's synthetic
  // trace: three capacities of both policies well under a second.
  const auto trace = testing::MultiTurnTrace({.system_prompts = 40,
                                              .max_system_prompt_blocks = 60,
                                              .sessions = 1000,
                                              .max_turns = 7,
                                              .max_turn_blocks = 8});
  const auto start = std::chrono::steady_clock::now();
  const PrefixCacheSimulator sim(trace);
  ASSERT_GT(sim.Run(OfflinePolicy::kLru, 0).accessed_blocks, 100000u);
  for (uint64_t capacity : {2048, 4096, 8192}) {
    EXPECT_GE(sim.Run(OfflinePolicy::kBelady, capacity).hit_tokens,
              sim.Run(OfflinePolicy::kLru, capacity).hit_tokens);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

}  // namespace
}  // namespace tierkv::tools
