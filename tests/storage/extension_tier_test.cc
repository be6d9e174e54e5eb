// The extension test (issue 26): a tier the engine has never heard of --
// tests/testing/memory_tier.h, written against storage/tier/tier.h alone --
// handed to a real CacheEngine through the placement, serves reads and
// takes the write-back of segments DRAM evicts. Nothing in storage/,
// daemon/ or tools/ names it.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <map>
#include <string>

#include "storage/engine/cache_engine.h"
#include "tests/testing/memory_tier.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

using testing::MemoryTier;

constexpr uint64_t kOwner = 3;
constexpr uint64_t kSegment = 4096;

LayoutSpec OneLayer() {
  LayoutSpec l;
  l.page_tokens = 16;
  l.layers.push_back({.parts = {{"kv", kSegment / 16}}});  // bytes per token
  return l;
}

SegmentKey Key(uint64_t n) { return {PageHash{n, n * 31 + 7}, 0, 0}; }

std::vector<std::byte> Bytes(uint64_t n) {
  std::vector<std::byte> b(kSegment);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::byte(n * 13 + i);
  return b;
}

// A tier's counters by name.
class CounterMap final : public TierCounterVisitor {
 public:
  void Counter(std::string_view name, uint64_t value) override {
    values[std::string(name)] = static_cast<double>(value);
  }
  void Gauge(std::string_view name, double value) override {
    values[std::string(name)] = value;
  }
  std::map<std::string, double> values;
};

class ExtensionTierTest : public ::testing::Test {
 protected:
  // An engine whose only tier below DRAM is `slowmem`, named by the
  // placement as where reads go and where write-back writes.
  void Open() {
    auto tier = std::make_unique<MemoryTier>(MemoryTier::Options{
        .name = "slowmem", .read_latency = std::chrono::microseconds(100)});
    slowmem_ = tier.get();
    std::vector<std::unique_ptr<Tier>> below;
    below.push_back(std::move(tier));
    CacheEngineOptions o{.workers = 2};
    o.mover.workers = 1;
    o.placement = {.read_order = {"slowmem"}, .demote_to = "slowmem"};
    std::vector<NamespaceOptions> spaces;
    spaces.push_back(
        {.host = {.name = "ns", .capacity_bytes = 1 << 20, .shards = 1},
         .write_policy = WritePolicy::kWriteBack});
    auto engine = CacheEngine::Open(o, std::move(spaces), std::move(below));
    ASSERT_OK(engine);
    engine_ = std::move(engine).value();
    ns_ = engine_->Find("ns");
    ASSERT_OK(engine_->RegisterLayout(*ns_, OneLayer()));
  }

  void Put(uint64_t n) {
    std::promise<EngineReservation> reserved;
    engine_->Reserve(kOwner, *ns_, {{Key(n), kSegment}},
                     [&](EngineReservation r) { reserved.set_value(r); });
    EngineReservation r = reserved.get_future().get();
    ASSERT_OK(r.items[0]);
    if (r.items[0]->already_stored) return;
    std::memcpy(ns_->host().arena().base() + r.items[0]->location.offset,
                Bytes(n).data(), kSegment);
    const SegmentKey key = Key(n);
    ASSERT_OK(engine_->Commit(kOwner, *ns_, r.lease_id, {&key, 1})[0]);
  }

  EngineRead Get(std::vector<SegmentKey> keys) {
    std::promise<EngineRead> done;
    engine_->Acquire(kOwner, *ns_, std::move(keys),
                     [&](EngineRead r) { done.set_value(std::move(r)); });
    return done.get_future().get();
  }

  std::map<std::string, double> Counters() const {
    CounterMap counters;
    slowmem_->VisitCounters(counters);
    return counters.values;
  }

  MemoryTier* slowmem_ = nullptr;  // owned by the engine's chain
  std::unique_ptr<CacheEngine> engine_;
  EngineNamespace* ns_ = nullptr;
};

