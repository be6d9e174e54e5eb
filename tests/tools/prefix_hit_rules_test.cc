// The shared counting rules: tools/prefix_hit_rules.h.
#include "tools/prefix_hit_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace tierkv::tools {
namespace {

using ::testing::ElementsAre;

TEST(PrefixHitRules, OnlyFullBlocksBeforeTheLastPromptTokenAreCacheable) {
  EXPECT_EQ(CacheableBlockCount(0), 0u);
  EXPECT_EQ(CacheableBlockCount(1), 0u);
  EXPECT_EQ(CacheableBlockCount(512), 0u);  // the last token is recomputed
  EXPECT_EQ(CacheableBlockCount(513), 1u);
  EXPECT_EQ(CacheableBlockCount(1024), 1u);
  EXPECT_EQ(CacheableBlockCount(1025), 2u);
}

TEST(PrefixHitRules, CacheableBlocksAreTheLeadingHashIds) {
  const TraceRequest request{.input_length = 1100, .hash_ids = {7, 8, 9}};
  const auto blocks = CacheableBlocks(request);
  EXPECT_THAT(std::vector<uint64_t>(blocks.begin(), blocks.end()),
              ElementsAre(7, 8));
}

TEST(PrefixHitRules, AHitBlockIsWorthAWholeBlockOfTokens) {
  EXPECT_EQ(HitTokens(0), 0u);
  EXPECT_EQ(HitTokens(3), 1536u);
}

}  // namespace
}  // namespace tierkv::tools
