// Daemon: wires configuration, storage, transport and metrics into a
// running tierkvd (DESIGN.md §2: daemon/ is the only place that knows both
// storage/ and transport/).
//
// Start() builds every namespace's tiers, binds the socket and the metrics
// listener and starts the lease sweeper; Wait() blocks until SIGTERM/SIGINT
// or Shutdown(); destruction stops everything in reverse order.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "daemon/cache_service.h"
#include "daemon/cluster/cluster.h"
#include "daemon/config.h"
#include "daemon/layer_stall.h"
#include "daemon/metrics.h"
#include "daemon/namespace.h"
#include "storage/device/device_backend.h"
#include "storage/engine/cache_engine.h"
#include "storage/nvme/nvme_store.h"
#include "transport/uds_server.h"

namespace tierkv::daemon {

class Daemon {
 public:
  // REQUIRES: config.Validate() is OK and tokens are resolved.
  static Result<std::unique_ptr<Daemon>> Start(const DaemonConfig& config);
  ~Daemon();

  // Blocks until Shutdown() is called (from any thread or a signal handler
  // thread).
  void Wait();
  void Shutdown();

  int metrics_port() const { return metrics_.port(); }

 private:
  explicit Daemon(const DaemonConfig& config);
  void SweepLoop();

  Status OpenNvmeTier();
  Status OpenHbmTier();

  const DaemonConfig config_;
  DaemonMetrics metrics_;
  std::unique_ptr<storage::NvmeStore> nvme_;  // null without an NVMe tier
  // The HBM tier's device and its one pool (null without [hbm]).
  std::unique_ptr<storage::DeviceBackend> hbm_;
  storage::DevicePool hbm_pool_;
#ifdef TIERKV_SYNC_POINTS
  // TIERKV_TEST_STALL_LAYER (layer_stall.h); null when unset. Declared
  // before engine_, so it is disarmed after the engine's workers ended.
  std::unique_ptr<ArmedLayerStall> layer_stall_;
#endif
  // The node's part in a [cluster] (null without one). Declared before
  // engine_: the engine's peer tier uses its transport and directory.
  std::unique_ptr<cluster::Cluster> cluster_;
  std::unique_ptr<storage::CacheEngine> engine_;
  // One per weights namespace; they use engine_ and nvme_'s catalog, so
  // they end first (see ~Daemon).
  std::vector<std::unique_ptr<storage::WeightsCatalog>> weights_;
  std::vector<std::unique_ptr<Namespace>> namespaces_;
  std::unique_ptr<CacheService> service_;
  std::unique_ptr<transport::UdsServer> server_;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread sweeper_;
};

}  // namespace tierkv::daemon
