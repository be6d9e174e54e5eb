// The offline cluster prefix-cache simulator (see cluster_cache_sim.h).
#include "tools/cluster_cache_sim.h"

#include "tools/lru_blocks.h"
#include "tools/prefix_hit_rules.h"

namespace tierkv::tools {
namespace {

double Share(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0
                    : static_cast<double>(part) / static_cast<double>(whole);
}

}  // namespace

std::string_view ClusterRoutingName(ClusterRouting routing) {
  switch (routing) {
    case ClusterRouting::kRoundRobin:
      return "round-robin";
    case ClusterRouting::kKvAware:
      return "kv-aware";
  }
  return "unknown";
}

double ClusterCacheResult::TokenHitRate() const {
  return Share(hit_tokens, input_tokens);
}

double ClusterCacheResult::PeerTokenRate() const {
  return Share(peer_hit_tokens, input_tokens);
}

ClusterCacheResult ClusterCacheSimulator::Run(
    const ClusterCacheOptions& o) const {
  const uint32_t n = o.nodes == 0 ? 1 : o.nodes;
  std::vector<LruBlocks> nodes(
      n, LruBlocks(trace_.distinct_blocks, o.capacity_blocks));
  ClusterCacheResult out;
  out.requests = trace_.input_tokens.size();
  out.node_input_tokens.assign(n, 0);
  out.node_hit_tokens.assign(n, 0);
  auto own_run = [&](uint32_t node, size_t begin, size_t end) {
    size_t run = 0;
    while (begin + run < end &&
           nodes[node].Contains(trace_.blocks[begin + run])) {
      ++run;
    }
    return run;
  };
  for (size_t r = 0; r < trace_.input_tokens.size(); ++r) {
    const size_t begin = trace_.request_begin[r],
                 end = trace_.request_begin[r + 1];
    uint32_t node = static_cast<uint32_t>(r % n);
    if (o.routing == ClusterRouting::kKvAware) {
      size_t best = own_run(node, begin, end);
      for (uint32_t k = 1; k < n; ++k) {
        const uint32_t candidate = (node + k) % n;
        if (const size_t run = own_run(candidate, begin, end); run > best) {
          best = run;
          node = candidate;
        }
      }
    }
    // The leading run: the node's own blocks, then (with peers) any node's.
    size_t leading = 0, fetched = 0;
    for (size_t i = begin; i < end; ++i) {
      const uint32_t block = trace_.blocks[i];
      if (nodes[node].Contains(block)) {
        ++leading;
        continue;
      }
      bool held = false;
      for (uint32_t k = 1; o.peers && k < n && !held; ++k) {
        LruBlocks& holder = nodes[(node + k) % n];
        if (holder.Contains(block)) {
          holder.Access(block, i);  // the fetch reads it there
          held = true;
        }
      }
      if (!held) break;
      ++leading;
      ++fetched;
    }
    out.input_tokens += trace_.input_tokens[r];
    out.hit_tokens += HitTokens(leading);
    out.peer_hit_tokens += HitTokens(fetched);
    out.node_input_tokens[node] += trace_.input_tokens[r];
    out.node_hit_tokens[node] += HitTokens(leading);
    for (size_t i = begin; i < end; ++i)
      nodes[node].Access(trace_.blocks[i], i);
  }
  return out;
}

}  // namespace tierkv::tools
