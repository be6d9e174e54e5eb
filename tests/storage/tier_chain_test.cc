// TierChain over two test tiers: placement order and its errors, batched
// Locate (one Lookup per tier per batch) and read fall-through.
#include "storage/tier/tier_chain.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/testing/memory_tier.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

using testing::MemoryTier;

constexpr uint64_t kFp = 5;
const TierNamespace kNs{.id = 0, .name = "ns"};

SegmentKey Key(uint64_t n) { return {PageHash{n, n + 1}, 0, 0}; }

class Counters final : public TierCounterVisitor {
 public:
  void Counter(std::string_view name, uint64_t value) override {
    values[std::string(name)] = value;
  }
  void Gauge(std::string_view, double) override {}
  std::map<std::string, uint64_t> values;
};

uint64_t CounterOf(const Tier& tier, const std::string& name) {
  Counters c;
  tier.VisitCounters(c);
  return c.values[name];
}

class TierChainTest : public ::testing::Test {
 protected:
  // "near" then "far" unless `placement` says otherwise; "far" persists.
  Result<std::unique_ptr<TierChain>> Make(PlacementOptions placement = {}) {
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(std::make_unique<MemoryTier>(
        MemoryTier::Options{.name = "near", .read_latency = {}}));
    tiers.push_back(std::make_unique<MemoryTier>(
        MemoryTier::Options{.name = "far",
                            .kind = tierkv::Tier::kNvme,
                            .persistent = true,
                            .read_latency = {}}));
    return TierChain::Create(std::move(tiers), placement);
  }
  static void Store(Tier& tier, uint64_t n, uint64_t bytes) {
    std::vector<std::byte> data(bytes, std::byte(n));
    const TierWriteItem item{Key(n), data};
    ASSERT_OK(
        WriteAndWait(tier, kNs, kFp, {&item, 1}, Durability::kDurable)[0]);
  }
};

TEST_F(TierChainTest, PlacementOrdersTheTiersAndPicksTheDemotionTarget) {
  auto chain = Make();
  ASSERT_OK(chain);
  EXPECT_EQ((*chain)->at(0).name(), "near");
  // Write-back goes to the first persistent tier by default.
  EXPECT_EQ((*chain)->demotion_target()->name(), "far");
  EXPECT_TRUE((*chain)->can_persist());

  auto reordered = Make({.read_order = {"far", "near"}, .demote_to = "near"});
  ASSERT_OK(reordered);
  EXPECT_EQ((*reordered)->at(0).name(), "far");
  EXPECT_EQ((*reordered)->demotion_target()->name(), "near");
  EXPECT_FALSE((*reordered)->can_persist());
}

TEST_F(TierChainTest, APlacementThatDoesNotMatchTheTiersIsRefusedByName) {
  auto unknown = Make({.read_order = {"near", "peer"}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("'peer'"), std::string::npos);
  auto left_out = Make({.read_order = {"near"}});
  ASSERT_FALSE(left_out.ok());
  EXPECT_NE(left_out.status().message().find("leaves out tier 'far'"),
            std::string::npos);
  auto twice = Make({.read_order = {"near", "near", "far"}});
  EXPECT_FALSE(twice.ok());
}

TEST_F(TierChainTest, LocateAsksEachTierOncePerBatch) {
  auto chain = Make();
  ASSERT_OK(chain);
  ASSERT_OK((*chain)->OpenNamespace(kNs));
  Tier& near = (*chain)->at(0);
  Tier& far = (*chain)->at(1);
  Store(near, 1, 100);
  Store(far, 2, 200);
  Store(near, 3, 300);
  Store(far, 3, 300);  // both: the cheaper tier wins
  std::vector<SegmentKey> keys;
  for (uint64_t n = 0; n < 4; ++n) keys.push_back(Key(n));
  const auto where = (*chain)->Locate(kNs, kFp, keys);
  EXPECT_EQ(where[0].tier, TierChain::kNowhere);
  EXPECT_EQ(where[1].tier, 0);
  EXPECT_EQ(where[1].bytes, 100u);
  EXPECT_EQ(where[2].tier, 1);
  EXPECT_EQ(where[2].bytes, 200u);
  EXPECT_EQ(where[3].tier, 0);
  EXPECT_EQ(CounterOf(near, "lookups"), 1u);
  EXPECT_EQ(CounterOf(far, "lookups"), 1u);
  // Another layout's copy is not there.
  EXPECT_EQ((*chain)->Locate(kNs, kFp + 1, keys)[1].tier, TierChain::kNowhere);
}

TEST_F(TierChainTest, ReadsFallThroughToTheFirstTierHoldingEachSegment) {
  auto chain = Make();
  ASSERT_OK(chain);
  ASSERT_OK((*chain)->OpenNamespace(kNs));
  Store((*chain)->at(0), 1, 64);
  Store((*chain)->at(1), 2, 64);
  std::vector<std::byte> a(64), b(64), c(64), small(8);
  const std::vector<TierReadItem> items{
      {Key(1), a}, {Key(2), b}, {Key(0), c}, {Key(2), small}};
  auto got = (*chain)->ReadAndWait(kNs, kFp, items);
  ASSERT_OK(got.items[0]);
  EXPECT_EQ(got.served_by[0], 0);
  EXPECT_EQ(a, std::vector<std::byte>(64, std::byte(1)));
  ASSERT_OK(got.items[1]);
  EXPECT_EQ(got.served_by[1], 1);
  EXPECT_EQ(b, std::vector<std::byte>(64, std::byte(2)));
  EXPECT_TRUE(got.items[2].status().IsNotFound());
  EXPECT_EQ(got.served_by[2], TierChain::kNowhere);
  EXPECT_EQ(got.items[3].status().code(), StatusCode::kInvalidArgument);
  // The far tier saw only what the near one missed: keys 2, 0 and 2.
  EXPECT_EQ(CounterOf((*chain)->at(1), "read_hits"), 1u);
  EXPECT_EQ(CounterOf((*chain)->at(1), "read_misses"), 1u);
}

}  // namespace
}  // namespace tierkv::storage
