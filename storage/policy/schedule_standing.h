// ScheduleStanding: where a content-addressed segment (a weights chunk)
// stands in its catalog's schedule (storage/weights/weights_catalog.h),
// fed to the `weights` eviction policy of the tiers holding it
// (EvictionPolicy::SetSchedule, Tier::SetSchedule); other policies ignore
// it.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>

#include "tierkv/types.h"

namespace tierkv::storage {

struct ScheduleStanding {
  // A pinned shard names it: never a victim while the pin lasts.
  bool pinned = false;
  // The nearest next use (ms on the catalog's clock, any epoch) over the
  // hinted shards naming it; none: no such shard.
  std::optional<int64_t> next_use_ms;

  bool operator==(const ScheduleStanding&) const = default;
};
// Hinted or pinned chunks only; a key absent has no hint and no pin.
using ScheduleTable = std::unordered_map<SegmentKey, ScheduleStanding>;

}  // namespace tierkv::storage
