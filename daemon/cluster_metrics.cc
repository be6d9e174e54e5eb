// ClusterMetrics: the directory's and the peer transport's families (see
// cluster_metrics.h).
#include "daemon/cluster_metrics.h"

#include <prometheus/metric_family.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "daemon/metric_families.h"

namespace tierkv::daemon {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

double Value(uint64_t v) { return static_cast<double>(v); }

void CollectDirectory(const transport::Directory& directory,
                      std::vector<MetricFamily>& out) {
  const transport::DirectoryStats s = directory.GetStats();

  auto up = Family("tierkv_directory_up",
                   "1 while the last round trip to the cluster directory "
                   "succeeded; 0 while it is down (lookups are local-only)",
                   MetricType::Gauge);
  AddValue(up, {}, s.up ? 1.0 : 0.0);
  out.push_back(std::move(up));

  auto ops = Family(
      "tierkv_directory_ops_total",
      "Cluster directory operations by op: lookup (calls that reached the "
      "server), heartbeat, refresh (live-set reloads), republish (catalog "
      "re-publish runs); publish, unpublish and forget count pages "
      "acknowledged",
      MetricType::Counter);
  AddValue(ops, {{"op", "lookup"}}, Value(s.lookups));
  AddValue(ops, {{"op", "publish"}}, Value(s.published_pages));
  AddValue(ops, {{"op", "unpublish"}}, Value(s.unpublished_pages));
  AddValue(ops, {{"op", "forget"}}, Value(s.forgotten_holders));
  AddValue(ops, {{"op", "heartbeat"}}, Value(s.heartbeats));
  AddValue(ops, {{"op", "refresh"}}, Value(s.live_refreshes));
  AddValue(ops, {{"op", "republish"}}, Value(s.republishes));
  out.push_back(std::move(ops));

  auto errors = Family(
      "tierkv_directory_errors_total",
      "Failed cluster directory operations by op: lookup, heartbeat, write "
      "(background batches of publish, unpublish and forget)",
      MetricType::Counter);
  AddValue(errors, {{"op", "lookup"}}, Value(s.lookup_errors));
  AddValue(errors, {{"op", "heartbeat"}}, Value(s.heartbeat_errors));
  AddValue(errors, {{"op", "write"}}, Value(s.write_errors));
  out.push_back(std::move(errors));

  auto skipped = Family(
      "tierkv_directory_lookups_skipped_total",
      "Lookups answered 'directory down' without a round trip, by reason: "
      "breaker (backing off after failures), no_connection (being made)",
      MetricType::Counter);
  AddValue(skipped, {{"reason", "breaker"}}, Value(s.lookups_short_circuited));
  AddValue(skipped, {{"reason", "no_connection"}},
           Value(s.lookups_without_connection));
  out.push_back(std::move(skipped));

  auto pages =
      Family("tierkv_directory_lookup_pages_total",
             "Pages asked for by directory lookups (requested), those answered "
             "with a live holder (held), and those whose directory entry was "
             "unreadable (malformed: no holder)",
             MetricType::Counter);
  AddValue(pages, {{"result", "requested"}}, Value(s.lookup_pages));
  AddValue(pages, {{"result", "held"}}, Value(s.lookup_hit_pages));
  AddValue(pages, {{"result", "malformed"}}, Value(s.lookup_malformed_pages));
  out.push_back(std::move(pages));

  auto latency =
      Family("tierkv_directory_last_lookup_seconds",
             "Latency of the latest directory lookup", MetricType::Gauge);
  AddValue(latency, {},
           std::chrono::duration<double>(s.last_lookup_latency).count());
  out.push_back(std::move(latency));

  auto queued = Family("tierkv_directory_queued_pages",
                       "Publish and unpublish pages queued, not yet written "
                       "to the directory",
                       MetricType::Gauge);
  AddValue(queued, {}, Value(s.queued_pages));
  out.push_back(std::move(queued));

  auto dropped = Family(
      "tierkv_directory_dropped_pages_total",
      "Publish and unpublish pages refused by a full queue (peers miss them)",
      MetricType::Counter);
  AddValue(dropped, {}, Value(s.dropped_pages));
  out.push_back(std::move(dropped));

  auto reconnects = Family("tierkv_directory_reconnects_total",
                           "Directory connections made again after the first",
                           MetricType::Counter);
  AddValue(reconnects, {}, Value(s.reconnects));
  out.push_back(std::move(reconnects));

  // From the cached live set, not s.live_nodes - 1: this node may be
  // missing from it (its registration expired, the directory restarted).
  uint64_t others = 0;
  const std::string& self = directory.self().node_id;
  for (const transport::DirectoryNode& node : directory.LiveNodes()) {
    if (node.node_id != self) ++others;
  }
  auto live = Family("tierkv_peers_live",
                     "Live cluster nodes other than this one, as the "
                     "directory's cached live set has them",
                     MetricType::Gauge);
  AddValue(live, {}, Value(others));
  out.push_back(std::move(live));
}

void CollectPeers(const transport::peer::PeerTransport& peers,
                  std::vector<MetricFamily>& out) {
  const transport::peer::PeerTransportCounters c = peers.counters();

  auto connections =
      Family("tierkv_peer_connections",
             "Authenticated connections to and from peers", MetricType::Gauge);
  AddValue(connections, {}, Value(c.live_connections));
  out.push_back(std::move(connections));

  auto opened = Family("tierkv_peer_connections_opened_total",
                       "Peer handshakes completed", MetricType::Counter);
  AddValue(opened, {}, Value(c.connections_opened));
  out.push_back(std::move(opened));

  auto requests =
      Family("tierkv_peer_requests_total",
             "Peer requests by direction: sent (calls), served (handed to this "
             "node's handler)",
             MetricType::Counter);
  AddValue(requests, {{"direction", "sent"}}, Value(c.requests_sent));
  AddValue(requests, {{"direction", "served"}}, Value(c.requests_served));
  out.push_back(std::move(requests));

  auto bytes = Family(
      "tierkv_peer_bytes_total",
      "Bytes on peer connections by direction (request payloads, reply heads "
      "and reply data)",
      MetricType::Counter);
  AddValue(bytes, {{"direction", "sent"}}, Value(c.bytes_sent));
  AddValue(bytes, {{"direction", "received"}}, Value(c.bytes_received));
  out.push_back(std::move(bytes));

  auto served = Family("tierkv_peer_served_bytes_total",
                       "Reply data this node sent to peers (bytes it served)",
                       MetricType::Counter);
  AddValue(served, {}, Value(c.reply_data_bytes_served));
  out.push_back(std::move(served));

  auto errors = Family(
      "tierkv_peer_errors_total",
      "Peer transport errors by reason: timeout (calls past their "
      "deadline), reset (calls failed by a broken connection), auth "
      "(handshakes refused), malformed (messages that failed decoding or "
      "their MAC), abandoned (stalled transfers given up)",
      MetricType::Counter);
  AddValue(errors, {{"reason", "timeout"}}, Value(c.errors_timeout));
  AddValue(errors, {{"reason", "reset"}}, Value(c.errors_reset));
  AddValue(errors, {{"reason", "auth"}}, Value(c.errors_auth));
  AddValue(errors, {{"reason", "malformed"}}, Value(c.errors_malformed));
  AddValue(errors, {{"reason", "abandoned"}}, Value(c.abandoned_receives));
  out.push_back(std::move(errors));
}

}  // namespace

std::vector<MetricFamily> ClusterMetrics::Collect() const {
  std::vector<MetricFamily> out;
  if (directory_ != nullptr) CollectDirectory(*directory_, out);
  if (peers_ != nullptr) CollectPeers(*peers_, out);
  return out;
}

}  // namespace tierkv::daemon
