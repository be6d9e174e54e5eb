// WeightsMetrics: the weights catalogs' totals as gauges (see
// weights_metrics.h).
#include "daemon/weights_metrics.h"

#include <prometheus/metric_family.h>

#include "daemon/metric_families.h"

namespace tierkv::daemon {

using prometheus::MetricFamily;
using prometheus::MetricType;

std::vector<MetricFamily> WeightsMetrics::Collect() const {
  auto shards =
      Family("tierkv_weights_shards", "Sealed weights shards of the namespace",
             MetricType::Gauge);
  auto referenced = Family(
      "tierkv_weights_referenced_bytes",
      "Chunk bytes the sealed weights shards name, a shared chunk once per "
      "shard",
      MetricType::Gauge);
  auto unique =
      Family("tierkv_weights_unique_bytes",
             "Bytes of the distinct chunks the sealed weights shards name",
             MetricType::Gauge);
  auto pinned = Family("tierkv_weights_pinned_bytes",
                       "Distinct chunk bytes of the pinned weights shards "
                       "(kept in DRAM)",
                       MetricType::Gauge);
  for (const auto& [name, catalog] : catalogs_) {
    const storage::WeightsCatalog::Totals t = catalog->totals();
    AddValue(pinned, {{"namespace", name}},
             static_cast<double>(catalog->schedule_totals().pinned_bytes));
    AddValue(shards, {{"namespace", name}}, static_cast<double>(t.shards));
    AddValue(referenced, {{"namespace", name}},
             static_cast<double>(t.referenced_bytes));
    AddValue(unique, {{"namespace", name}},
             static_cast<double>(t.unique_bytes));
  }
  return {std::move(shards), std::move(referenced), std::move(unique),
          std::move(pinned)};
}

}  // namespace tierkv::daemon
