// DaemonMetrics: tierkvd's Prometheus metrics (DESIGN.md §9), served by
// prometheus-cpp on a loopback address by default.
//
// Event counters (lookups, gets, puts, dedup hits, auth failures, client
// layer waits) are bumped where the event happens; occupancy gauges and
// eviction counters are refreshed from storage stats by Refresh(), called
// periodically; the NVMe tier and the engine's transfers are read from
// storage at scrape time (nvme_metrics.h, transfer_metrics.h).
//
// Thread safety: prometheus-cpp metrics are thread-safe; Refresh() must not
// run concurrently with itself.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "storage/cache_engine.h"
#include "storage/host_tier.h"
#include "storage/nvme_store.h"
#include "storage/tier_mover.h"
#include "tierkv/status.h"

namespace prometheus {
class Collectable;
class Counter;
class Gauge;
class Histogram;
class Registry;
class Exposer;
}  // namespace prometheus

namespace tierkv::daemon {

// One namespace's metrics; references point into the registry.
struct NamespaceMetrics {
  prometheus::Counter* lookups;             // Match calls
  prometheus::Counter* lookup_tokens_host;  // tokens of pages found in host
  prometheus::Counter* lookup_tokens_nvme;
  prometheus::Counter* lookup_tokens_hbm;
  prometheus::Counter* lookup_tokens_miss;
  prometheus::Counter* get_hits;       // segments
  prometheus::Counter* get_hits_nvme;  // promoted from NVMe on demand
  prometheus::Counter* get_misses;
  prometheus::Counter* put_stored;  // segments
  prometheus::Counter* put_dedup;
  prometheus::Counter* put_failed;
  prometheus::Counter* dedup_hits;
  prometheus::Counter* evictions;  // refreshed from storage
  prometheus::Counter* evicted_bytes;
  prometheus::Gauge* bytes_used;
  prometheus::Gauge* bytes_reserved;
  prometheus::Gauge* bytes_capacity;
  prometheus::Gauge* segments;
  // Time the namespace's engines spent blocked in WaitLayer / Wait, as
  // reported by their clients (see RecordLayerWaits).
  prometheus::Histogram* layer_wait;
  double last_evictions = 0;
  double last_evicted_bytes = 0;
  double last_dedup = 0;
};

class DaemonMetrics {
 public:
  DaemonMetrics();
  ~DaemonMetrics();

  // Serves /metrics on `listen` ("127.0.0.1:9400"; port 0 picks one).
  // IOError when the address cannot be bound.
  Status Serve(const std::string& listen);
  // The bound port, or 0 when not serving.
  int port() const;

  // `policy`: the namespace's eviction policy, the `policy` label.
  NamespaceMetrics* AddNamespace(const std::string& name,
                                 std::string_view policy);
  // Exports the NVMe tier and mover (see nvme_metrics.h). Both borrowed;
  // call StopServing() before destroying them.
  void AddNvmeTier(const storage::NvmeStore* store,
                   const storage::TierMover* mover);
  // Exports the engine's transfers and work queues (see
  // transfer_metrics.h). Borrowed; call StopServing() before destroying it.
  void AddEngine(const storage::CacheEngine* engine);
  // Closes the HTTP listener (no scrape runs afterwards).
  void StopServing();
  // Merges a client's report of its WaitLayer / Wait calls into
  // tierkv_layer_wait_seconds of `m`: `counts` holds LatencyHistogram
  // buckets (LatencyHistogram::kBuckets of them, else ignored), `total_nanos`
  // their summed time. Clients report with their next transfer request, so
  // a client's last waits before it disconnects are not counted.
  void RecordLayerWaits(NamespaceMetrics& m, std::span<const uint64_t> counts,
                        uint64_t total_nanos);
  void Refresh(NamespaceMetrics& m, const storage::HostTierStats& stats);

  prometheus::Counter& auth_failures() { return *auth_failures_; }
  prometheus::Counter& protocol_errors() { return *protocol_errors_; }
  prometheus::Gauge& active_leases() { return *active_leases_; }
  prometheus::Gauge& connections() { return *connections_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string listen_;  // as Serve() was given it
  std::shared_ptr<prometheus::Collectable> nvme_;
  std::shared_ptr<prometheus::Collectable> engine_;
  std::vector<std::unique_ptr<NamespaceMetrics>> namespaces_;
  prometheus::Counter* auth_failures_;
  prometheus::Counter* protocol_errors_;
  prometheus::Gauge* active_leases_;
  prometheus::Gauge* connections_;
};

}  // namespace tierkv::daemon
