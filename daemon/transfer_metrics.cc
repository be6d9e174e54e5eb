#include "daemon/transfer_metrics.h"

#include <prometheus/metric_family.h>

#include "daemon/metric_families.h"

namespace tierkv::daemon {

using prometheus::MetricFamily;
using prometheus::MetricType;

std::vector<MetricFamily> TransferMetrics::Collect() const {
  const storage::EngineStats s = engine_->SharedStats();
  std::vector<MetricFamily> out;
  auto d = [](uint64_t v) { return static_cast<double>(v); };

  struct Route {
    const char* src;
    const char* dst;
    uint64_t segments;
    uint64_t bytes;
  };
  std::vector<Route> routes = {
      {"hbm", "pool", s.load_segments_hbm, s.load_bytes_hbm},
      {"host", "pool", s.load_segments_host, s.load_bytes_host},
      {"nvme", "pool", s.load_segments_nvme, s.load_bytes_nvme},
      {"pool", "host", s.store_segments, s.store_bytes},
  };
  if (s.has_nvme) {
    routes.push_back(
        {"nvme", "host", s.mover.promotions_done, s.mover.promoted_bytes});
    routes.push_back(
        {"host", "nvme", s.mover.written_segments, s.mover.written_bytes});
  }
  auto bytes = Family("tierkv_transfer_bytes_total",
                      "Bytes moved between tiers and registered pools",
                      MetricType::Counter);
  auto segments = Family("tierkv_transfer_segments_total",
                         "Segments moved between tiers and registered pools",
                         MetricType::Counter);
  for (const Route& r : routes) {
    AddValue(bytes, {{"src", r.src}, {"dst", r.dst}}, d(r.bytes));
    AddValue(segments, {{"src", r.src}, {"dst", r.dst}}, d(r.segments));
  }
  out.push_back(std::move(bytes));
  out.push_back(std::move(segments));

  auto calls = Family("tierkv_transfers_total",
                      "Load, Store, weights Load and Prefetch calls accepted",
                      MetricType::Counter);
  AddValue(calls, {{"op", "load"}}, d(s.loads));
  AddValue(calls, {{"op", "store"}}, d(s.stores));
  AddValue(calls, {{"op", "weights_load"}}, d(s.weights_loads));
  AddValue(calls, {{"op", "prefetch"}}, d(s.prefetches));
  out.push_back(std::move(calls));

  auto reports = Family("tierkv_topk_reports_total",
                        "Selection counts (page, full layer) engines reported "
                        "for the topk eviction policy",
                        MetricType::Counter);
  AddValue(reports, {}, d(s.topk_reports));
  out.push_back(std::move(reports));

  auto misses = Family("tierkv_transfer_load_misses_total",
                       "Load segments found in no tier or failing their "
                       "checksum (slot not written)",
                       MetricType::Counter);
  AddValue(misses, {}, d(s.load_misses));
  out.push_back(std::move(misses));
  auto dedup = Family("tierkv_transfer_store_dedup_total",
                      "Store segments already stored (nothing copied)",
                      MetricType::Counter);
  AddValue(dedup, {}, d(s.store_dedup));
  out.push_back(std::move(dedup));

  auto seconds =
      Family("tierkv_transfer_seconds",
             "Load/Store/weights Load time from acceptance to the last layer",
             MetricType::Histogram);
  AddHistogram(seconds, {{"op", "load"}}, s.load_latency,
               d(s.load_latency_nanos) * 1e-9);
  AddHistogram(seconds, {{"op", "store"}}, s.store_latency,
               d(s.store_latency_nanos) * 1e-9);
  AddHistogram(seconds, {{"op", "weights_load"}}, s.weights_load_latency,
               d(s.weights_load_latency_nanos) * 1e-9);
  out.push_back(std::move(seconds));

  auto pools = Family("tierkv_registered_pools",
                      "Engine pools registered over every connection",
                      MetricType::Gauge);
  AddValue(pools, {}, d(s.registered_pools));
  out.push_back(std::move(pools));

  auto depth = Family("tierkv_worker_queue_depth",
                      "Engine calls waiting for a worker (transfers, "
                      "promotions, Flush, backpressure waits)",
                      MetricType::Gauge);
  AddValue(depth, {}, d(s.worker_queue_depth));
  out.push_back(std::move(depth));
  auto rejections = Family("tierkv_worker_rejections_total",
                           "Engine calls answered Busy: worker queue full",
                           MetricType::Counter);
  AddValue(rejections, {}, d(s.worker_rejections));
  out.push_back(std::move(rejections));
  auto waits = Family("tierkv_backpressure_waits_total",
                      "Reserves that waited for the write-back to free DRAM",
                      MetricType::Counter);
  AddValue(waits, {}, d(s.backpressure_waits));
  out.push_back(std::move(waits));
  auto busy = Family("tierkv_backpressure_busy_total",
                     "Segments still Busy after waiting for the write-back",
                     MetricType::Counter);
  AddValue(busy, {}, d(s.backpressure_busy));
  out.push_back(std::move(busy));
  auto gated = Family("tierkv_stream_gate_waiting",
                      "Transfers waiting for their engine's stream to reach "
                      "them (Load/Store ordered after it)",
                      MetricType::Gauge);
  AddValue(gated, {}, d(s.stream_gate_waiting));
  out.push_back(std::move(gated));
  auto gate_timeouts =
      Family("tierkv_stream_gate_timeouts_total",
             "Ordered transfers whose engine stream did not reach them "
             "within device_copy_timeout (nothing moved, segments Busy)",
             MetricType::Counter);
  AddValue(gate_timeouts, {}, d(s.stream_gate_timeouts));
  out.push_back(std::move(gate_timeouts));
  return out;
}

}  // namespace tierkv::daemon
