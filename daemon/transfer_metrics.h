// TransferMetrics: Prometheus view of the engine's data movement between
// tiers and registered pools, and of its work queues, built at scrape time
// from CacheEngine::SharedStats() (a prometheus::Collectable).
//
// Families (daemon-wide: the workers, the mover and the NVMe tier are shared
// by every namespace):
//   tierkv_transfer_bytes_total{src,dst}, tierkv_transfer_segments_total
//   {src,dst}: hbm->pool, host->pool and nvme->pool (Load), pool->host
//   (Store),
//   nvme->host (promotion: Prefetch, Match, Get), host->nvme (write-back
//   and Flush; segments already on NVMe are not counted);
//   tierkv_transfers_total{op="load|store|weights_load|prefetch"} (calls
//   accepted);
//   tierkv_transfer_load_misses_total, tierkv_transfer_store_dedup_total;
//   tierkv_transfer_seconds{op="load|store|weights_load"} (histogram:
//   accepted -> last layer published; weights loads apart, their gigabytes
//   would swamp the KV loads' latencies);
//   tierkv_registered_pools, tierkv_worker_queue_depth,
//   tierkv_worker_rejections_total, tierkv_backpressure_waits_total,
//   tierkv_backpressure_busy_total, tierkv_stream_gate_waiting,
//   tierkv_stream_gate_timeouts_total.
//
// Thread safety: Collect() may run concurrently with engine operations.
#pragma once

#include <prometheus/collectable.h>

#include "storage/engine/cache_engine.h"

namespace tierkv::daemon {

class TransferMetrics final : public prometheus::Collectable {
 public:
  // `engine` is borrowed and must outlive every scrape (the daemon stops
  // the exposer before destroying it).
  explicit TransferMetrics(const storage::CacheEngine* engine)
      : engine_(engine) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const storage::CacheEngine* engine_;
};

}  // namespace tierkv::daemon
