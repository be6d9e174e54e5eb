// WeightsMetrics: Prometheus view of the sealed weights shards of each
// weights namespace (storage/weights/weights_catalog.h), built at scrape
// time from WeightsCatalog::totals() (a prometheus::Collectable).
//
// Families, each by {namespace}:
//   tierkv_weights_shards: sealed shards;
//   tierkv_weights_referenced_bytes: chunk bytes they name (a chunk
//   shared by two shards counted twice);
//   tierkv_weights_unique_bytes: bytes of their distinct chunks (what
//   storing them takes).
//
// Thread safety: Collect() may run concurrently with the catalogs' calls.
#pragma once

#include <prometheus/collectable.h>

#include <string>
#include <utility>
#include <vector>

#include "storage/weights/weights_catalog.h"

namespace tierkv::daemon {

class WeightsMetrics final : public prometheus::Collectable {
 public:
  // (namespace name, catalog) pairs; the catalogs are borrowed and must
  // outlive every scrape (the daemon stops the exposer before destroying
  // them).
  explicit WeightsMetrics(
      std::vector<std::pair<std::string, const storage::WeightsCatalog*>>
          catalogs)
      : catalogs_(std::move(catalogs)) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::vector<std::pair<std::string, const storage::WeightsCatalog*>>
      catalogs_;
};

}  // namespace tierkv::daemon
