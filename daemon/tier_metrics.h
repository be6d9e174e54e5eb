// TierMetrics: every tier's occupancy, evictions and reads in one set of
// tier-labelled families (DESIGN.md §9), built at scrape time from the
// tiers' own Stats() (a prometheus::Collectable), so a value never drifts
// from what storage counts and every tier is exported the same way:
//
//   tierkv_tier_bytes{tier,state}          hbm|host|nvme; used, capacity,
//                                          and reserved, dirty (host) or
//                                          allocated (nvme)
//   tierkv_tier_segments{tier}
//   tierkv_namespace_bytes{namespace,tier,state}   used, quota (nvme, hbm:
//                                          0 = shares the tier), capacity,
//                                          reserved (host)
//   tierkv_namespace_segments{namespace,tier}
//   tierkv_evictions_total{namespace,tier,policy}  hbm has no namespace
//   tierkv_evicted_bytes_total{namespace,tier}     (host, and hbm's total)
//   tierkv_tier_reads_total{tier,result}   hbm: hit|miss; nvme:
//                                          hit|miss|error
//   tierkv_tier_admissions_total{tier,result}  hbm: admitted|no_room
//   tierkv_dedup_hits_total{namespace}     Puts of segments already in DRAM
//
// Thread safety: Collect() may run concurrently with storage operations.
#pragma once

#include <prometheus/collectable.h>

#include <string>
#include <vector>

#include "storage/engine/cache_engine.h"
#include "storage/nvme/nvme_store.h"

namespace tierkv::daemon {

class TierMetrics final : public prometheus::Collectable {
 public:
  // `host_policies[i]`: the eviction policy of engine->namespaces()[i] (the
  // `policy` label). `nvme` may be null (no NVMe tier). Borrowed; they must
  // outlive every scrape (the daemon stops the exposer before destroying
  // them).
  TierMetrics(const storage::CacheEngine* engine,
              const storage::NvmeStore* nvme,
              std::vector<std::string> host_policies)
      : engine_(engine),
        nvme_(nvme),
        host_policies_(std::move(host_policies)) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const storage::CacheEngine* engine_;
  const storage::NvmeStore* nvme_;
  const std::vector<std::string> host_policies_;
};

}  // namespace tierkv::daemon
