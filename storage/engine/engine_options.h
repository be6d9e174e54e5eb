// CacheEngineOptions and NamespaceOptions: what CacheEngine::Open is told,
// each field with its default and range (Validate() checks them).
#pragma once

#include <chrono>
#include <cstdint>

#include "storage/clock.h"
#include "storage/device/device_backend.h"
#include "storage/engine/write_policy.h"
#include "storage/host/host_tier.h"
#include "storage/lease/lease_table.h"
#include "storage/tier/placement.h"
#include "storage/tier/tier_mover.h"
#include "tierkv/status.h"

namespace tierkv::storage {

struct CacheEngineOptions {
  // Read and write leases end after this unless released. Default: 30 s.
  std::chrono::milliseconds lease_ttl{30000};
  // What one connection, and one namespace, may hold leased at once
  // (lease_table.h); requests beyond get ResourceExhausted per item.
  LeaseLimits lease_limits;
  // Longest pin a client may ask for. Default: 1 h.
  std::chrono::milliseconds max_pin_ttl{3600000};
  // Threads for calls that may wait for write-back room (a Put's Reserve
  // under backpressure, the lanes of Store) and that start a Get's
  // promotion. None waits for a lower tier's IO: reads complete on the
  // tiers' threads, and Flush runs on the mover's. Default: 4.
  uint32_t workers = 4;
  // Threads for the lanes of Load, apart from `workers`, so that Puts and
  // Stores stalled on write-back never hold a Load's layers back. Default: 4.
  uint32_t load_workers = 4;
  // Calls waiting for a worker (of each kind); further ones complete with
  // Busy. Default: 1024.
  uint32_t worker_queue = 1024;
  // How long a Put may wait for the write-back to free host space before
  // its segments are answered Busy. Default: 2 s.
  std::chrono::milliseconds write_back_wait{2000};
  // Workers that move the layers of one Load or Store concurrently (each
  // claims the next layer in order; completion is still published in layer
  // order). Two keep an NVMe queue full across layer boundaries and let a
  // host-tier copy of layer l+1 run while layer l's finishes. 1..64.
  // Default: 2.
  uint32_t transfer_lanes = 2;
  // Threads the NVMe tier reads on (NvmeTierOptions::readers), when Open
  // is handed an NvmeStore. 1..64. Default: 4.
  uint32_t nvme_readers = 4;
  // ReportTopk: an index_k segment gets its page's selection count times
  // this (every decode step scans all index keys of a full layer, while it
  // reads a latent row only when selected). Default: 4.
  double index_key_report_weight = 4.0;
  // Background demotion and prefetch (used only with tiers below DRAM).
  TierMoverOptions mover;
  // The order of the tiers below DRAM and where write-back goes
  // (placement.h). Default: the tiers as handed to Open.
  PlacementOptions placement;
  // The device backend engines' device pools are imported into
  // (RegisterDevicePool); borrowed, must outlive the engine. Default: none
  // (device pools are refused).
  DeviceBackend* device = nullptr;
  // The HBM tier (T0): this pool of `device` holds it (allocated once by
  // the caller). bytes 0: no HBM tier (device pools still work, served
  // from host DRAM and NVMe).
  DevicePool hbm_pool;
  // How long one unit of a transfer waits for its device copies.
  // Default: 30 s.
  std::chrono::milliseconds device_copy_timeout{30000};
  // Host memory pinned for `device` at start, lent as bounce buffers to
  // NVMe reads on their way into device pools (PinnedStaging); reads past
  // it use heap memory. 0: none. Default: 32 MiB (tierkvd: [hbm]
  // staging_bytes).
  uint64_t device_staging_bytes = uint64_t{32} << 20;
  // Source of time for lease expiry; borrowed. Default: the steady clock.
  const Clock* clock = SteadyClock::Default();

  Status Validate() const;
};

struct NamespaceOptions {
  HostTierOptions host;  // host.name is the namespace's name
  // Ignored (treated as kNone) without an NVMe tier. Default: write_back.
  WritePolicy write_policy = WritePolicy::kWriteBack;
  // Most of the HBM tier this namespace may hold; 0: all of it.
  uint64_t hbm_quota_bytes = 0;
  // A content-addressed namespace of model weight chunks
  // (include/tierkv/weights.h): no layout; a segment's key is
  // (WeightsChunkKey of its bytes, layer 0, part 0), its size 1 byte ..
  // kWeightsMaxChunkBytes, and Commit checks the bytes against the key.
  // Default: false.
  bool weights = false;
  // Weights namespaces: most bytes per second their prefetches
  // (PromoteInOrder: kWeightsPrefetch, hints, pins) promote; they go at
  // the mover's background IO class. 0: uncapped. Default: 0.
  uint64_t prefetch_bytes_per_second = 0;
};

}  // namespace tierkv::storage
