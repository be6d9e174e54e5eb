// ClusterCacheSimulator: the offline bound for a cluster of prefix caches,
// what `tierkv replay --nodes N` measures on real daemons set against (issue
// 27): N nodes, each an LRU cache of `capacity_blocks` blocks, requests
// routed round-robin (request r to node r mod N) or to the node that holds
// the longest leading run (KV-aware routing), under the counting rules of
// tools/prefix_hit_rules.h, in one of two modes:
//
//   local  a request hits only the leading blocks its own node holds (every
//          node an island: tierkvd without peers);
//   peers  the leading run goes on through blocks any node holds (the peer
//          tier): the blocks found only elsewhere are fetched. A fetch is a
//          use on the holder (its LRU order sees the read, as tierkv's
//          tiers count a read as a use) and, as every block of the request,
//          an access on the request's own node, which keeps the copy.
//
// Independent of the daemon (no storage/ or transport/ code). O(accesses x
// N) for peers, O(accesses) otherwise.
//
// Thread safety: immutable after construction; Run() may be called from
// several threads at once.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tools/flat_trace.h"
#include "tools/prefix_trace.h"

namespace tierkv::tools {

enum class ClusterRouting { kRoundRobin, kKvAware };

std::string_view ClusterRoutingName(ClusterRouting routing);  // "round-robin"

struct ClusterCacheOptions {
  // Nodes in the cluster. Default: 4. REQUIRES: >= 1.
  uint32_t nodes = 4;
  // Each node's cache, in 512-token blocks. Default: 6000 (3.07M tokens).
  uint64_t capacity_blocks = 6000;
  // True: any node's blocks extend the leading run (the peer tier).
  bool peers = false;
  // kKvAware: to the node with the longest leading run of its own, ties to
  // the round-robin node or the first after it. Default: round-robin.
  ClusterRouting routing = ClusterRouting::kRoundRobin;
};

struct ClusterCacheResult {
  uint64_t requests = 0;
  uint64_t input_tokens = 0;
  // Leading hit tokens (rule 2 of prefix_hit_rules.h), and of those the ones
  // in blocks the request's own node lacked (served by a peer).
  uint64_t hit_tokens = 0;
  uint64_t peer_hit_tokens = 0;
  // Per node: the input and hit tokens of the requests routed to it.
  std::vector<uint64_t> node_input_tokens;
  std::vector<uint64_t> node_hit_tokens;

  // hit_tokens / input_tokens; 0 for an empty trace.
  double TokenHitRate() const;
  // peer_hit_tokens / input_tokens; 0 for an empty trace.
  double PeerTokenRate() const;
};

class ClusterCacheSimulator {
 public:
  // Copies what it needs; the requests need not outlive the simulator.
  explicit ClusterCacheSimulator(std::span<const TraceRequest> requests)
      : trace_(requests) {}

  ClusterCacheResult Run(const ClusterCacheOptions& options) const;

 private:
  const FlatTrace trace_;
};

}  // namespace tierkv::tools
