// A trace replayed through a real tierkvd: tools/replay_workload.cc.
#include "tools/replay_workload.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>

#include "tests/testing/status_matchers.h"
#include "tests/tools/synthetic_trace.h"
#include "tools/prefix_cache_sim.h"
#include "tools/prefix_hit_rules.h"

namespace tierkv::tools {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// 32 KiB segments: tierkvd's 1 MiB per shard is 32 blocks, so small host
// tiers still evict on a trace of a few hundred requests.
constexpr uint32_t kBytesPerToken = 64;

class ReplayTest : public ::testing::Test {
 protected:
  // ~280 requests of up to 36 blocks; ~700 distinct cacheable blocks.
  const std::vector<TraceRequest> trace_ = testing::MultiTurnTrace({});
  const PrefixCacheSimulator sim_{trace_};

  ReplayResult Replay(uint64_t host_blocks, uint32_t shards) {
    auto r = ReplayPrefixTrace(trace_, {.host_blocks = host_blocks,
                                        .shards = shards,
                                        .bytes_per_token = kBytesPerToken});
    EXPECT_OK(r);
    return r.ok() ? *r : ReplayResult{};
  }
};

TEST_F(ReplayTest, OneShardLruDaemonHitsExactlyAsTheOfflineLru) {
  for (uint64_t host_blocks : {64, 160}) {
    SCOPED_TRACE(host_blocks);
    const ReplayResult daemon = Replay(host_blocks, /*shards=*/1);
    const PrefixCacheResult lru = sim_.Run(OfflinePolicy::kLru, host_blocks);
    const PrefixCacheResult unbounded =
        sim_.Run(OfflinePolicy::kLru, sim_.distinct_blocks());
    // The capacity matters (evictions happen) and hits are not trivial.
    ASSERT_GT(lru.hit_tokens, 0u);
    ASSERT_LT(lru.hit_tokens, unbounded.hit_tokens);

    EXPECT_EQ(daemon.requests, trace_.size());
    EXPECT_EQ(daemon.input_tokens, lru.input_tokens);
    EXPECT_EQ(daemon.hit_tokens(), lru.hit_tokens);
    EXPECT_EQ(daemon.host_hit_tokens, lru.hit_tokens);  // no NVMe tier
    EXPECT_EQ(daemon.nvme_hit_tokens, 0u);
    EXPECT_EQ(daemon.put_failed, 0u);
    EXPECT_EQ(daemon.get_missed, 0u);
  }
}

TEST_F(ReplayTest, EightShardsAreReportedAgainstTheOfflineLru) {
  // Each shard evicts on its own; how far that is from one LRU is printed,
  // not asserted yet (the host tier's eviction order is being replaced).
  constexpr uint64_t kHostBlocks = 256;  // 8 shards of 1 MiB
  const ReplayResult daemon = Replay(kHostBlocks, /*shards=*/8);
  const PrefixCacheResult lru = sim_.Run(OfflinePolicy::kLru, kHostBlocks);
  EXPECT_EQ(daemon.input_tokens, lru.input_tokens);
  EXPECT_EQ(daemon.put_failed, 0u);
  std::cout << "8 shards, " << kHostBlocks << " blocks: daemon "
            << 100 * daemon.TokenHitRate() << "% vs offline LRU "
            << 100 * lru.TokenHitRate() << "% ("
            << 100 * (daemon.TokenHitRate() - lru.TokenHitRate())
            << " points)\n";
}

TEST(ReplayOptions, RejectsWhatTheDaemonCouldNotRun) {
  EXPECT_OK(ReplayOptions{}.Validate());
  EXPECT_EQ(ReplayOptions{.policy = ""}.Validate().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplayOptions{.policy = "lru\"\nx = 1"}.Validate().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplayOptions{.host_blocks = 0}.Validate().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplayOptions{.shards = 0}.Validate().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplayOptions{.bytes_per_token = 0}.Validate().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplayOptions{.speed = -1}.Validate().code(),
            StatusCode::kInvalidArgument);
}

TEST(ReplayDaemonConfig, SizesTheHostTierInSegments) {
  const std::string toml = ReplayDaemonConfig(
      {.host_blocks = 2048, .shards = 4, .bytes_per_token = 8});
  EXPECT_THAT(toml, HasSubstr("host_bytes = 8388608\n"));  // 2048 x 4 KiB
  EXPECT_THAT(toml, HasSubstr("shards = 4\n"));
  EXPECT_THAT(toml, Not(HasSubstr("[nvme]")));
}

TEST(ReplayDaemonConfig, NamesThePolicyOnlyWhenItIsNotTheDefault) {
  EXPECT_THAT(ReplayDaemonConfig({.policy = "lru"}),
              Not(HasSubstr("eviction_policy")));
  EXPECT_THAT(ReplayDaemonConfig({.policy = "2q"}),
              HasSubstr("eviction_policy = \"2q\"\n"));
}

TEST(ReplayDaemonConfig, AddsAWriteBackNvmeTierOfTheGivenBlocks) {
  const std::string toml =
      ReplayDaemonConfig({.nvme_blocks = 8192, .bytes_per_token = 8});
  EXPECT_THAT(toml, HasSubstr("write_policy = \"write_back\"\n"));
  EXPECT_THAT(toml, HasSubstr("path = \"{DIR}/nvme.data\"\n"));
  EXPECT_THAT(toml, HasSubstr("capacity_bytes = 33554432\n"));  // 32 MiB
}

TEST(ReplayPrefixTrace, ReportsADaemonThatRejectsItsConfig) {
  // An unknown policy: tierkvd refuses to start and says why.
  const auto trace = testing::MultiTurnTrace({.sessions = 2});
  auto r = ReplayPrefixTrace(trace, {.policy = "no_such_policy"});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("eviction_policy"));
}

}  // namespace
}  // namespace tierkv::tools
