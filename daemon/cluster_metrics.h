// ClusterMetrics: Prometheus view of the cluster's two transports, the
// directory (transport/directory/directory.h) and the peer connections
// (transport/peer/peer_transport.h), built at scrape time from their own
// snapshots (Directory::GetStats, Directory::LiveNodes,
// PeerTransport::counters; a prometheus::Collectable), so a value never
// drifts from what the transports count (scaleout.md §8(g)).
//
// Families (present, zero included, on every scrape of a daemon with
// [cluster]; absent without it):
//
//   tierkv_directory_up                  gauge, 1 while the last directory
//                                        round trip succeeded
//   tierkv_directory_ops_total{op}       lookup (calls that reached the
//                                        server), heartbeat, refresh (live-set
//                                        reloads), republish (catalog
//                                        re-publish runs); and, counted in
//                                        PAGES acknowledged, publish,
//                                        unpublish, forget (stale holders
//                                        removed)
//   tierkv_directory_errors_total{op}    lookup, heartbeat, write (failed
//                                        background write batches: publish,
//                                        unpublish and forget)
//   tierkv_directory_lookups_skipped_total{reason}
//                                        lookups answered "down" with no
//                                        round trip: breaker (backing off
//                                        after failures), no_connection
//   tierkv_directory_lookup_pages_total{result}
//                                        pages asked for by lookups that
//                                        reached the server (requested),
//                                        those answered with a live holder
//                                        (held), and those whose entry was
//                                        unreadable (malformed)
//   tierkv_directory_last_lookup_seconds gauge, the latest lookup's latency
//   tierkv_directory_queued_pages        gauge, publish/unpublish pages not
//                                        yet written
//   tierkv_directory_dropped_pages_total publishes/unpublishes refused by a
//                                        full queue (peers miss them)
//   tierkv_directory_reconnects_total
//   tierkv_peers_live                    gauge, live nodes in the directory's
//                                        cached live set, this one excluded
//   tierkv_peer_connections              gauge, authenticated connections
//   tierkv_peer_connections_opened_total handshakes completed
//   tierkv_peer_requests_total{direction}   sent | served
//   tierkv_peer_bytes_total{direction}   sent | received: request payloads,
//                                        reply heads and reply data
//   tierkv_peer_served_bytes_total       reply bulk data sent to peers (the
//                                        bytes this node served)
//   tierkv_peer_errors_total{reason}     timeout (calls past their
//                                        deadline), reset (calls failed by a
//                                        broken or closed connection), auth
//                                        (handshakes refused), malformed
//                                        (messages that failed decoding or
//                                        their MAC), abandoned (stalled
//                                        rendezvous receives given up)
//
// The peer tier's own counters (fetches, fetch_bytes, errors_stale, ...)
// are tier counters: tierkv_tier_counter_total{tier="peer",name} and
// tierkv_tier_gauge{tier="peer",name} (tier_metrics.h).
//
// Thread safety: Collect() may run concurrently with the transports' work
// (both snapshot calls are thread-safe).
#pragma once

#include <prometheus/collectable.h>

#include <vector>

#include "transport/directory/directory.h"
#include "transport/peer/peer_transport.h"

namespace tierkv::daemon {

class ClusterMetrics final : public prometheus::Collectable {
 public:
  // Both borrowed; they must outlive every scrape (the daemon stops the
  // exposer before destroying them). Either may be null: then its families
  // are left out.
  ClusterMetrics(const transport::Directory* directory,
                 const transport::peer::PeerTransport* peers)
      : directory_(directory), peers_(peers) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const transport::Directory* directory_;
  const transport::peer::PeerTransport* peers_;
};

}  // namespace tierkv::daemon
