// NvmeMetrics: Prometheus view of the NVMe tier and the tier mover, built at
// scrape time from their Stats() (a prometheus::Collectable), so counters
// never drift from what storage counts itself.
//
// Families (the tier's bytes, segments, reads, evictions and corruptions
// are in tier_metrics.h, from the tier walk, with every other tier's):
// tierkv_nvme_writes_total{result}, tierkv_nvme_io_bytes_total{op},
// tierkv_nvme_device_syncs_total, tierkv_nvme_read_only,
// tierkv_nvme_read_only_entries_total, tierkv_nvme_checksum_reread_ok_total,
// tierkv_nvme_recovered_segments, tierkv_nvme_recovered_bytes,
// tierkv_nvme_io_latency_seconds{op} (histogram),
// tierkv_mover_queue_depth{queue}, tierkv_mover_segments_total{queue,result},
// tierkv_mover_batches_total{kind}.
//
// Thread safety: Collect() may run concurrently with storage operations.
#pragma once

#include <prometheus/collectable.h>

#include "storage/nvme/nvme_store.h"
#include "storage/tier/tier_mover.h"

namespace tierkv::daemon {

class NvmeMetrics final : public prometheus::Collectable {
 public:
  // Both borrowed; they must outlive every scrape (the daemon stops the
  // exposer before destroying them).
  NvmeMetrics(const storage::NvmeStore* store, const storage::TierMover* mover)
      : store_(store), mover_(mover) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const storage::NvmeStore* store_;
  const storage::TierMover* mover_;
};

}  // namespace tierkv::daemon
