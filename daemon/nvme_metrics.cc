// NvmeMetrics: the NVMe device's and the tier mover's families (see
// nvme_metrics.h).
#include "daemon/nvme_metrics.h"

#include <prometheus/metric_family.h>

#include "daemon/metric_families.h"

namespace tierkv::daemon {

using prometheus::MetricFamily;
using prometheus::MetricType;

std::vector<MetricFamily> NvmeMetrics::Collect() const {
  const auto s = store_->Stats();
  const auto mv = mover_->Stats();
  std::vector<MetricFamily> out;

  auto writes = Family("tierkv_nvme_writes_total",
                       "NVMe segment writes by result", MetricType::Counter);
  AddValue(writes, {{"result", "stored"}}, static_cast<double>(s.writes));
  AddValue(writes, {{"result", "dedup"}}, static_cast<double>(s.write_dedup));
  AddValue(writes, {{"result", "error"}}, static_cast<double>(s.write_errors));
  out.push_back(std::move(writes));

  auto io = Family("tierkv_nvme_io_bytes_total",
                   "Bytes moved by the NVMe device", MetricType::Counter);
  AddValue(io, {{"op", "read"}}, static_cast<double>(s.device.read_bytes));
  AddValue(io, {{"op", "write"}}, static_cast<double>(s.device.write_bytes));
  out.push_back(std::move(io));

  // One per fdatasync of the data file: a Flush of many keys, or one
  // write-back batch, costs one, whatever its size.
  auto syncs = Family("tierkv_nvme_device_syncs_total",
                      "Data syncs (fdatasync) issued to the NVMe device",
                      MetricType::Counter);
  AddValue(syncs, {}, static_cast<double>(s.device.flush_ops));
  out.push_back(std::move(syncs));

  // 1 while the catalog refuses writes (a full disk): the tier serves what
  // it holds, and new segments stay in DRAM.
  auto read_only = Family("tierkv_nvme_read_only",
                          "1 while the NVMe catalog refuses writes (full disk "
                          "or device error); stored segments stay readable",
                          MetricType::Gauge);
  AddValue(read_only, {}, s.read_only ? 1.0 : 0.0);
  out.push_back(std::move(read_only));
  auto read_only_entries =
      Family("tierkv_nvme_read_only_entries_total",
             "Times the NVMe catalog became read-only", MetricType::Counter);
  AddValue(read_only_entries, {}, static_cast<double>(s.read_only_entries));
  out.push_back(std::move(read_only_entries));

  auto reread =
      Family("tierkv_nvme_checksum_reread_ok_total",
             "Checksum failures whose immediate re-read verified (the first "
             "read returned wrong bytes, the device holds right ones)",
             MetricType::Counter);
  AddValue(reread, {}, static_cast<double>(s.checksum_reread_ok));
  out.push_back(std::move(reread));

  auto recovered = Family("tierkv_nvme_recovered_segments",
                          "Segments recovered from the catalog at start-up",
                          MetricType::Gauge);
  AddValue(recovered, {}, static_cast<double>(s.recovery.recovered_segments));
  out.push_back(std::move(recovered));
  auto recovered_bytes =
      Family("tierkv_nvme_recovered_bytes",
             "Bytes recovered from the catalog at start-up", MetricType::Gauge);
  AddValue(recovered_bytes, {},
           static_cast<double>(s.recovery.recovered_bytes));
  out.push_back(std::move(recovered_bytes));

  auto latency = Family("tierkv_nvme_io_latency_seconds",
                        "NVMe device IO latency", MetricType::Histogram);
  // The device keeps no exact sum per op: estimated from the buckets.
  AddHistogram(latency, {{"op", "read"}}, s.device.read_latency);
  AddHistogram(latency, {{"op", "write"}}, s.device.write_latency);
  out.push_back(std::move(latency));

  auto depth = Family("tierkv_mover_queue_depth",
                      "Batches waiting in the tier mover", MetricType::Gauge);
  AddValue(depth, {{"queue", "prefetch"}},
           static_cast<double>(mv.prefetch_queue_depth));
  out.push_back(std::move(depth));

  // Segments moved, by direction and result. Demotions are never dropped:
  // dirty segments wait in DRAM (backpressure) until written.
  auto jobs = Family("tierkv_mover_segments_total",
                     "Tier mover segments by direction and result",
                     MetricType::Counter);
  AddValue(jobs, {{"queue", "demotion"}, {"result", "done"}},
           static_cast<double>(mv.demotions_done));
  AddValue(jobs, {{"queue", "demotion"}, {"result", "retried"}},
           static_cast<double>(mv.demotions_retried));
  AddValue(jobs, {{"queue", "demotion"}, {"result", "failed"}},
           static_cast<double>(mv.demotions_failed));
  AddValue(jobs, {{"queue", "promotion"}, {"result", "done"}},
           static_cast<double>(mv.promotions_done));
  AddValue(jobs, {{"queue", "promotion"}, {"result", "failed"}},
           static_cast<double>(mv.promotions_failed));
  out.push_back(std::move(jobs));

  auto batches = Family("tierkv_mover_batches_total",
                        "Tier mover batches by kind", MetricType::Counter);
  AddValue(batches, {{"kind", "demotion"}},
           static_cast<double>(mv.demotion_batches));
  AddValue(batches, {{"kind", "prefetch"}},
           static_cast<double>(mv.prefetch_batches));
  AddValue(batches, {{"kind", "prefetch_dropped"}},
           static_cast<double>(mv.prefetch_dropped));
  AddValue(batches, {{"kind", "background_prefetch"}},
           static_cast<double>(mv.background_batches));
  AddValue(batches, {{"kind", "background_prefetch_slice"}},
           static_cast<double>(mv.background_slices));
  AddValue(batches, {{"kind", "background_prefetch_dropped"}},
           static_cast<double>(mv.background_dropped));
  out.push_back(std::move(batches));
  return out;
}

}  // namespace tierkv::daemon
