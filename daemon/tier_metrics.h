// TierMetrics: every tier's occupancy, evictions and reads in one set of
// tier-labelled families (DESIGN.md §9), built at scrape time from the
// engine's tier walk (CacheEngine::TierReports; a prometheus::Collectable),
// so a value never drifts from what storage counts, every tier is exported
// the same way, and a tier added to the chain appears with no edit here.
// The `tier` label is the tier's name, `policy` its eviction policy.
//
// Well-known counter names (storage/tier/tier_counters.h, "Vocabulary")
// fill the dashboards' families:
//
//   tierkv_tier_info{tier,policy,kind}     value: the tier's place, 0 the
//                                          cheapest (HBM, host, then the
//                                          chain in read order)
//   tierkv_tier_bytes{tier,state}          <state>_bytes gauges: used,
//                                          capacity, reserved, dirty,
//                                          allocated, quota
//   tierkv_tier_segments{tier}
//   tierkv_namespace_bytes{namespace,tier,state}   a namespace's share
//   tierkv_namespace_segments{namespace,tier}
//   tierkv_evictions_total{namespace,tier,policy}  per namespace where the
//   tierkv_evicted_bytes_total{namespace,tier}     tier counts them so,
//                                                  else per tier
//   tierkv_tier_reads_total{tier,result}   hit|miss|error
//   tierkv_tier_admissions_total{tier,result}  admitted|no_room
//   tierkv_corruptions_total{tier}         checksum failures
//   tierkv_dedup_hits_total{namespace}     writes of segments already
//                                          stored (host DRAM: Puts)
//
// and every value of every tier, whatever its name, also goes to the
// generic pair:
//
//   tierkv_tier_counter_total{[namespace,]tier,policy,name}
//   tierkv_tier_gauge{[namespace,]tier,policy,name}   (flags as 0/1)
//
// (with `namespace` for a namespace's share). Also the device backend's
// health: tierkv_device_up, tierkv_device_quarantined_units[_total].
//
// Thread safety: Collect() may run concurrently with storage operations.
#pragma once

#include <prometheus/collectable.h>

#include <vector>

#include "storage/engine/cache_engine.h"

namespace tierkv::daemon {

class TierMetrics final : public prometheus::Collectable {
 public:
  // Borrowed; it must outlive every scrape (the daemon stops the exposer
  // before destroying it).
  explicit TierMetrics(const storage::CacheEngine* engine) : engine_(engine) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const storage::CacheEngine* engine_;
};

}  // namespace tierkv::daemon
