// The stats JSON's tiers (daemon/tier_stats_json.h) from a real engine's
// walk: a tier the daemon has never heard of gets its "tiers" entry and
// its flat object under its own name, with its own policy and counters.
#include "daemon/tier_stats_json.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "storage/engine/cache_engine.h"
#include "tests/testing/engine_over_test_tier.h"
#include "tests/testing/memory_tier.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::daemon {
namespace {

using nlohmann::json;

class TierStatsJsonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<storage::NamespaceOptions> spaces;
    for (const char* name : {"a", "b"}) {
      spaces.push_back({.host = {.name = name,
                                 .capacity_bytes = 1 << 20,
                                 .shards = 1,
                                 .try_hugepages = false,
                                 .prefault = false}});
    }
    auto opened = testing::OpenEngineOverTestTier(std::move(spaces),
                                                  {.id = 1, .name = "b"});
    ASSERT_OK(opened);
    engine_ = std::move(opened->engine);
    slowmem_ = opened->tier;
  }

  testing::MemoryTier* slowmem_ = nullptr;  // owned by the engine's chain
  std::unique_ptr<storage::CacheEngine> engine_;
};

TEST_F(TierStatsJsonTest, EveryTierGetsAnEntryWithItsOwnCounters) {
  const json tiers = TiersJson(engine_->TierReports(engine_->Find("b")));
  ASSERT_EQ(tiers.size(), 2u) << tiers.dump();
  EXPECT_EQ(tiers[0]["name"], "host");
  EXPECT_EQ(tiers[0]["policy"], "lru");
  EXPECT_FALSE(tiers[0].contains("namespace"));  // one instance per namespace
  EXPECT_EQ(tiers[0]["gauges"]["capacity_bytes"], 1 << 20);
  EXPECT_EQ(tiers[0]["flags"]["hugepages"], false);
  const json& added = tiers[1];
  EXPECT_EQ(added["name"], "slowmem");
  EXPECT_EQ(added["policy"], "slow-policy");
  EXPECT_EQ(added["kind"], "peer");
  EXPECT_EQ(added["counters"]["writes"], 1);
  // Integral gauges stay integers.
  EXPECT_TRUE(added["gauges"]["used_bytes"].is_number_unsigned());
  EXPECT_EQ(added["namespace"]["gauges"]["segments"], 1);
  EXPECT_EQ(added["namespace"]["policy"], "slow-policy");
}

TEST_F(TierStatsJsonTest, FlatObjectsKeepTheirNamesAndSkipTakenKeys) {
  json tiers = TiersJson(engine_->TierReports(engine_->Find("b")));
  storage::TierCounterSet moved;
  moved.Counter("demotions_done", 3);
  AddTierCounters(tiers, "slowmem", moved);
  json j;
  j["host"] = "taken";  // a top-level key a tier's name must not replace
  AddFlatTierObjects(tiers, j);
  EXPECT_EQ(j["host"], "taken");
  const json& added = j["slowmem"];
  EXPECT_EQ(added["writes"], 1) << added.dump();
  EXPECT_EQ(added["demotions_done"], 3);
  EXPECT_EQ(added["eviction_policy"], "slow-policy");
  EXPECT_EQ(added["namespace"]["used_bytes"], 512);
}

}  // namespace
}  // namespace tierkv::daemon
