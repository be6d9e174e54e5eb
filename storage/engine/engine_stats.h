// EngineStats: CacheEngine's counters, one namespace's and the daemon-wide
// rest, as Stats() and SharedStats() report them.
#pragma once

#include <cstdint>
#include <string>

#include "common/latency_histogram.h"
#include "storage/device/hbm_tier.h"
#include "storage/device/pinned_staging.h"
#include "storage/host/host_tier.h"
#include "storage/nvme/nvme_store.h"
#include "storage/tier/tier_mover.h"

namespace tierkv::storage {

// One namespace's host tier plus the daemon-wide rest: the NVMe tier, the
// mover, the workers and the registered-pool transfers are shared by every
// namespace, so their counters cover all of them.
struct EngineStats {
  HostTierStats host;  // the namespace's; empty from SharedStats()
  bool has_hbm = false;
  HbmTierStats hbm;            // daemon-wide; hbm.namespaces[i] per namespace
  uint32_t hbm_namespace = 0;  // Stats(ns): ns's index in hbm.namespaces
  // The device backend (options.device), when there is one: whether a
  // device fault failed it (the HBM tier is then off and device-pool
  // transfers fail; device_backend.h, Errors) and why, and the transfer
  // units whose memory is quarantined behind a timed-out device wait
  // (now, and ever).
  bool has_device = false;
  bool device_failed = false;
  std::string device_error;
  uint64_t device_quarantined = 0;
  uint64_t device_quarantined_total = 0;
  // Bounce buffers of NVMe reads into device pools (PinnedStaging): the
  // pinned arena (0 when there is none) and how reads were served.
  PinnedStagingStats device_staging;
  bool has_nvme = false;
  NvmeStoreStats nvme;
  TierMoverStats mover;
  // Leases held: on the namespace's tier (Stats), or daemon-wide
  // (SharedStats).
  uint64_t active_leases = 0;
  uint64_t worker_queue_depth = 0;
  uint64_t worker_rejections = 0;   // calls answered Busy: queue full
  uint64_t backpressure_waits = 0;  // Reserve calls that waited for space
  uint64_t backpressure_busy = 0;   // items still Busy after waiting
  // Weights chunks a Reserve found on a tier below DRAM (not copied).
  uint64_t lower_tier_dedup_hits = 0;
  // Registered-pool transfers: segments and bytes by source tier.
  uint64_t load_segments_hbm = 0, load_bytes_hbm = 0;  // device pools only
  uint64_t load_segments_host = 0, load_bytes_host = 0;
  uint64_t load_segments_nvme = 0, load_bytes_nvme = 0;
  uint64_t load_misses = 0;
  uint64_t store_segments = 0, store_bytes = 0, store_dedup = 0;
  // Load, Store and weights Load calls accepted (loads + stores +
  // weights_loads).
  uint64_t transfers = 0;
  uint64_t loads = 0, stores = 0, weights_loads = 0;
  uint64_t prefetches = 0;  // Prefetch calls accepted
  // Transfers ordered after an engine's stream (LoadTicket::gate): waiting
  // for it now, ever waited, and given up on after device_copy_timeout.
  uint64_t stream_gate_waiting = 0, stream_gate_waits = 0,
           stream_gate_timeouts = 0;
  uint64_t topk_reports = 0;      // SelectionReport items received
  uint64_t registered_pools = 0;  // over every connection
  // Time from a Load / Store / weights Load being accepted until its last
  // layer was published (the client's WaitLayer for it can return), and
  // the summed nanoseconds of those samples.
  LatencyHistogram::Counts load_latency{}, store_latency{},
      weights_load_latency{};
  uint64_t load_latency_nanos = 0, store_latency_nanos = 0,
           weights_load_latency_nanos = 0;
};

}  // namespace tierkv::storage
