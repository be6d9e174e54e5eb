// A prefix trace as dense block ids (see flat_trace.h).
#include "tools/flat_trace.h"

#include <unordered_map>

#include "tools/prefix_hit_rules.h"

namespace tierkv::tools {

FlatTrace::FlatTrace(std::span<const TraceRequest> trace) {
  std::unordered_map<uint64_t, uint32_t> dense;
  request_begin.reserve(trace.size() + 1);
  input_tokens.reserve(trace.size());
  for (const TraceRequest& request : trace) {
    request_begin.push_back(blocks.size());
    input_tokens.push_back(request.input_length);
    for (uint64_t id : CacheableBlocks(request)) {
      auto [it, fresh] = dense.try_emplace(id, distinct_blocks);
      if (fresh) ++distinct_blocks;
      blocks.push_back(it->second);
    }
  }
  request_begin.push_back(blocks.size());
}

}  // namespace tierkv::tools
