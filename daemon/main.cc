// tierkvd: the tierkv daemon. See README.md "Configuration" and "CLI".
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "common/byte_size.h"
#include "daemon/build_info.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/host_memory.h"

namespace {

int Fail(const tierkv::Status& s) {
  std::fprintf(stderr, "tierkvd: %s\n", s.ToString().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tierkv::daemon;
  CLI::App app{"tierkvd: hierarchical KV-cache storage daemon"};
  app.set_version_flag(
      "--version", std::string(kTierkvdVersion) + "\n" + kSyncPointsBuildInfo);
  std::string config_path, socket, metrics, log_level, host_bytes, ready_file;
  std::string nvme_path, nvme_bytes, write_policy;
  uint32_t lease_ttl_ms = 0, io_threads = 0, shards = 0;
  bool print_config = false;
  app.add_option("-c,--config", config_path,
                 "TOML config file (else embedded defaults)");
  app.add_option("--socket", socket,
                 "Unix socket path (overrides [server].socket)");
  app.add_option(
      "--metrics", metrics,
      "Prometheus listen address, e.g. 127.0.0.1:9400; 'off' disables");
  app.add_option("--host-bytes", host_bytes,
                 "DRAM per namespace, e.g. 4GiB (overrides every namespace)");
  app.add_option("--shards", shards, "index/LRU shards per namespace");
  app.add_option("--nvme-path", nvme_path,
                 "NVMe tier data file or block device (enables the tier)");
  app.add_option("--nvme-bytes", nvme_bytes, "NVMe tier capacity, e.g. 64GiB");
  app.add_option("--write-policy", write_policy,
                 "write_back|write_through|none for every namespace");
  app.add_option("--lease-ttl-ms", lease_ttl_ms, "read/write lease TTL");
  app.add_option("--io-threads", io_threads, "socket server threads");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  app.add_option("--ready-file", ready_file,
                 "write {pid, socket, metrics_port} JSON here once serving");
  app.add_flag("--check-config", print_config,
               "validate the configuration, print it and exit");
  CLI11_PARSE(app, argc, argv);

  DaemonConfig config = EmbeddedDefaults();
  if (!config_path.empty()) {
    auto loaded = LoadConfigFile(config_path, config);
    if (!loaded.ok()) return Fail(loaded.status());
    config = std::move(loaded).value();
  }
  if (!socket.empty()) {
    config.socket_path = socket;
    // Embedded default token files live beside the socket.
    if (config_path.empty()) {
      for (auto& ns : config.namespaces) {
        ns.token_file =
            (std::filesystem::path(socket).parent_path() / (ns.name + ".token"))
                .string();
      }
    }
  }
  if (!metrics.empty()) config.metrics_listen = metrics == "off" ? "" : metrics;
  if (!host_bytes.empty()) {
    auto bytes = tierkv::ParseByteSize(host_bytes);
    if (!bytes.ok())
      return Fail(tierkv::Status::InvalidArgument(
          "--host-bytes: " + std::string(bytes.status().message())));
    for (auto& ns : config.namespaces) ns.host_bytes = *bytes;
  }
  if (shards)
    for (auto& ns : config.namespaces) ns.shards = shards;
  if (!nvme_path.empty()) config.nvme.path = nvme_path;
  if (!nvme_bytes.empty()) {
    auto bytes = tierkv::ParseByteSize(nvme_bytes);
    if (!bytes.ok())
      return Fail(tierkv::Status::InvalidArgument(
          "--nvme-bytes: " + std::string(bytes.status().message())));
    config.nvme.capacity_bytes = *bytes;
  }
  if (!write_policy.empty()) {
    auto policy = ParseWritePolicy(write_policy);
    if (!policy.ok()) {
      return Fail(tierkv::Status::InvalidArgument(
          "--write-policy: " + std::string(policy.status().message())));
    }
    for (auto& ns : config.namespaces) ns.write_policy = *policy;
  }
  if (lease_ttl_ms) config.lease_ttl_ms = lease_ttl_ms;
  if (io_threads) config.io_threads = io_threads;
  if (!log_level.empty()) config.log_level = log_level;
  if (!ready_file.empty()) config.ready_file = ready_file;

  if (auto s = config.Validate(); !s.ok()) return Fail(s);
  if (print_config) {
    std::printf(
        "socket = %s (mode %o)\nmetrics = %s\nlease_ttl_ms = %u\nnvme = %s\n",
        config.socket_path.c_str(), config.socket_mode,
        config.metrics_listen.empty() ? "off" : config.metrics_listen.c_str(),
        config.lease_ttl_ms,
        config.nvme.enabled() ? config.nvme.path.c_str() : "off");
    for (const auto& ns : config.namespaces) {
      std::printf("namespace %s: host_bytes=%llu shards=%u token=%s\n",
                  ns.name.c_str(),
                  static_cast<unsigned long long>(ns.host_bytes), ns.shards,
                  ns.token_file.empty() ? "(inline)" : ns.token_file.c_str());
    }
    return 0;
  }
  if (auto s = CheckHostBytes(config, ReadHostMemory()); !s.ok()) {
    return Fail(s);
  }
  if (auto s = ResolveTokens(config); !s.ok()) return Fail(s);
  spdlog::set_level(spdlog::level::from_str(config.log_level));

  // Signals are taken synchronously by one thread, never by handlers.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  auto daemon = Daemon::Start(config);
  if (!daemon.ok()) return Fail(daemon.status());
  std::thread signal_waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("received signal {}; shutting down", sig);
    (*daemon)->Shutdown();
  });
  (*daemon)->Wait();
  // Wake the signal thread if Shutdown came from elsewhere.
  pthread_kill(signal_waiter.native_handle(), SIGTERM);
  signal_waiter.join();
  daemon->reset();
  spdlog::info("tierkvd stopped");
  return 0;
}
