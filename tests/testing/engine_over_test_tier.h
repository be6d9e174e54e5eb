// OpenEngineOverTestTier: a CacheEngine whose one tier below host DRAM is a
// MemoryTier named "slowmem" that declares the policy "slow-policy", for
// tests of what readers (metrics, stats JSON) make of a tier they were
// never written for.
#pragma once

#include <memory>
#include <vector>

#include "storage/engine/cache_engine.h"
#include "storage/tier/tier.h"
#include "tests/testing/memory_tier.h"
#include "tierkv/status.h"

namespace tierkv::testing {

struct EngineOverTestTier {
  std::unique_ptr<storage::CacheEngine> engine;
  MemoryTier* tier = nullptr;  // owned by the engine's chain
};

// One worker and one mover worker over `spaces`; the tier has no read
// latency and holds one 512-byte segment (page {1, 2}, layer 0, part 0,
// layout fingerprint 9) of namespace `seeded`, written straight into it.
Result<EngineOverTestTier> OpenEngineOverTestTier(
    std::vector<storage::NamespaceOptions> spaces,
    const storage::TierNamespace& seeded);

}  // namespace tierkv::testing
