#include "daemon/daemon.h"

#include <prometheus/gauge.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fstream>

#include <nlohmann/json.hpp>

namespace tierkv::daemon {

Daemon::Daemon(const DaemonConfig& config) : config_(config) {}

Result<std::unique_ptr<Daemon>> Daemon::Start(const DaemonConfig& config) {
  TIERKV_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<Daemon> d(new Daemon(config));
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
      return Status(host.status().code(), "namespace '" + nc.name + "': " +
                                              std::string(host.status().message()));
    }
    ns->host = std::move(host).value();
    ns->metrics = d->metrics_.AddNamespace(nc.name);
    spdlog::info("namespace '{}': host tier {} MiB in {} shards ({} pages)",
                 nc.name, nc.host_bytes >> 20, nc.shards,
                 ns->host->Stats().hugepages ? "2 MiB huge" : "4 KiB");
    d->namespaces_.push_back(std::move(ns));
  }
  d->leases_ = std::make_unique<storage::LeaseTable>(storage::SteadyClock::Default());
  d->service_ = std::make_unique<CacheService>(
      CacheServiceOptions{
          .lease_ttl = std::chrono::milliseconds(config.lease_ttl_ms),
          .max_pin_ttl = std::chrono::milliseconds(config.max_pin_ttl_ms),
          .version_info = "tierkvd 0.1.0"},
      &d->namespaces_, d->leases_.get(), &d->metrics_);
  if (!config.metrics_listen.empty()) {
    TIERKV_RETURN_IF_ERROR(d->metrics_.Serve(config.metrics_listen));
    spdlog::info("metrics on http://{}/metrics (port {})", config.metrics_listen,
                 d->metrics_.port());
  }
  auto server = transport::UdsServer::Start(
      {.path = config.socket_path,
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
  if (sweeper_.joinable()) sweeper_.join();
  if (server_) server_->Stop();  // before the service and tiers it uses
  server_.reset();
  service_.reset();
  leases_.reset();  // releases leases while the tiers still exist
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
    for (auto& ns : namespaces_) metrics_.Refresh(*ns->metrics, ns->host->Stats());
    lock.lock();
  }
}

}  // namespace tierkv::daemon
