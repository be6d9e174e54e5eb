// The DSA lightning indexer's scoring and top-k selection (glm5-dsa.md §2.1):
//
//   score[t, s] = Σ_h w[t, h] · relu(q[t, h] · k[s] · D^-0.5),  s <= t
//   topk(t)     = the min(index_topk, t + 1) highest-scoring s
//
// where w = weights_proj(x) · H_I^-0.5 is supplied by the caller. The
// Hadamard rotation and FP8 rounding of the reference kernels are omitted:
// the rotation preserves dot products and FP8 is a precision optimization
// (as in HF and vLLM).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "executor/kv_cache.h"
#include "tierkv/status.h"

namespace tierkv::executor {

class ThreadPool;

// scores[s] for s < num_keys; q is [heads, dim], keys is [num_keys, dim].
void IndexScores(const float* q, const float* head_weights, int64_t heads,
                 int64_t dim, const float* keys, int64_t num_keys,
                 float* scores);

// Same over the indexer keys of tokens [0, num_keys) of `layer` in `cache`,
// page by page, in parallel over pages. REQUIRES: the layer has indexer
// keys for those tokens. Returns the cache's error otherwise.
Status ScoreCachedKeys(ThreadPool* pool, const KvCache& cache, int64_t layer,
                       const float* q, const float* head_weights, int64_t heads,
                       int64_t dim, int64_t num_keys, float* scores);

// Indices of the k largest scores (ties: the smaller index wins), sorted
// ascending. k is clamped to scores.size().
std::vector<int32_t> TopKIndices(std::span<const float> scores, int64_t k);

}  // namespace tierkv::executor
