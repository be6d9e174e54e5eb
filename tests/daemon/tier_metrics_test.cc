// TierMetrics exports every tier of the engine's walk (issue 26): a tier
// the daemon has never heard of (tests/testing/memory_tier.h) appears in
// the tier families under its own name, with the `policy` label it
// declares, and every counter it reports reaches the generic pair.
#include "daemon/tier_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "storage/engine/cache_engine.h"
#include "tests/testing/engine_over_test_tier.h"
#include "tests/testing/memory_tier.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::daemon {
namespace {

using Labels = std::map<std::string, std::string>;

// The value of the sample of `family` whose labels are exactly `labels`.
std::optional<double> Sample(const std::vector<prometheus::MetricFamily>& all,
                             const std::string& family, const Labels& labels) {
  for (const prometheus::MetricFamily& f : all) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      Labels got;
      for (const auto& l : m.label) got[l.name] = l.value;
      if (got != labels) continue;
      return f.type == prometheus::MetricType::Counter ? m.counter.value
                                                       : m.gauge.value;
    }
  }
  return std::nullopt;
}

class TierMetricsTest : public ::testing::Test {
 protected:
  // Host DRAM with the 2q policy, then `slowmem`, a test tier declaring the
  // policy "slow-policy".
  void SetUp() override {
    std::vector<storage::NamespaceOptions> spaces;
    spaces.push_back(
        {.host = {.name = "ns",
                  .capacity_bytes = 1 << 20,
                  .shards = 1,
                  .try_hugepages = false,
                  .prefault = false,
                  .eviction_policy = storage::EvictionPolicyKind::kTwoQueue}});
    auto opened = testing::OpenEngineOverTestTier(std::move(spaces),
                                                  {.id = 0, .name = "ns"});
    ASSERT_OK(opened);
    engine_ = std::move(opened->engine);
    slowmem_ = opened->tier;
  }

  testing::MemoryTier* slowmem_ = nullptr;  // owned by the engine's chain
  std::unique_ptr<storage::CacheEngine> engine_;
};

TEST_F(TierMetricsTest, AnAddedTierIsExportedUnderItsNameAndPolicy) {
  const auto all = TierMetrics(engine_.get()).Collect();
  // Listed with its place in cost order: host DRAM, then the chain.
  EXPECT_EQ(Sample(all, "tierkv_tier_info",
                   {{"tier", "host"}, {"policy", "2q"}, {"kind", "host"}}),
            0);
  EXPECT_EQ(
      Sample(
          all, "tierkv_tier_info",
          {{"tier", "slowmem"}, {"policy", "slow-policy"}, {"kind", "peer"}}),
      1);
  // The well-known names land in the dashboards' families.
  EXPECT_EQ(Sample(all, "tierkv_tier_bytes",
                   {{"tier", "slowmem"}, {"state", "used"}}),
            512);
  EXPECT_EQ(Sample(all, "tierkv_tier_segments", {{"tier", "slowmem"}}), 1);
  EXPECT_EQ(Sample(all, "tierkv_namespace_segments",
                   {{"namespace", "ns"}, {"tier", "slowmem"}}),
            1);
  EXPECT_EQ(Sample(all, "tierkv_evictions_total",
                   {{"tier", "slowmem"}, {"policy", "slow-policy"}}),
            0);
  EXPECT_EQ(Sample(all, "tierkv_tier_reads_total",
                   {{"tier", "slowmem"}, {"result", "hit"}}),
            0);
  // Every other counter in the generic pair.
  EXPECT_EQ(
      Sample(
          all, "tierkv_tier_counter_total",
          {{"tier", "slowmem"}, {"policy", "slow-policy"}, {"name", "writes"}}),
      1);
  EXPECT_EQ(Sample(all, "tierkv_tier_gauge",
                   {{"namespace", "ns"},
                    {"tier", "slowmem"},
                    {"policy", "slow-policy"},
                    {"name", "capacity_bytes"}}),
            64 << 20);
}

TEST_F(TierMetricsTest, HostDramIsLabelledWithEachNamespacesPolicy) {
  const auto all = TierMetrics(engine_.get()).Collect();
  EXPECT_EQ(Sample(all, "tierkv_evictions_total",
                   {{"namespace", "ns"}, {"tier", "host"}, {"policy", "2q"}}),
            0);
  EXPECT_EQ(Sample(all, "tierkv_tier_bytes",
                   {{"tier", "host"}, {"state", "capacity"}}),
            1 << 20);
  EXPECT_EQ(Sample(all, "tierkv_namespace_bytes",
                   {{"namespace", "ns"}, {"tier", "host"}, {"state", "used"}}),
            0);
  EXPECT_EQ(Sample(all, "tierkv_dedup_hits_total", {{"namespace", "ns"}}), 0);
  // No tier reports evictions both per namespace and per tier.
  EXPECT_FALSE(Sample(all, "tierkv_evictions_total",
                      {{"tier", "host"}, {"policy", "2q"}}));
}

}  // namespace
}  // namespace tierkv::daemon
