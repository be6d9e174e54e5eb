// The offline cluster prefix-cache simulator: tools/cluster_cache_sim.cc.
#include "tools/cluster_cache_sim.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "tests/tools/synthetic_trace.h"
#include "tools/prefix_cache_sim.h"
#include "tools/prefix_hit_rules.h"

namespace tierkv::tools {
namespace {

std::vector<TraceRequest> Requests(
    const std::vector<std::vector<uint64_t>>& prompts) {
  return testing::FullBlockRequests(prompts);
}

ClusterCacheResult Simulate(
    const std::vector<TraceRequest>& trace, uint32_t nodes, uint64_t capacity,
    bool peers, ClusterRouting routing = ClusterRouting::kRoundRobin) {
  return ClusterCacheSimulator(trace).Run({.nodes = nodes,
                                           .capacity_blocks = capacity,
                                           .peers = peers,
                                           .routing = routing});
}

TEST(ClusterCacheSim, OneNodeIsTheSingleCacheLru) {
  const auto trace = testing::MultiTurnTrace({});
  for (uint64_t capacity : {0, 8, 40, 400}) {
    const PrefixCacheResult lru =
        PrefixCacheSimulator(trace).Run(OfflinePolicy::kLru, capacity);
    for (bool peers : {false, true}) {
      const ClusterCacheResult one = Simulate(trace, 1, capacity, peers);
      EXPECT_EQ(one.hit_tokens, lru.hit_tokens) << capacity;
      EXPECT_EQ(one.input_tokens, lru.input_tokens);
      EXPECT_EQ(one.peer_hit_tokens, 0u);
    }
  }
}

TEST(ClusterCacheSim, RoundRobinIslandsRecomputeWhatPeersServe) {
  // Four requests of one prefix over two nodes: each node computes it once
  // alone; with peers, only the first request misses.
  const auto trace = Requests({{1, 2, 3}, {1, 2, 3}, {1, 2, 3}, {1, 2, 3}});
  const ClusterCacheResult local = Simulate(trace, 2, 100, /*peers=*/false);
  EXPECT_EQ(local.hit_tokens, HitTokens(6));
  EXPECT_EQ(local.peer_hit_tokens, 0u);
  const ClusterCacheResult peers = Simulate(trace, 2, 100, /*peers=*/true);
  EXPECT_EQ(peers.hit_tokens, HitTokens(9));
  EXPECT_EQ(peers.peer_hit_tokens, HitTokens(3));  // request 1, from node 0
  EXPECT_EQ(peers.node_hit_tokens,
            (std::vector<uint64_t>{HitTokens(3), HitTokens(6)}));
}

TEST(ClusterCacheSim, TheLeadingRunStopsAtABlockNoNodeHolds) {
  // Node 1's request shares block 1 with node 0's, then diverges: block 3
  // is on node 0 too, but after the miss on 9.
  const auto trace = Requests({{1, 2, 3}, {1, 9, 3}});
  const ClusterCacheResult r = Simulate(trace, 2, 100, /*peers=*/true);
  EXPECT_EQ(r.hit_tokens, HitTokens(1));
  EXPECT_EQ(r.peer_hit_tokens, HitTokens(1));
}

TEST(ClusterCacheSim, AFetchIsAUseOnTheHolder) {
  // Two nodes of two blocks. Node 1 fetches block 1 from node 0, which makes
  // block 1 node 0's most recent: node 0's next insert evicts block 2, so
  // node 1's last request finds 1 locally and 2 nowhere.
  const auto trace = Requests({{1, 2}, {1}, {3}, {1, 2}});
  const ClusterCacheResult r = Simulate(trace, 2, 2, /*peers=*/true);
  EXPECT_EQ(r.hit_tokens, HitTokens(2));       // requests 1 and 3: one each
  EXPECT_EQ(r.peer_hit_tokens, HitTokens(1));  // request 1's block 1
}

TEST(ClusterCacheSim, KvAwareRoutingSendsARequestToItsPrefix) {
  const auto trace = Requests({{1, 2}, {1, 2}, {1, 2}, {7}});
  const ClusterCacheResult rr = Simulate(trace, 2, 100, /*peers=*/false);
  EXPECT_EQ(rr.hit_tokens, HitTokens(2));  // request 2, on node 0 again
  const ClusterCacheResult kv =
      Simulate(trace, 2, 100, /*peers=*/false, ClusterRouting::kKvAware);
  EXPECT_EQ(kv.hit_tokens, HitTokens(4));  // requests 1 and 2 go to node 0
  // Request 3's prefix is nowhere: it stays on its round-robin node.
  EXPECT_EQ(kv.node_input_tokens[1], trace[3].input_length);
}

TEST(ClusterCacheSim, NodeTotalsAddUpAndPeersNeverHitLess) {
  const auto trace = testing::MultiTurnTrace({.sessions = 200, .seed = 7});
  for (uint32_t nodes : {2u, 3u, 5u}) {
    const ClusterCacheResult local = Simulate(trace, nodes, 30, false);
    const ClusterCacheResult peers = Simulate(trace, nodes, 30, true);
    for (const ClusterCacheResult* r : {&local, &peers}) {
      EXPECT_EQ(std::accumulate(r->node_input_tokens.begin(),
                                r->node_input_tokens.end(), uint64_t{0}),
                r->input_tokens);
      EXPECT_EQ(std::accumulate(r->node_hit_tokens.begin(),
                                r->node_hit_tokens.end(), uint64_t{0}),
                r->hit_tokens);
    }
    EXPECT_GT(peers.hit_tokens, local.hit_tokens) << nodes;
    EXPECT_GT(peers.peer_hit_tokens, 0u);
  }
}

}  // namespace
}  // namespace tierkv::tools
