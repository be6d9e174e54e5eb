// The counting rules that `tierkv replay` (a real tierkvd) and the offline
// simulators (prefix_cache_sim.h) share, so that their hit rates compare
// exactly:
//
// 1. Cacheable blocks. A request's cacheable blocks are its first
//    floor((input_length - 1) / 512) hash_ids: an engine stores only full
//    pages, and it always computes the last prompt token (to sample from
//    it), so a prompt that ends exactly on a block boundary still leaves its
//    last block uncached. The partial last block is never cached.
// 2. Hits. Requests are taken in trace order. A request's hit is the number
//    of LEADING cacheable blocks present in the cache (any tier) before it
//    runs; matching stops at the first missing block, even if later ones
//    are present. Hit tokens = hit x 512; total tokens = sum of
//    input_length. Token hit rate = sum of hit tokens / total tokens.
// 3. Accesses. Then, as an engine does, the request reads its hit blocks
//    and stores every cacheable block from the first miss on, in order
//    (blocks already stored deduplicate and count as used). For a cache
//    this is: access every cacheable block in forward order; a present
//    block becomes the most recently used, a missing one is inserted (and
//    something evicted while over capacity).
//
// The daemon replay issues Match (rule 2; the per-page tier of the leading
// pages splits hits into host and NVMe), Get of the leading pages and Put of
// the rest (rule 3). The simulators apply rule 3 directly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "tools/prefix_trace.h"

namespace tierkv::tools {

// floor((input_length - 1) / 512); 0 for an empty prompt.
constexpr uint64_t CacheableBlockCount(uint64_t input_length) {
  return input_length == 0 ? 0 : (input_length - 1) / kTraceBlockTokens;
}

// The ids of `request`'s cacheable blocks, in prompt order.
// REQUIRES: request.hash_ids holds at least that many (LoadPrefixTrace
// checks it).
inline std::span<const uint64_t> CacheableBlocks(const TraceRequest& request) {
  const uint64_t n = std::min<uint64_t>(
      CacheableBlockCount(request.input_length), request.hash_ids.size());
  return std::span(request.hash_ids).first(n);
}

constexpr uint64_t HitTokens(uint64_t leading_hit_blocks) {
  return leading_hit_blocks * kTraceBlockTokens;
}

}  // namespace tierkv::tools
