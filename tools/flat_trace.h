// FlatTrace: a prefix trace's cacheable blocks (prefix_hit_rules.h, rule 1)
// flattened into one access sequence of dense block ids, the input of the
// offline simulators (prefix_cache_sim.h, cluster_cache_sim.h).
//
// Thread safety: immutable after construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tools/prefix_trace.h"

namespace tierkv::tools {

struct FlatTrace {
  // Copies what it needs; the requests need not outlive it.
  explicit FlatTrace(std::span<const TraceRequest> requests);

  size_t requests() const { return input_tokens.size(); }

  // Access i names dense block blocks[i] (0 .. distinct_blocks - 1);
  // request r's accesses are [request_begin[r], request_begin[r + 1]).
  std::vector<uint32_t> blocks;
  std::vector<size_t> request_begin;
  std::vector<uint64_t> input_tokens;  // per request
  uint32_t distinct_blocks = 0;
};

}  // namespace tierkv::tools