TEST_F(ExtensionTierTest, AnAddedTierTakesDemotionsAndServesReads) {
  Open();
  // 1 MiB of DRAM holds 256 segments: 1,000 Puts make write-back demote
  // into slowmem and DRAM evict what slowmem holds.
  constexpr uint64_t kPages = 1000;
  for (uint64_t n = 0; n < kPages; ++n) Put(n);
  engine_->TEST_DrainBackground();
  const EngineStats stats = engine_->Stats(*ns_);
  EXPECT_GT(stats.host.evictions, 0u);
  EXPECT_GT(stats.mover.demotions_done, 0u);
  EXPECT_GT(Counters()["writes"], 0);
  uint64_t only_below = 0;
  for (uint64_t n = 0; n < kPages; ++n) {
    const bool in_dram = ns_->host().Touch(Key(n));
    EXPECT_TRUE(in_dram || slowmem_->Holds(0, Key(n))) << "page " << n;
    only_below += !in_dram;
  }
  ASSERT_GT(only_below, 500u);  // most of it lives in slowmem only

  // Match sees every page, the evicted ones as the added tier's kind.
  std::vector<PageHash> pages;
  for (uint64_t n = 0; n < kPages; ++n) pages.push_back(Key(n).page);
  auto m = engine_->Match(*ns_, pages, CacheEngine::NvmePromotion::kNone);
  ASSERT_OK(m);
  EXPECT_EQ(m->leading_pages, kPages);
  EXPECT_EQ(m->tiers[0], tierkv::Tier::kPeer);

  // A Get of the oldest pages is served from slowmem, bit-exact.
  std::vector<SegmentKey> keys;
  for (uint64_t n = 0; n < 16; ++n) keys.push_back(Key(n));
  const double hits_before = Counters()["read_hits"];
  EngineRead read = Get(keys);
  for (uint64_t n = 0; n < 16; ++n) {
    ASSERT_OK(read.items[n]);
    EXPECT_EQ(read.source[n], tierkv::Tier::kPeer);
    EXPECT_EQ(std::memcmp(ns_->host().arena().base() + read.items[n]->offset,
                          Bytes(n).data(), kSegment),
              0)
        << "page " << n;
  }
  EXPECT_EQ(Counters()["read_hits"], hits_before + 16);
  ASSERT_OK(engine_->Release(kOwner, read.lease_id));

  // Not persistent: Flush has nowhere durable to write.
  std::promise<std::vector<Status>> flushed;
  engine_->Flush(*ns_, {Key(0)}, [&](std::vector<Status> s) {
    flushed.set_value(std::move(s));
  });
  EXPECT_EQ(flushed.get_future().get()[0].code(), StatusCode::kInvalidArgument);
}

TEST_F(ExtensionTierTest, TheTierWalkReportsAnAddedTierByItsNameAndPolicy) {
  Open();
  for (uint64_t n = 0; n < 400; ++n) Put(n);  // past DRAM: demotions
  engine_->TEST_DrainBackground();
  const std::vector<TierReport> reports = engine_->TierReports(ns_);
  // Cheapest first: DRAM, then the chain (no HBM here).
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].name, "host");
  EXPECT_TRUE(reports[0].per_namespace);
  const TierReport& added = reports[1];
  EXPECT_EQ(added.name, "slowmem");
  EXPECT_EQ(added.policy, "lru");
  EXPECT_EQ(added.kind, tierkv::Tier::kPeer);
  EXPECT_FALSE(added.persistent);
  // Its counters are what it reports itself, the whole tier in `shared`.
  const std::map<std::string, double> own = Counters();
  ASSERT_GT(own.at("writes"), 0);
  EXPECT_EQ(added.shared.FindCounter("writes"),
            static_cast<uint64_t>(own.at("writes")));
  EXPECT_EQ(added.shared.FindGauge("segments"), own.at("segments"));
  // And the namespace's share, as VisitNamespaceCounters reports it.
  ASSERT_EQ(added.namespaces.size(), 1u);
  EXPECT_EQ(added.namespaces[0].name, "ns");
  EXPECT_EQ(added.namespaces[0].values.FindGauge("segments"),
            own.at("segments"));
  // Host DRAM's totals are its one namespace's instance plus the engine's
  // backpressure counters.
  const TierCounterSet host = reports[0].Totals();
  EXPECT_EQ(host.FindCounter("evictions"), ns_->host().Stats().evictions);
  EXPECT_TRUE(host.FindCounter("backpressure_waits").has_value());
}

TEST_F(ExtensionTierTest, APlacementNamingAnUnknownTierIsAClearError) {
  std::vector<std::unique_ptr<Tier>> below;
  below.push_back(std::make_unique<MemoryTier>(MemoryTier::Options{}));
  CacheEngineOptions o;
  o.placement = {.read_order = {"slowmem"}, .demote_to = "nvme"};
  auto engine = CacheEngine::Open(
      o, {{.host = {.name = "ns", .capacity_bytes = 1 << 20, .shards = 1}}},
      std::move(below));
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("placement.demote_to names 'nvme'"),
            std::string::npos)
      << engine.status().ToString();
}

}  // namespace
}  // namespace tierkv::storage
