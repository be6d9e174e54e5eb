// DaemonMetrics: tierkvd's Prometheus metrics (DESIGN.md §9; the README's
// metrics table lists every family), served by prometheus-cpp on a
// loopback address by default.
//
// Two kinds, never mixed in one family: event counters and histograms
// (lookups, gets, puts, auth failures, requests, client layer waits) are
// bumped where the event happens; everything storage counts itself (every
// tier's occupancy, evictions and reads, the NVMe device, the engine's
// transfers) and the cluster's transports count is read from them at
// scrape time (tier_metrics.h, nvme_metrics.h, transfer_metrics.h,
// cluster_metrics.h), so it never drifts.
//
// Thread safety: thread-safe (prometheus-cpp metrics are).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "storage/engine/cache_engine.h"
#include "storage/host/host_tier.h"
#include "storage/nvme/nvme_store.h"
#include "storage/tier/tier_mover.h"
#include "storage/weights/weights_catalog.h"
#include "tierkv/status.h"
#include "transport/uds_server.h"

namespace prometheus {
class Collectable;
class Counter;
class Gauge;
class Histogram;
class Registry;
class Exposer;
}  // namespace prometheus

namespace tierkv::transport {
class Directory;
}
namespace tierkv::transport::peer {
class PeerTransport;
}

namespace tierkv::daemon {

// One namespace's event metrics; pointers into the registry.
struct NamespaceMetrics {
  prometheus::Counter* lookups;             // Match calls
  prometheus::Counter* lookup_tokens_host;  // tokens of pages found in host
  prometheus::Counter* lookup_tokens_nvme;
  prometheus::Counter* lookup_tokens_hbm;
  prometheus::Counter* lookup_tokens_peer;  // pages another node holds
  prometheus::Counter* lookup_tokens_miss;
  prometheus::Counter* get_hits;       // segments
  prometheus::Counter* get_hits_nvme;  // promoted from NVMe on demand
  prometheus::Counter* get_misses;
  prometheus::Counter* put_stored;  // segments
  prometheus::Counter* put_dedup;
  prometheus::Counter* put_failed;
  // Time the namespace's engines spent blocked in WaitLayer / Wait, as
  // reported by their clients (see RecordLayerWaits).
  prometheus::Histogram* layer_wait;
};

// Times every request from its arrival to its reply:
// tierkv_request_seconds{op} (histogram) and
// tierkv_request_errors_total{op}.
class RequestMetrics final : public transport::Responder::Observer {
 public:
  explicit RequestMetrics(prometheus::Registry& registry);
  void OnReply(uint16_t opcode, bool is_error,
               std::chrono::steady_clock::time_point received) override;

 private:
  struct Op {
    prometheus::Histogram* seconds = nullptr;
    prometheus::Counter* errors = nullptr;
  };
  std::vector<Op> ops_;  // by opcode; null for unknown ones
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

  NamespaceMetrics* AddNamespace(const std::string& name);
  // Exports every tier of the engine (tier_metrics.h). Borrowed; call
  // StopServing() before destroying it.
  void AddTiers(const storage::CacheEngine* engine);
  // Exports the NVMe device and the mover (see nvme_metrics.h). Both
  // borrowed; call StopServing() before destroying them.
  void AddNvmeTier(const storage::NvmeStore* store,
                   const storage::TierMover* mover);
  // Exports the engine's transfers and work queues (see
  // transfer_metrics.h). Borrowed; call StopServing() before destroying it.
  void AddEngine(const storage::CacheEngine* engine);
  // Exports the cluster's directory and peer transport (see
  // cluster_metrics.h); a daemon without [cluster] never calls it. Both
  // borrowed (either may be null: its families are left out); call
  // StopServing() before destroying them.
  void AddCluster(const transport::Directory* directory,
                  const transport::peer::PeerTransport* peers);
  // Exports the sealed weights shards of each weights namespace (name,
  // catalog; see weights_metrics.h). Borrowed; call StopServing() before
  // destroying them.
  void AddWeights(
      std::vector<std::pair<std::string, const storage::WeightsCatalog*>>
          catalogs);
  // Closes the HTTP listener (no scrape runs afterwards).
  void StopServing();
  // Merges a client's report of its WaitLayer / Wait calls into
  // tierkv_layer_wait_seconds of `m`: `counts` holds LatencyHistogram
  // buckets (LatencyHistogram::kBuckets of them, else ignored), `total_nanos`
  // their summed time. Clients report with their next transfer request, so
  // a client's last waits before it disconnects are not counted.
  void RecordLayerWaits(NamespaceMetrics& m, std::span<const uint64_t> counts,
                        uint64_t total_nanos);
  // Hand to each request's Responder::Observe.
  RequestMetrics* requests() { return requests_.get(); }

  prometheus::Counter& auth_failures() { return *auth_failures_; }
  prometheus::Counter& protocol_errors() { return *protocol_errors_; }
  prometheus::Gauge& active_leases() { return *active_leases_; }
  prometheus::Gauge& connections() { return *connections_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string listen_;  // as Serve() was given it
  std::shared_ptr<prometheus::Collectable> tiers_;
  std::shared_ptr<prometheus::Collectable> nvme_;
  std::shared_ptr<prometheus::Collectable> engine_;
  std::shared_ptr<prometheus::Collectable> cluster_;
  std::shared_ptr<prometheus::Collectable> weights_;
  std::unique_ptr<RequestMetrics> requests_;
  std::vector<std::unique_ptr<NamespaceMetrics>> namespaces_;
  prometheus::Counter* auth_failures_;
  prometheus::Counter* protocol_errors_;
  prometheus::Gauge* active_leases_;
  prometheus::Gauge* connections_;
};

}  // namespace tierkv::daemon
