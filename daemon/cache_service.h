// CacheService: the daemon's request handler. Decodes each request, checks
// that the connection has opened a namespace with the right token, calls
// the storage engine and encodes one result per item. It decides nothing
// about tiers: matching, leases, promotion and persistence are the engine's
// (storage/engine/cache_engine.h). Calls that wait for NVMe answer from the
// engine's workers, never on a socket IO thread.
//
// Every lease a connection takes is owned by its connection id, so a
// disconnect releases its reads and pins and aborts its unfinished puts.
// Nothing a client sends can reach another namespace: the namespace is fixed
// per connection at OpenNamespace.
//
// Thread safety: thread-safe (one call at a time per connection, many
// connections in parallel).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "daemon/auth_throttle.h"
#include "daemon/metrics.h"
#include "daemon/namespace.h"
#include "storage/engine/cache_engine.h"
#include "transport/protocol.h"
#include "transport/uds_server.h"

namespace tierkv::daemon {

struct CacheServiceOptions {
  std::string version_info;  // returned by Ping
  // A refused OpenNamespace (unknown namespace or wrong token) is answered
  // this late, then the connection is closed (AuthThrottle). Default: 200 ms.
  std::chrono::milliseconds auth_failure_delay{200};
  // A Get whose every segment was refused for a lease limit
  // (ResourceExhausted) is answered this late, so a client that keeps
  // asking past its limits waits instead of spinning the daemon's IO
  // threads. Default: 10 ms.
  std::chrono::milliseconds lease_refusal_delay{10};
  // Told the pages of every Put commit and Store (the cluster's publisher:
  // candidates to announce to peers). Must not block. Default: none.
  std::function<void(const storage::EngineNamespace*,
                     std::span<const PageHash>)>
      on_stored;
};

class CacheService final : public transport::FrameHandler {
 public:
  // `engine`, `namespaces` and `metrics` are borrowed and outlive the
  // service.
  CacheService(const CacheServiceOptions& options, storage::CacheEngine* engine,
               const std::vector<std::unique_ptr<Namespace>>* namespaces,
               DaemonMetrics* metrics);

  void OnConnect(uint64_t connection_id) override;
  void OnFrame(uint64_t connection_id, uint16_t opcode,
               std::span<const std::byte> payload, int fd,
               transport::Responder responder) override;
  void OnDisconnect(uint64_t connection_id) override;

 private:
  using Reply = transport::HandlerReply;
  using In = std::span<const std::byte>;

  Namespace* OpenedNamespace(uint64_t connection_id) EXCLUDES(mu_);
  // The requests answered at once.
  Reply Ping();
  // Answers at once, or late for a refusal (throttle_).
  void OpenNamespace(uint64_t conn, In in, transport::Responder responder)
      EXCLUDES(mu_);
  // The refusal's log line, at most one per second (with a count of the
  // ones not logged).
  void LogRefusal(uint64_t conn, const std::string& name);
  Reply RegisterLayout(Namespace& ns, In in);
  Reply Match(uint64_t conn, Namespace& ns, In in);
  // Answers at once, or from a worker in a weights namespace (its chunks
  // are hashed first: CacheEngine::CommitAsync).
  void PutCommit(uint64_t conn, Namespace& ns, In in,
                 transport::Responder responder);
  Reply Release(uint64_t conn, In in);
  Reply Pin(uint64_t conn, Namespace& ns, In in);
  Reply Stats(Namespace& ns);
  Reply List(Namespace& ns, In in);
  Reply RegisterPool(uint64_t conn, Namespace& ns, In in, int fd);
  Reply RegisterTickets(uint64_t conn, In in, int fd);
  Reply Transfer(uint64_t conn, Namespace& ns, transport::Opcode op, In in);
  Reply Prefetch(Namespace& ns, In in);
  Reply ReportTopk(Namespace& ns, In in);
  // kWeights* (weights_requests.cc): InvalidArgument unless `ns` is a
  // weights namespace. A Seal answers once its chunks are durable (from
  // the mover's thread), the others at once.
  void WeightsSeal(Namespace& ns, In in, transport::Responder responder);
  Reply WeightsManifest(Namespace& ns, In in);
  Reply WeightsList(Namespace& ns, In in);
  Reply WeightsDrop(Namespace& ns, In in);
  Reply WeightsPrefetch(Namespace& ns, In in);
  Reply WeightsHint(Namespace& ns, In in);
  Reply WeightsPin(Namespace& ns, In in);
  // kWeightsLoad: the sealed shard's layers into the connection's image
  // pool (CacheEngine::LoadWeights).
  Reply WeightsLoadToPool(uint64_t conn, Namespace& ns, In in);
  // kWeightsStage: chunks out of the connection's image pool
  // (CacheEngine::StageWeights); answered from a worker.
  void WeightsStage(uint64_t conn, Namespace& ns, In in,
                    transport::Responder responder);
  // The requests that may wait for NVMe: answered through `responder`.
  void PutReserve(uint64_t conn, Namespace& ns, In in,
                  transport::Responder responder);
  void Get(uint64_t conn, Namespace& ns, In in, transport::Responder responder);
  void Flush(Namespace& ns, In in, transport::Responder responder);
  Reply Error(const Status& s);
  void UpdateLeaseGauge();
  // Merges a client's piggybacked WaitLayer report (if any) into the
  // namespace's tierkv_layer_wait_seconds.
  void RecordWaits(Namespace& ns,
                   const std::optional<transport::WaitReport>& waits);

  const CacheServiceOptions options_;
  storage::CacheEngine* const engine_;
  const std::vector<std::unique_ptr<Namespace>>* namespaces_;
  DaemonMetrics* metrics_;
  const std::chrono::steady_clock::time_point started_;
  std::atomic<int64_t> last_refusal_log_s_{-1};  // seconds since started_
  std::atomic<uint64_t> refusals_unlogged_{0};
  AuthThrottle throttle_;
  AuthThrottle lease_throttle_;  // Gets refused for a lease limit

  Mutex mu_;
  std::unordered_map<uint64_t, Namespace*> opened_ GUARDED_BY(mu_);
  // Connections per namespace in opened_ (Namespace::max_connections).
  std::unordered_map<const Namespace*, uint32_t> open_connections_
      GUARDED_BY(mu_);
};

}  // namespace tierkv::daemon
