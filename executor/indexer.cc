// Lightning indexer scoring and top-k (see indexer.h).
#include "executor/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "executor/kernels.h"
#include "executor/thread_pool.h"

namespace tierkv::executor {

void IndexScores(const float* q, const float* head_weights, int64_t heads,
                 int64_t dim, const float* keys, int64_t num_keys,
                 float* scores) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  // Logits for a block of keys at a time: logits[h, s] = q_h·k_s.
  constexpr int64_t kBlock = 64;
  float logits[kBlock * 64];  // kBlock keys × up to 64 heads at a time
  for (int64_t s0 = 0; s0 < num_keys; s0 += kBlock) {
    const int64_t n = std::min(kBlock, num_keys - s0);
    for (int64_t h0 = 0; h0 < heads; h0 += 64) {
      const int64_t hn = std::min<int64_t>(64, heads - h0);
      DotMatrix(keys + s0 * dim, dim, n, q + h0 * dim, dim, hn, dim, logits, n);
      for (int64_t s = 0; s < n; ++s) {
        float acc = h0 == 0 ? 0.0f : scores[s0 + s];
        for (int64_t h = 0; h < hn; ++h) {
          acc +=
              head_weights[h0 + h] * std::max(logits[h * n + s] * scale, 0.0f);
        }
        scores[s0 + s] = acc;
      }
    }
  }
}

Status ScoreCachedKeys(ThreadPool* pool, const KvCache& cache, int64_t layer,
                       const float* q, const float* head_weights, int64_t heads,
                       int64_t dim, int64_t num_keys, float* scores) {
  const int64_t page_tokens = cache.geometry().page_tokens;
  const int64_t pages = (num_keys + page_tokens - 1) / page_tokens;
  // Resolve every page view first so errors surface before the parallel scan.
  std::vector<const float*> views(static_cast<size_t>(pages));
  for (int64_t p = 0; p < pages; ++p) {
    auto view = cache.PageView(layer, KvPart::kIndexKey, p);
    if (!view.ok()) return view.status();
    views[p] = view->data();
  }
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t first = p * page_tokens;
      const int64_t n = std::min(page_tokens, num_keys - first);
      IndexScores(q, head_weights, heads, dim, views[p], n, scores + first);
    }
  };
  if (pool) {
    pool->ParallelFor(pages, /*grain=*/4, body);
  } else {
    body(0, pages);
  }
  return Status::OK();
}

std::vector<int32_t> TopKIndices(std::span<const float> scores, int64_t k) {
  const int64_t n = static_cast<int64_t>(scores.size());
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  if (k < n) {
    auto better = [&](int32_t a, int32_t b) {
      return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    };
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
    idx.resize(static_cast<size_t>(k));
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace tierkv::executor
