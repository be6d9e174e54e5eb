// Cluster: one node's part in a tierkv cluster (scaleout.md §8): the
// directory on Redis, the UCX peer transport, and over them the peer tier
// (this node fetching), the peer server (peers fetching from it) and the
// page publisher (what it tells the directory it holds).
//
// Lifecycle, driven by the Daemon:
//   Open       reads the secret, starts the transport (its listener) and the
//              directory (registering the node at the listener's address),
//              and makes the peer tier;
//   TakeTier   hands the peer tier to the engine (a tier below DRAM);
//   Start      once the engine exists: serves peers, publishes pages;
//   Stop       before the engine goes: no peer request or publisher call
//              reaches it afterwards, and the transport is shut (UCX holds
//              no span of the engine's memory; fetches fail at once).
// Destruction (after the engine's) closes the directory, deregistering the
// node, and the transport.
//
// Thread safety: Stored and LayoutOf may be called from any thread; the
// lifecycle calls from one.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "daemon/cluster/page_publisher.h"
#include "daemon/cluster/peer_serve_stall.h"
#include "daemon/cluster/peer_server.h"
#include "daemon/cluster/peer_tier.h"
#include "daemon/config.h"
#include "storage/engine/cache_engine.h"
#include "transport/directory/directory.h"
#include "transport/peer/peer_transport.h"

namespace tierkv::daemon::cluster {

class Cluster final : public LayoutSource {
 public:
  // Errors name the config key: cluster.secret_file (missing, too short,
  // readable by others), cluster.peer_listen (UCX cannot listen there),
  // cluster.directory (bad URL, refused credentials).
  static Result<std::unique_ptr<Cluster>> Open(
      const ClusterConfig& config,
      const std::vector<NamespaceConfig>& namespaces);
  ~Cluster() override;

  // The peer tier, once (null afterwards).
  std::unique_ptr<storage::Tier> TakeTier();

  // REQUIRES: called once, after the engine opened with TakeTier()'s tier.
  // `engine` is borrowed until Stop().
  void Start(storage::CacheEngine* engine) EXCLUDES(mu_);
  // Idempotent.
  void Stop() EXCLUDES(mu_);

  // Pages of `ns` a client stored (Put, Store): candidates to publish.
  void Stored(const storage::EngineNamespace* ns,
              std::span<const PageHash> pages) EXCLUDES(mu_);

  std::shared_ptr<const LayoutSpec> LayoutOf(uint32_t ns_id) const override;

  const transport::Directory& directory() const { return *directory_; }
  const transport::peer::PeerTransport& transport() const {
    return *transport_;
  }
  // The peer server's counters (zero before Start).
  PeerServerCounters server_counters() const EXCLUDES(mu_);
  PagePublisherStats publisher_stats() const EXCLUDES(mu_);

 private:
  // What the directory's re-publish callback reaches: the publisher while
  // one runs (the callback holds `mu` while it writes, so Stop waits for
  // it).
  struct RepublishTarget {
    Mutex mu;
    PagePublisher* publisher GUARDED_BY(mu) = nullptr;
  };

  Cluster() = default;
  // The peer tier's FetchedListener: fetched pages are publish candidates.
  void Fetched(uint32_t ns_id, std::span<const PageHash> pages);
  // The transport's RequestHandler: Serve, behind the test-only
  // PeerServeStall when TIERKV_TEST_STALL_PEER_SERVE arms one.
  void HandleRequest(const transport::peer::PeerRequest& request,
                     transport::peer::PeerResponder responder) EXCLUDES(mu_);
  // Hands a peer's request to the peer server (Unavailable before Start
  // and after Stop).
  void Serve(const transport::peer::PeerRequest& request,
             transport::peer::PeerResponder responder) EXCLUDES(mu_);

  std::vector<std::string> shared_;
  std::shared_ptr<RepublishTarget> republish_ =
      std::make_shared<RepublishTarget>();
#ifdef TIERKV_SYNC_POINTS
  // TIERKV_TEST_STALL_PEER_SERVE (peer_serve_stall.h); null when unset.
  // Made before the transport, destroyed after it (its thread calls Serve,
  // as the transport's does, until then).
  std::unique_ptr<PeerServeStall> serve_stall_;
#endif
  // Both are closed by ~Cluster explicitly, the transport first: its
  // progress thread calls HandleRequest, which uses the members below.
  std::shared_ptr<transport::peer::PeerTransport> transport_;
  std::shared_ptr<transport::Directory> directory_;
  std::unique_ptr<PeerTier> tier_;
  std::atomic<storage::CacheEngine*> engine_{nullptr};

  mutable Mutex mu_;
  std::shared_ptr<PeerServer> server_ GUARDED_BY(mu_);
  std::shared_ptr<PagePublisher> publisher_ GUARDED_BY(mu_);
};

}  // namespace tierkv::daemon::cluster
