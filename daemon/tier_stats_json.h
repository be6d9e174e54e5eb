// TierStatsJson: the stats JSON's per-tier part, written from the engine's
// tier walk (storage/tier/tier_counters.h) without naming a tier:
//
//   "tiers": [ cheapest first, one per tier:
//     {"name": "nvme", "policy": "lru", "kind": "nvme", "persistent": true,
//      "counters": {...}, "gauges": {...}, "flags": {...},
//      "namespace": {"policy": ..., "counters", "gauges", "flags"}} ]
//
// "counters"/"gauges"/"flags" are the tier as the namespace sees it: the
// whole tier, or for a tier that is one instance per namespace (host DRAM)
// the namespace's own instance; "namespace" is the namespace's share of a
// shared tier (absent when the tier keeps none). Gauges with an integral
// value are written as integers.
//
// Each tier also keeps the object it had before "tiers" existed, under its
// name ("host", "hbm", "nvme"): every value of its entry flattened into
// one object, "eviction_policy", and its "namespace" share flattened too
// (quota_bytes also as its older name, reserved_bytes). A tier whose name
// is already a top-level key gets no such object.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "storage/tier/tier_counters.h"

namespace tierkv::daemon {

// The "tiers" array for reports taken for one namespace
// (CacheEngine::TierReports(ns)).
nlohmann::json TiersJson(const std::vector<storage::TierReport>& reports);

// Adds `values` into the entry of tier `tier` in `tiers` (as counters);
// nothing when no entry has that name. For what the engine counts about a
// tier outside it (the tier mover's demotions into the write-back target).
void AddTierCounters(nlohmann::json& tiers, std::string_view tier,
                     const storage::TierCounterSet& values);

// Writes each entry of `tiers` as its flat object j[name] (see the top).
void AddFlatTierObjects(const nlohmann::json& tiers, nlohmann::json& j);

}  // namespace tierkv::daemon
