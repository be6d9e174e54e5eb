// Offline prefix-cache simulators: what a single cache of N blocks would
// hit on a trace, under the counting rules of tools/prefix_hit_rules.h (the
// ones `tierkv replay` applies to a real tierkvd), for two policies:
//
//   lru     evicts the least recently used block. A tierkvd with one host
//           shard and the lru policy must hit exactly as much.
//   belady  Belady's MIN: evicts the block whose next access is farthest
//           in the future (a block never accessed again first), the
//           newly inserted one included, which makes it optimal in block
//           misses. On chain-consistent traces a block's prefix is always
//           accessed before it, so MIN never keeps a block without its
//           prefix: its block hits are all leading hits, and its token hit
//           rate bounds LRU's from above.
//
// Independent of the daemon (no storage/ code): a reference to check the
// daemon against. They compare with a daemon whose capacity holds the
// largest request's cacheable blocks (the daemon never evicts a request's
// own blocks while storing them; a simulator with less room would). Both run in
// O(accesses) (LRU) and O(accesses log accesses) (MIN: next uses precomputed
// once per trace, a lazy max-heap).
//
// Thread safety: a PrefixCacheSimulator is immutable after construction;
// Run() may be called from several threads at once.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tools/flat_trace.h"
#include "tools/prefix_trace.h"

namespace tierkv::tools {

enum class OfflinePolicy { kLru, kBelady };

std::string_view OfflinePolicyName(OfflinePolicy policy);  // "lru", "belady"

// The outcome of one simulation.
struct PrefixCacheResult {
  uint64_t capacity_blocks = 0;
  uint64_t requests = 0;
  uint64_t input_tokens = 0;     // sum of input_length
  uint64_t hit_tokens = 0;       // sum of leading hit blocks x 512
  uint64_t hit_blocks = 0;       // leading hits only
  uint64_t accessed_blocks = 0;  // cacheable blocks of all requests
  uint64_t inserted_blocks = 0;  // accesses that found the block absent
  uint64_t evicted_blocks = 0;

  // hit_tokens / input_tokens; 0 for an empty trace.
  double TokenHitRate() const;
};

class PrefixCacheSimulator {
 public:
  // Flattens the cacheable blocks of `requests` into one access sequence
  // and precomputes every access's next use. Copies what it needs; the
  // requests need not outlive the simulator.
  explicit PrefixCacheSimulator(std::span<const TraceRequest> requests);

  // Simulates a cache of `capacity_blocks` (0: nothing is ever kept).
  PrefixCacheResult Run(OfflinePolicy policy, uint64_t capacity_blocks) const;

  uint64_t distinct_blocks() const { return trace_.distinct_blocks; }

 private:
  PrefixCacheResult Lru(uint64_t capacity_blocks) const;
  PrefixCacheResult Belady(uint64_t capacity_blocks) const;
  PrefixCacheResult Totals(uint64_t capacity_blocks) const;

  const FlatTrace trace_;
  // Index of the next access of the same block after access i, or
  // kNeverAgain.
  std::vector<size_t> next_use_;
};

}  // namespace tierkv::tools
