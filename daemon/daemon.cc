// Daemon: builds the engine, server and metrics from the config and tears
// them down in order (see daemon.h).
#include "daemon/daemon.h"

#include <grp.h>
#include <prometheus/gauge.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "daemon/build_info.h"
#include "storage/nvme/nvme_tier.h"

namespace tierkv::daemon {

Daemon::Daemon(const DaemonConfig& config) : config_(config) {}

namespace {

// CacheServiceOptions::on_stored: stored pages are the cluster's candidates
// to publish (none without a cluster).
std::function<void(const storage::EngineNamespace*, std::span<const PageHash>)>
StoredHook(cluster::Cluster* cluster) {
  if (cluster == nullptr) return nullptr;
  return [cluster](const storage::EngineNamespace* ns,
                   std::span<const PageHash> pages) {
    cluster->Stored(ns, pages);
  };
}

}  // namespace

Status Daemon::OpenNvmeTier() {
  const NvmeConfig& c = config_.nvme;
  storage::NvmeStoreOptions o;
  o.path = c.path;
  o.catalog_path = c.catalog_path;
  o.capacity_bytes = c.capacity_bytes;
  o.queue_depth = c.queue_depth;
  o.use_direct_io = c.direct_io;
  o.sync_catalog = c.sync;
  o.sync_data = c.sync;
  o.recreate_damaged_catalog = c.recreate_damaged_catalog;
  auto store = storage::NvmeStore::Open(o);
  if (!store.ok()) {
    return ConfigKeyError(
        "nvme.path",
        Status(store.status().code(),
               "NVMe tier at " + c.path + ": " +
                   std::string(store.status().message()) +
                   (store.status().code() == StatusCode::kCorruption
                        ? " (set nvme.recreate_damaged_catalog = true to "
                          "start empty)"
                        : "")));
  }
  nvme_ = std::move(store).value();
  const auto stats = nvme_->Stats();
  const auto& r = nvme_->recovery();
  spdlog::info(
      "NVMe tier {}: {:.1f} GiB, {}, {}; recovered {} segments ({} MiB), "
      "dropped {}{}",
      c.path, static_cast<double>(c.capacity_bytes) / (1u << 30),
      stats.direct_io ? "O_DIRECT" : "buffered IO",
      stats.io_uring ? "io_uring" : "pread/pwrite", r.recovered_segments,
      r.recovered_bytes >> 20, r.dropped_segments,
      r.catalog_recreated ? "; damaged catalog was recreated EMPTY" : "");
  return Status::OK();
}

Status Daemon::OpenHbmTier() {
  const HbmConfig& c = config_.hbm;
  auto kind = storage::ParseDeviceBackendKind(c.backend);
  if (!kind.ok()) return kind.status();
  std::string fell_back;
  auto backend = storage::DeviceBackend::Open(
      {.kind = *kind,
       .device = c.device,
       .device_uuid = c.device_uuid,
       .streams = c.streams,
       .emulated_capacity_bytes = c.capacity_bytes,
       .emulated_fault_after_copies = c.emulated_fault_after_copies},
      &fell_back);
  if (!backend.ok()) {
    // The device could not be opened, or (a build without CUDA) the backend.
    const bool no_cuda = *kind == storage::DeviceBackendKind::kCuda &&
                         !storage::DeviceBackend::CudaBuiltIn();
    return ConfigKeyError(
        no_cuda ? "hbm.backend" : "hbm.device",
        Status(backend.status().code(),
               "HBM tier: " + std::string(backend.status().message())));
  }
  hbm_ = std::move(backend).value();
  auto pool = hbm_->AllocatePool(c.capacity_bytes);  // once (cudaMalloc)
  if (!pool.ok()) {
    return ConfigKeyError(
        "hbm.capacity_bytes",
        Status(pool.status().code(),
               "HBM tier: " + std::string(pool.status().message())));
  }
  hbm_pool_ = *pool;
  if (c.emulated_fault_after_copies != 0) {
    spdlog::warn(
        "HBM tier: FAULT DRILL: the emulated device fails after {} copies "
        "(hbm.emulated_fault_after_copies)",
        c.emulated_fault_after_copies);
  }
  spdlog::info(
      "HBM tier: {} backend{}{}, a {} MiB pool on device {}, {} streams: "
      "it keeps copies of what engines' device pools load and store",
      hbm_->name(), fell_back.empty() ? "" : " - ", fell_back,
      c.capacity_bytes >> 20, c.device, c.streams);
  return Status::OK();
}

Result<std::unique_ptr<Daemon>> Daemon::Start(const DaemonConfig& config) {
  TIERKV_RETURN_IF_ERROR(config.Validate());
#ifdef TIERKV_SYNC_POINTS
  auto stall = LayerStallFromEnvironment();
  if (!stall.ok()) return stall.status();
#endif
  std::unique_ptr<Daemon> d(new Daemon(config));
  if (config.nvme.enabled()) TIERKV_RETURN_IF_ERROR(d->OpenNvmeTier());
  if (config.hbm.enabled()) TIERKV_RETURN_IF_ERROR(d->OpenHbmTier());
  std::vector<storage::NamespaceOptions> spaces;
  for (const auto& nc : config.namespaces) {
    // Weights chunks go to NVMe as soon as they are stored (write_through),
    // so a restart finds every sealed shard whole; KV pages only when DRAM
    // needs the room (write_back).
    const WritePolicy write_policy =
        nc.write_policy.value_or(!d->nvme_    ? WritePolicy::kNone
                                 : nc.weights ? WritePolicy::kWriteThrough
                                              : WritePolicy::kWriteBack);
    spaces.push_back(
        {.host = {.name = nc.name,
                  .capacity_bytes = nc.host_bytes,
                  .shards = nc.shards,
                  .alignment = nc.host_alignment,
                  .try_hugepages = nc.hugepages,
                  .prefault = nc.prefault,
                  .eviction_policy = nc.eviction_policy},
         .write_policy = write_policy,
         .hbm_quota_bytes = nc.hbm_bytes,
         .weights = nc.weights,
         .prefetch_bytes_per_second = nc.prefetch_bytes_per_second});
  }
  storage::CacheEngineOptions eo;
  eo.lease_ttl = std::chrono::milliseconds(config.lease_ttl_ms);
  eo.lease_limits = {
      .max_leases_per_owner = config.max_leases_per_connection,
      .max_segments_per_owner = config.max_leased_segments_per_connection,
      .max_segments_per_tier = config.max_leased_segments_per_namespace,
      .max_bytes_percent_per_owner =
          config.max_leased_bytes_percent_per_connection,
      .max_bytes_percent_per_tier =
          config.max_leased_bytes_percent_per_namespace};
  eo.max_pin_ttl = std::chrono::milliseconds(config.max_pin_ttl_ms);
  eo.workers = config.workers;
  eo.load_workers = config.load_workers;
  eo.worker_queue = config.worker_queue;
  eo.nvme_readers = config.nvme.readers;
  eo.mover.workers = config.nvme.mover_workers;
  eo.mover.prefetch_queue = config.nvme.prefetch_queue;
  eo.mover.sync_interval =
      std::chrono::milliseconds(config.nvme.sync_interval_ms);
  eo.device = d->hbm_.get();  // null without [hbm]: device pools refused
  eo.hbm_pool = d->hbm_pool_;
  eo.device_staging_bytes = config.hbm.staging_bytes;
  // The tiers below DRAM in read order: this node's NVMe, then its peers.
  std::vector<std::unique_ptr<storage::Tier>> below;
  if (d->nvme_) {
    below.push_back(std::make_unique<storage::NvmeTier>(
        d->nvme_.get(), storage::NvmeTierOptions{.readers = eo.nvme_readers}));
  }
  if (config.cluster) {
    auto cluster = cluster::Cluster::Open(*config.cluster, config.namespaces);
    if (!cluster.ok()) return cluster.status();
    d->cluster_ = std::move(cluster).value();
    below.push_back(d->cluster_->TakeTier());
  }
  auto engine = storage::CacheEngine::Open(eo, std::move(spaces),
                                           std::move(below), d->nvme_.get());
  if (!engine.ok()) return engine.status();
  d->engine_ = std::move(engine).value();
  if (d->cluster_) d->cluster_->Start(d->engine_.get());
#ifdef TIERKV_SYNC_POINTS
  // Test-only fault injection, armed before any transfer can start.
  if (*stall) d->layer_stall_ = std::make_unique<ArmedLayerStall>(**stall);
#endif
  for (const NamespaceConfig& nc : config.namespaces) {
    if (nc.nvme_bytes == 0 || !d->nvme_) continue;
    // A weights namespace's share evicts by its schedule when its DRAM
    // does (the `weights` policy), else as every share does.
    Status s = d->nvme_->SetNamespaceQuota(
        nc.name, nc.nvme_bytes,
        nc.eviction_policy == storage::EvictionPolicyKind::kWeights
            ? storage::EvictionPolicyKind::kWeights
            : storage::NvmeStore::kPolicy);
    if (s.code() == StatusCode::kInvalidArgument) return s;
    if (!s.ok()) {
      // A read-only catalog cannot register a new namespace; it shares the
      // rest until a restart with free space (its writes are refused now).
      spdlog::warn("namespace '{}': NVMe reservation not applied: {}", nc.name,
                   s.ToString());
    } else {
      spdlog::info("namespace '{}': {} MiB of NVMe reserved", nc.name,
                   nc.nvme_bytes >> 20);
    }
  }
  for (size_t i = 0; i < config.namespaces.size(); ++i) {
    const NamespaceConfig& nc = config.namespaces[i];
    auto ns = std::make_unique<Namespace>();
    ns->token = nc.token;
    ns->max_connections =
        nc.max_connections > 0 ? nc.max_connections : config.max_connections;
    ns->engine = d->engine_->namespaces()[i].get();
    ns->metrics = d->metrics_.AddNamespace(nc.name);
    if (nc.weights) {
      auto weights = storage::WeightsCatalog::Open(
          // A manifest must fit the reply that carries it back, within the
          // frames this daemon and its clients (16 MiB) accept.
          {.max_manifest_bytes = std::min<uint64_t>(
               config.max_frame_bytes - 4096, kWeightsMaxManifestBytes),
           .prefetch_horizon =
               std::chrono::milliseconds(nc.prefetch_horizon_ms),
           // Pinned chunks are held back on the NVMe share too: they must
           // not fill it either.
           .max_pinned_bytes = nc.nvme_bytes > 0 && d->nvme_
                                   ? std::min(nc.host_bytes, nc.nvme_bytes) / 2
                                   : 0},
          d->engine_.get(), ns->engine,
          d->nvme_ ? &d->nvme_->catalog() : nullptr);
      if (!weights.ok()) {
        return ConfigKeyError(
            fmt::format("namespace.weights (namespace '{}')", nc.name),
            weights.status());
      }
      ns->weights = weights->get();
      d->weights_.push_back(std::move(weights).value());
    }
    spdlog::info(
        "namespace '{}': host tier {} MiB in {} shards ({} pages), write "
        "policy {}",
        nc.name, nc.host_bytes >> 20, nc.shards,
        ns->engine->host().Stats().hugepages ? "2 MiB huge" : "4 KiB",
        storage::WritePolicyName(ns->engine->write_policy()));
    d->namespaces_.push_back(std::move(ns));
  }
  d->service_ = std::make_unique<CacheService>(
      CacheServiceOptions{.version_info = kTierkvdVersion,
                          .auth_failure_delay = std::chrono::milliseconds(
                              config.auth_failure_delay_ms),
                          .lease_refusal_delay = std::chrono::milliseconds(
                              config.lease_refusal_delay_ms),
                          .on_stored = StoredHook(d->cluster_.get())},
      d->engine_.get(), &d->namespaces_, &d->metrics_);
  d->metrics_.AddTiers(d->engine_.get());
  if (d->nvme_) {
    d->metrics_.AddNvmeTier(d->nvme_.get(), d->engine_->mover());
  }
  d->metrics_.AddEngine(d->engine_.get());
  if (!d->weights_.empty()) {
    std::vector<std::pair<std::string, const storage::WeightsCatalog*>> w;
    for (const auto& ns : d->namespaces_) {
      if (ns->weights != nullptr) w.emplace_back(ns->name(), ns->weights);
    }
    d->metrics_.AddWeights(std::move(w));
  }
  if (d->cluster_) {
    d->metrics_.AddCluster(&d->cluster_->directory(),
                           &d->cluster_->transport());
  }
  if (!config.metrics_listen.empty()) {
    const std::string& listen = config.metrics_listen;
    const std::string host = listen.substr(0, listen.rfind(':'));
    if (host != "127.0.0.1" && host != "localhost" && host != "[::1]") {
      spdlog::warn(
          "metrics listen on {} is reachable from other hosts: /metrics has "
          "no authentication and names every namespace (use 127.0.0.1 and a "
          "local Prometheus, or a firewall)",
          listen);
    }
    TIERKV_RETURN_IF_ERROR(ConfigKeyError(
        "metrics.listen", d->metrics_.Serve(config.metrics_listen)));
    // The bound address (a configured port 0 picked one).
    const std::string bound = fmt::format("{}:{}", host, d->metrics_.port());
    spdlog::info("metrics on http://{0}/metrics, status page on http://{0}/",
                 bound);
  }
  auto server = transport::UdsServer::Start(
      {.path = config.socket_path,
       .mode = config.socket_mode,
       .group = config.socket_group,
       .max_payload_bytes = config.max_frame_bytes,
       .io_threads = config.io_threads,
       .max_connections = config.max_connections,
       .max_unauthenticated_connections =
           config.max_unauthenticated_connections,
       .handshake_timeout =
           std::chrono::milliseconds(config.handshake_timeout_ms),
       .idle_timeout = std::chrono::milliseconds(config.idle_timeout_ms),
       .max_in_flight_bytes = config.max_in_flight_bytes,
       .stall_timeout = std::chrono::milliseconds(config.stall_timeout_ms),
       .poll_after_work = std::chrono::microseconds(config.poll_us),
       .poll_for_followup = std::chrono::microseconds(config.poll_followup_us)},
      d->service_.get());
  if (!server.ok()) {
    // The server names the path or group it could not use; this names the
    // key.
    const bool unknown_group =
        !config.socket_group.empty() &&
        ::getgrnam(config.socket_group.c_str()) == nullptr;
    return ConfigKeyError(
        unknown_group ? "server.socket_group" : "server.socket",
        server.status());
  }
  d->server_ = std::move(server).value();
  d->sweeper_ = std::thread([raw = d.get()] { raw->SweepLoop(); });
  spdlog::info("tierkvd serving on {} (mode {:o})", config.socket_path,
               config.socket_mode);
  if (!config.ready_file.empty()) {
    nlohmann::json ready = {{"pid", ::getpid()},
                            {"socket", config.socket_path},
                            {"metrics_port", d->metrics_.port()}};
    std::string tmp = config.ready_file + ".tmp";
    std::ofstream(tmp) << ready.dump() << "\n";
    std::rename(tmp.c_str(), config.ready_file.c_str());
  }
  return d;
}

Daemon::~Daemon() {
  Shutdown();
  metrics_.StopServing();  // no scrape may see the tiers being torn down
  if (sweeper_.joinable()) sweeper_.join();
  // Stop the IO threads first, then the engine: its workers may still
  // deliver replies, which the stopped server's queues absorb. The server
  // object itself outlives the engine for that reason.
  if (server_) server_->Stop();
  // Peers are refused from now on, and nothing publishes any more.
  if (cluster_) cluster_->Stop();
  if (engine_ && nvme_ && config_.nvme.shutdown_persist_ms > 0) {
    // No client can write any more: what DRAM holds goes to NVMe, so the
    // next start serves it (a SIGKILL skips this; demotions so far stay).
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t n = engine_->PersistDirty(
        std::chrono::milliseconds(config_.nvme.shutdown_persist_ms));
    uint64_t left = 0;
    for (auto& ns : namespaces_) {
      if (ns->engine->write_policy() != storage::WritePolicy::kNone) {
        left += ns->engine->host().Stats().dirty_segments;
      }
    }
    spdlog::info(
        "shutdown: wrote {} dirty segments to NVMe in {:.2f} s ({} left in "
        "DRAM only)",
        n,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count(),
        left);
  }
  weights_.clear();  // before the engine and the NVMe catalog they use
  engine_.reset();   // runs queued calls, joins the mover, ends leases
  cluster_.reset();  // closes the transport, deregisters the node
  service_.reset();
  server_.reset();
  namespaces_.clear();
  nvme_.reset();  // last: the catalog closes cleanly
}

void Daemon::Wait() {
  MutexLock lock(&mu_);
  while (!stopping_) cv_.Wait(&mu_);
}

void Daemon::Shutdown() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
}

void Daemon::SweepLoop() {
  const auto period = std::chrono::milliseconds(config_.sweep_interval_ms);
  MutexLock lock(&mu_);
  while (!stopping_) {
    const auto next = std::chrono::steady_clock::now() + period;
    while (!stopping_ && cv_.WaitUntil(&mu_, next)) {
    }
    if (stopping_) break;
    lock.Unlock();
    if (size_t n = engine_->ExpireLeases()) {
      spdlog::info("expired {} leases of unresponsive clients", n);
    }
    // Pins past their ttl end; hinted shards near their use prefetch.
    for (const auto& weights : weights_) weights->Tick();
    metrics_.active_leases().Set(static_cast<double>(engine_->active_leases()));
    lock.Lock();
  }
}

}  // namespace tierkv::daemon
