// Tests for executor/indexer: scores, paged scan, top-k.
#include "executor/indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "executor/thread_pool.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::executor {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
  return v;
}

TEST(IndexScores, IsWeightedSumOfReluScaledDotProducts) {
  const int64_t heads = 3, dim = 4;
  const std::vector<float> q = {1, 0, 0, 0, 0, 2, 0, 0, -1, -1, -1, -1};
  const std::vector<float> w = {0.5f, 2.0f, 10.0f};
  const std::vector<float> k = {4, 1, 0, 0};
  float s = 0;
  IndexScores(q.data(), w.data(), heads, dim, k.data(), 1, &s);
  // head 0: relu(4 / 2) * 0.5 = 1; head 1: relu(2 / 2) * 2 = 2;
  // head 2: relu(-5 / 2) = 0.
  EXPECT_FLOAT_EQ(s, 3.0f);
}

TEST(ScoreCachedKeys, PagedScanMatchesContiguousScores) {
  KvCacheGeometry g;
  g.num_layers = 1;
  g.latent_dim = 4;
  g.index_dim = 16;
  g.has_index_keys = {true};
  g.max_tokens = 300;
  auto cache = InProcessKvCache::Create(g);
  ASSERT_OK(cache);
  const int64_t n = 200;  // 3 full pages + a partial one
  const auto keys = Random(static_cast<size_t>(n * 16), 1);
  ASSERT_OK((*cache)->Write(0, KvPart::kIndexKey, 0, keys));
  const auto q = Random(2 * 16, 2);
  const std::vector<float> w = {0.7f, 0.4f};
  std::vector<float> want(n), got(n);
  IndexScores(q.data(), w.data(), 2, 16, keys.data(), n, want.data());
  ThreadPool pool(2);
  ASSERT_OK(ScoreCachedKeys(&pool, **cache, 0, q.data(), w.data(), 2, 16, n,
                            got.data()));
  EXPECT_EQ(got, want);
}

TEST(TopKIndices, ReturnsLargestAscendingWithLowerIndexWinningTies) {
  const std::vector<float> s = {0.1f, 5, 3, 5, -1, 4};
  EXPECT_EQ(TopKIndices(s, 3), (std::vector<int32_t>{1, 3, 5}));
  EXPECT_EQ(TopKIndices(s, 1), (std::vector<int32_t>{1}));
  EXPECT_EQ(TopKIndices(s, 10), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<int> hits(1000, 0);
      pool.ParallelFor(1000, 7, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) ++hits[i];
      });
      ASSERT_TRUE(
          std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
    }
  }
}

}  // namespace
}  // namespace tierkv::executor
