// A trace replayed through a cluster of real tierkvds and a real
// redis-server: tools/cluster_replay.cc (and tools/redis_launcher.cc).
#include "tools/cluster_replay.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "tests/testing/status_matchers.h"
#include "tests/tools/synthetic_trace.h"
#include "tools/cluster_cache_sim.h"
#include "tools/redis_launcher.h"

namespace tierkv::tools {
namespace {

using ::testing::HasSubstr;

// 32 KiB segments: tierkvd's 1 MiB per shard is 32 blocks, so 64-block
// nodes evict on a trace of a few hundred requests.
constexpr uint32_t kBytesPerToken = 64;
constexpr uint64_t kHostBlocks = 64;
constexpr uint32_t kNodes = 3;

bool RedisAvailable() {
  return ::access(RedisLauncher::Binary().c_str(), X_OK) == 0;
}

class ClusterReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisAvailable()) GTEST_SKIP() << "no redis-server";
  }

  ClusterReplayOptions Options(bool peers) const {
    return {.nodes = kNodes,
            .peers = peers,
            .node = {.host_blocks = kHostBlocks,
                     .shards = 1,
                     .bytes_per_token = kBytesPerToken}};
  }
  ClusterCacheResult Bound(bool peers) const {
    return sim_.Run({.nodes = kNodes,
                     .capacity_blocks = kHostBlocks,
                     .peers = peers,
                     .routing = ClusterRouting::kRoundRobin});
  }

  // ~280 requests of up to 36 blocks; ~700 distinct cacheable blocks.
  const std::vector<TraceRequest> trace_ = testing::MultiTurnTrace({});
  const ClusterCacheSimulator sim_{trace_};
};

TEST_F(ClusterReplayTest, IslandsHitExactlyAsTheOfflineLocalBound) {
  auto run = ReplayPrefixTraceOnCluster(trace_, Options(/*peers=*/false));
  ASSERT_OK(run);
  const ClusterCacheResult bound = Bound(/*peers=*/false);
  ASSERT_GT(bound.hit_tokens, 0u);
  EXPECT_EQ(run->requests(), trace_.size());
  EXPECT_EQ(run->input_tokens(), bound.input_tokens);
  EXPECT_EQ(run->peer_hit_tokens(), 0u);
  // Each node is a one-shard LRU of its round-robin share of the trace.
  ASSERT_EQ(run->nodes.size(), kNodes);
  for (uint32_t i = 0; i < kNodes; ++i) {
    EXPECT_EQ(run->nodes[i].input_tokens, bound.node_input_tokens[i]) << i;
    EXPECT_EQ(run->nodes[i].local_hit_tokens, bound.node_hit_tokens[i]) << i;
  }
}

TEST_F(ClusterReplayTest, PeersServeWhatTheOfflinePeersBoundCounts) {
  auto run = ReplayPrefixTraceOnCluster(trace_, Options(/*peers=*/true));
  ASSERT_OK(run);
  const ClusterCacheResult local = Bound(/*peers=*/false);
  const ClusterCacheResult peers = Bound(/*peers=*/true);
  ASSERT_GT(peers.hit_tokens, local.hit_tokens);  // the trace shares

  EXPECT_EQ(run->input_tokens(), peers.input_tokens);
  EXPECT_GT(run->peer_hit_tokens(), 0u);
  EXPECT_GT(run->ClusterHitRate(), run->LocalHitRate());
  EXPECT_GT(run->hit_tokens(), local.hit_tokens);
  // Every request's pages reached the directory before the next request.
  EXPECT_EQ(run->publish_timeouts, 0u);
  // Within 1% of the input tokens of the offline bound (0.25% here). The
  // bound's directory is exact and instant; the daemons' is a hint kept in
  // the background: an evicted page stays listed until its holder's sweep
  // (each Get that finds it absent there costs a second FETCH, or a miss
  // when no other node holds it), and the fetches of pages past a miss
  // count as uses on their holders.
  const double tolerance = 0.01 * static_cast<double>(peers.input_tokens);
  EXPECT_NEAR(static_cast<double>(run->hit_tokens()),
              static_cast<double>(peers.hit_tokens), tolerance);
  std::cout << "cluster replay, " << kNodes << " x " << kHostBlocks
            << " blocks: daemon " << 100 * run->ClusterHitRate() << "% (local "
            << 100 * run->LocalHitRate() << "%), offline peers "
            << 100 * peers.TokenHitRate() << "%, offline local "
            << 100 * local.TokenHitRate() << "%; " << run->seconds << " s\n";
}

TEST(ClusterReplayOptions, RejectsWhatTheClusterCouldNotRun) {
  EXPECT_OK(ClusterReplayOptions{}.Validate());
  EXPECT_EQ(ClusterReplayOptions{.nodes = 0}.Validate().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ClusterReplayOptions{.node = {.nvme_blocks = 4096}}.Validate().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(ClusterReplayOptions{.lookup_budget_us = 10}.Validate().code(),
            StatusCode::kInvalidArgument);
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + what.size())) {
    ++n;
  }
  return n;
}

TEST(ClusterReplayOptions, NodesShareTheReplayNamespaceOnlyWithPeers) {
  const ClusterReplayOptions on;
  const std::string config = ClusterReplayDaemonConfig(
      on, 2, "redis://127.0.0.1:1", "/p/redis.pass", "/p/cluster.key");
  EXPECT_THAT(config, HasSubstr("node_id = \"node-2\""));
  EXPECT_THAT(config, HasSubstr("directory = \"redis://127.0.0.1:1\""));
  EXPECT_THAT(config, HasSubstr("peer_listen = \"127.0.0.1:0\""));
  // The replayed namespace and the start-up probe's.
  EXPECT_EQ(Count(config, "[[namespace]]"), 2u);
  EXPECT_EQ(Count(config, "shared = true"), 2u);
  const ClusterReplayOptions off{.peers = false};
  EXPECT_EQ(Count(ClusterReplayDaemonConfig(off, 0, "redis://127.0.0.1:1",
                                            "/p/redis.pass", "/p/cluster.key"),
                  "shared = true"),
            1u);
}

}  // namespace
}  // namespace tierkv::tools
