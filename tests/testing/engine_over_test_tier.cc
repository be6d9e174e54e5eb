// OpenEngineOverTestTier: see engine_over_test_tier.h.
#include "tests/testing/engine_over_test_tier.h"

#include <utility>

namespace tierkv::testing {

Result<EngineOverTestTier> OpenEngineOverTestTier(
    std::vector<storage::NamespaceOptions> spaces,
    const storage::TierNamespace& seeded) {
  auto tier = std::make_unique<MemoryTier>(MemoryTier::Options{
      .name = "slowmem", .read_latency = {}, .policy = "slow-policy"});
  EngineOverTestTier out;
  out.tier = tier.get();
  std::vector<std::unique_ptr<storage::Tier>> below;
  below.push_back(std::move(tier));
  storage::CacheEngineOptions o{.workers = 1};
  o.mover.workers = 1;
  auto engine =
      storage::CacheEngine::Open(o, std::move(spaces), std::move(below));
  if (!engine.ok()) return engine.status();
  out.engine = std::move(engine).value();
  const std::vector<std::byte> data(512, std::byte{7});
  const storage::TierWriteItem item{SegmentKey{PageHash{1, 2}, 0, 0}, data};
  Status written =
      storage::WriteAndWait(*out.tier, seeded, /*fingerprint=*/9, {&item, 1},
                            storage::Durability::kDurable)[0];
  if (!written.ok()) return written;
  return out;
}

}  // namespace tierkv::testing
