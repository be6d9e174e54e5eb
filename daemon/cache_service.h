// CacheService: the daemon's request handler. Decodes each request, checks
// that the connection has opened a namespace with the right token, runs the
// operation on that namespace's tiers and encodes one result per item.
//
// Every lease a connection takes is recorded with the connection as owner,
// so a disconnect releases its reads and pins and aborts its unfinished
// puts. Nothing a client sends can reach another namespace: the namespace is
// fixed per connection at OpenNamespace.
//
// Thread safety: thread-safe (one call at a time per connection, many
// connections in parallel).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "daemon/metrics.h"
#include "daemon/namespace.h"
#include "storage/lease_table.h"
#include "transport/protocol.h"
#include "transport/uds_server.h"

namespace tierkv::daemon {

struct CacheServiceOptions {
  std::chrono::milliseconds lease_ttl{30000};
  std::chrono::milliseconds max_pin_ttl{3600000};
  std::string version_info;  // returned by Ping
};

// The NVMe tier and its mover, shared by all namespaces; both null when the
// daemon runs without an NVMe tier.
struct NvmeTier {
  storage::NvmeStore* store = nullptr;
  storage::TierMover* mover = nullptr;
};

class CacheService final : public transport::FrameHandler {
 public:
  // `namespaces`, `leases` and `metrics` are borrowed and outlive the service.
  CacheService(const CacheServiceOptions& options,
               const std::vector<std::unique_ptr<Namespace>>* namespaces,
               storage::LeaseTable* leases, DaemonMetrics* metrics,
               NvmeTier nvme = {});

  void OnConnect(uint64_t connection_id) override;
  transport::HandlerReply OnFrame(uint64_t connection_id, uint16_t opcode,
                                  std::span<const std::byte> payload) override;
  void OnDisconnect(uint64_t connection_id) override;

 private:
  using Reply = transport::HandlerReply;

  Namespace* OpenedNamespace(uint64_t connection_id);
  Reply Ping();
  Reply OpenNamespace(uint64_t conn, std::span<const std::byte> in);
  Reply RegisterLayout(Namespace& ns, std::span<const std::byte> in);
  Reply Match(Namespace& ns, std::span<const std::byte> in);
  Reply PutReserve(uint64_t conn, Namespace& ns, std::span<const std::byte> in);
  Reply PutCommit(uint64_t conn, Namespace& ns, std::span<const std::byte> in);
  Reply Get(uint64_t conn, Namespace& ns, std::span<const std::byte> in);
  Reply Release(uint64_t conn, std::span<const std::byte> in);
  Reply Pin(uint64_t conn, Namespace& ns, std::span<const std::byte> in);
  Reply Stats(Namespace& ns);
  Reply List(Namespace& ns, std::span<const std::byte> in);
  Reply Flush(Namespace& ns, std::span<const std::byte> in);
  Reply Error(const Status& s);

  const CacheServiceOptions options_;
  const std::vector<std::unique_ptr<Namespace>>* namespaces_;
  storage::LeaseTable* leases_;
  DaemonMetrics* metrics_;
  const NvmeTier nvme_;
  const std::chrono::steady_clock::time_point started_;

  std::mutex mu_;
  std::unordered_map<uint64_t, Namespace*> opened_;  // guarded by mu_
};

}  // namespace tierkv::daemon
