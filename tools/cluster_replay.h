// The replay behind `tierkv replay --nodes N`: a prefix trace run through a
// cluster of N real tierkvd daemons that share pages through the peer tier
// (daemon/cluster/), with a real redis-server as their directory, to
// measure the hit rate a cluster delivers next to the offline bound of
// cluster_cache_sim.h (issue 27; shared/reference/scaleout.md §9.7, §10).
//
// The replay starts redis-server (redis_launcher.h: a free loopback port, a
// password file, no persistence) and N tierkvds (daemon_launcher.h), node-0
// .. node-<N-1>, each with the single-daemon replay's namespace
// (replay_workload.h ReplayDaemonConfig: `node.host_blocks` segments of
// DRAM in `node.shards` shards) marked `shared` (unless `peers` is off), a
// [cluster] on that directory with a fresh 32-byte secret, UCX over tcp on
// 127.0.0.1 (UCX 1.13's tcp transport refuses other 127/8 addresses).
// Before the first request it checks that every node sees every other as a
// live peer (a probe page per node, in a namespace of its own, matched as a
// peer page everywhere else).
//
// Requests go in trace order, one at a time, to node r mod N (round-robin)
// or, KV-aware, to the node whose Match reports the longest leading run it
// holds itself (ties to the round-robin node or the first after it), where
// a PrefixReplayer (prefix_replayer.h) runs Match, Get of the leading
// pages (a peer page is fetched into the node's DRAM) and Put of the rest.
// A page counts as a local hit when Match found it in the node's own DRAM
// (or NVMe) and as a peer hit when Match reported a peer and the Get
// returned its bytes; the run ends at the first page not read.
//
// Between requests the replay waits until the directory names the node a
// holder of every page of the request (the node publishes in the
// background): the offline bound assumes a page is visible to every node
// from the next request on, and a replay that raced ahead of the publisher
// would measure the replay's speed, not the cache. That is a bounded poll
// of Redis (the daemon announces a publish nowhere else); a request whose
// pages are not all there in time is counted (publish_timeouts) and the
// replay goes on.
//
// Thread safety: ReplayPrefixTraceOnCluster() may run concurrently with
// itself (each call has its own daemons and Redis).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "tierkv/status.h"
#include "tools/cluster_cache_sim.h"
#include "tools/prefix_trace.h"
#include "tools/replay_workload.h"

namespace tierkv::tools {

struct ClusterReplayOptions {
  // Daemons in the cluster. 1..64. Default: 4.
  uint32_t nodes = 4;
  ClusterRouting routing = ClusterRouting::kRoundRobin;
  // Whether the nodes share pages (the namespace's `shared`); false runs
  // every node as an island (the local-only measurement). Default: true.
  bool peers = true;
  // Each node's namespace: host_blocks, shards, policy, bytes_per_token,
  // bin_dir (nvme_blocks, speed and progress are not used: see Validate).
  // Default: ReplayOptions{} with 6000 host blocks (3.07M tokens) and one
  // shard (exact LRU).
  ReplayOptions node = {.host_blocks = 6000, .shards = 1};
  // The [cluster] lookup_budget_us of every node: how long a Match waits
  // for the directory before answering local-only. The replay measures the
  // cache, not the directory's latency on a loaded machine, so it allows
  // much more than the daemon's default (2 ms). Default: 200 ms.
  uint32_t lookup_budget_us = 200000;
  // How long the replay waits, after each request, for the directory to
  // name the node a holder of the request's pages. Default: 5 s.
  std::chrono::milliseconds publish_timeout{5000};
  // The redis-server binary. Default: "" (RedisLauncher::Binary()).
  std::string redis_server;
  // Called on the replaying thread after each request with the number of
  // requests done and the total. Default: none.
  std::function<void(size_t done, size_t total)> progress;

  // InvalidArgument naming the field: nodes outside 1..64, node options
  // invalid (ReplayOptions::Validate) or with an NVMe tier or a speed,
  // lookup_budget_us outside the daemon's 100..1000000.
  Status Validate() const;
};

// One node's share of the replay (the requests routed to it).
struct ClusterNodeResult {
  std::string node_id;  // "node-<i>"
  uint64_t requests = 0;
  uint64_t input_tokens = 0;      // sum of input_length
  uint64_t local_hit_tokens = 0;  // leading pages read from its own tiers
  uint64_t peer_hit_tokens = 0;   // leading pages fetched from peers
  uint64_t get_missed = 0;        // leading pages Match reported, Get did not
  uint64_t put_failed = 0;        // Put items not stored
  // The daemon's "peer" stats at the end (tierkv stats --json), as JSON
  // text ("{}" without peers).
  std::string peer_stats_json = "{}";

  uint64_t hit_tokens() const { return local_hit_tokens + peer_hit_tokens; }
  double LocalHitRate() const;    // local_hit_tokens / input_tokens
  double PeerHitRate() const;     // peer_hit_tokens / input_tokens
  double ClusterHitRate() const;  // hit_tokens / input_tokens
};

struct ClusterReplayResult {
  ClusterReplayOptions options;  // as run (progress cleared)
  std::vector<ClusterNodeResult> nodes;
  // Requests after which the directory did not name the node a holder of
  // all its pages within publish_timeout.
  uint64_t publish_timeouts = 0;
  // Time spent waiting for the directory between requests (part of
  // `seconds`).
  double publish_wait_seconds = 0;
  double seconds = 0;  // the replay itself, without start-up and stop

  uint64_t requests() const;
  uint64_t input_tokens() const;
  uint64_t local_hit_tokens() const;
  uint64_t peer_hit_tokens() const;
  uint64_t hit_tokens() const { return local_hit_tokens() + peer_hit_tokens(); }
  double LocalHitRate() const;    // local_hit_tokens / input_tokens
  double PeerHitRate() const;     // peer_hit_tokens / input_tokens
  double ClusterHitRate() const;  // hit_tokens / input_tokens
};

// The tierkvd config (TOML) of node `index` of the cluster replay, with
// the given directory URL, password file and secret file.
// REQUIRES: options.Validate().ok().
std::string ClusterReplayDaemonConfig(const ClusterReplayOptions& options,
                                      uint32_t index,
                                      const std::string& directory_url,
                                      const std::string& password_file,
                                      const std::string& secret_file);

// Replays `trace` through a fresh cluster (see the file comment) and stops
// it. Errors: InvalidArgument (options), NotFound when redis-server or
// tierkvd is missing, the launchers' errors (with the logs), Unavailable
// when the nodes do not see each other as peers within 30 s, the first
// failure of a Match, Get or Put other than the counted ones (with the end
// of that node's log), and Internal when a daemon does not exit cleanly
// on SIGTERM afterwards.
Result<ClusterReplayResult> ReplayPrefixTraceOnCluster(
    std::span<const TraceRequest> trace, const ClusterReplayOptions& options);

}  // namespace tierkv::tools
