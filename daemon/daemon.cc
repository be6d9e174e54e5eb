#include "daemon/daemon.h"

#include <prometheus/gauge.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace tierkv::daemon {

Daemon::Daemon(const DaemonConfig& config) : config_(config) {}

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
    return Status(
        store.status().code(),
        "NVMe tier at " + c.path + ": " +
            std::string(store.status().message()) +
            (store.status().code() == StatusCode::kCorruption
                 ? " (set nvme.recreate_damaged_catalog = true to start empty)"
                 : ""));
  }
  nvme_ = std::move(store).value();
  const auto stats = nvme_->Stats();
  const auto& r = nvme_->recovery();
  spdlog::info(
      "NVMe tier {}: {} GiB, {}, {}; recovered {} segments ({} MiB), dropped "
      "{}{}",
      c.path, c.capacity_bytes >> 30,
      stats.direct_io ? "O_DIRECT" : "buffered IO",
      stats.io_uring ? "io_uring" : "pread/pwrite", r.recovered_segments,
      r.recovered_bytes >> 20, r.dropped_segments,
      r.catalog_recreated ? "; damaged catalog was recreated EMPTY" : "");
  mover_ = std::make_unique<storage::TierMover>(
      storage::TierMoverOptions{.workers = c.mover_workers,
                                .demotion_queue = c.demotion_queue,
                                .promotion_queue = c.promotion_queue});
  return Status::OK();
}

Result<std::unique_ptr<Daemon>> Daemon::Start(const DaemonConfig& config) {
  TIERKV_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<Daemon> d(new Daemon(config));
  if (config.nvme.enabled()) TIERKV_RETURN_IF_ERROR(d->OpenNvmeTier());
  for (const auto& nc : config.namespaces) {
    auto ns = std::make_unique<Namespace>();
    ns->name = nc.name;
    ns->token = nc.token;
    auto host = storage::HostTier::Create({.name = nc.name,
                                           .capacity_bytes = nc.host_bytes,
                                           .shards = nc.shards,
                                           .try_hugepages = nc.hugepages,
                                           .prefault = nc.prefault});
    if (!host.ok()) {
      return Status(host.status().code(),
                    "namespace '" + nc.name +
                        "': " + std::string(host.status().message()));
    }
    ns->host = std::move(host).value();
    ns->metrics = d->metrics_.AddNamespace(nc.name);
    ns->nvme = d->nvme_.get();
    ns->write_policy = nc.write_policy.value_or(
        d->nvme_ ? WritePolicy::kWriteBack : WritePolicy::kNone);
    if (ns->write_policy == WritePolicy::kWriteBack) {
      ns->host->SetEvictionListener(
          [mover = d->mover_.get(), raw = ns.get()](
              const SegmentKey& key, std::span<const std::byte> bytes) {
            mover->EnqueueEvicted(raw->tiers(), raw->fingerprint(), key, bytes);
          });
    }
    spdlog::info(
        "namespace '{}': host tier {} MiB in {} shards ({} pages), write "
        "policy {}",
        nc.name, nc.host_bytes >> 20, nc.shards,
        ns->host->Stats().hugepages ? "2 MiB huge" : "4 KiB",
        WritePolicyName(ns->write_policy));
    d->namespaces_.push_back(std::move(ns));
  }
  d->leases_ =
      std::make_unique<storage::LeaseTable>(storage::SteadyClock::Default());
  d->service_ = std::make_unique<CacheService>(
      CacheServiceOptions{
          .lease_ttl = std::chrono::milliseconds(config.lease_ttl_ms),
          .max_pin_ttl = std::chrono::milliseconds(config.max_pin_ttl_ms),
          .version_info = "tierkvd 0.1.0"},
      &d->namespaces_, d->leases_.get(), &d->metrics_,
      NvmeTier{d->nvme_.get(), d->mover_.get()});
  if (d->nvme_) d->metrics_.AddNvmeTier(d->nvme_.get(), d->mover_.get());
  if (!config.metrics_listen.empty()) {
    TIERKV_RETURN_IF_ERROR(d->metrics_.Serve(config.metrics_listen));
    spdlog::info("metrics on http://{}/metrics (port {})",
                 config.metrics_listen, d->metrics_.port());
  }
  auto server =
      transport::UdsServer::Start({.path = config.socket_path,
                                   .mode = config.socket_mode,
                                   .group = config.socket_group,
                                   .max_payload_bytes = config.max_frame_bytes,
                                   .io_threads = config.io_threads},
                                  d->service_.get());
  if (!server.ok()) return server.status();
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
  if (server_) server_->Stop();  // before the service and tiers it uses
  server_.reset();
  service_.reset();
  mover_.reset();   // joins workers that may still touch the tiers
  leases_.reset();  // releases leases while the tiers still exist
  namespaces_.clear();
  nvme_.reset();  // last: the catalog closes cleanly
}

void Daemon::Wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return stopping_; });
}

void Daemon::Shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

void Daemon::SweepLoop() {
  const auto period = std::chrono::milliseconds(config_.sweep_interval_ms);
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, period, [this] { return stopping_; });
    lock.unlock();
    if (size_t n = leases_->ExpireDue()) {
      spdlog::info("expired {} leases of unresponsive clients", n);
    }
    metrics_.active_leases().Set(static_cast<double>(leases_->size()));
    for (auto& ns : namespaces_)
      metrics_.Refresh(*ns->metrics, ns->host->Stats());
    lock.lock();
  }
}

}  // namespace tierkv::daemon
