// AVX2 + FMA kernels (see kernels_avx2.h). Hand-written with intrinsics
// rather than taken from a BLAS because the executor's contract is that an
// output element never depends on how many rows or tokens are computed
// together (chunked prefill, decode and the tier cache must agree bit for
// bit); BLAS libraries pick blockings and reduction orders per shape.
#include "executor/kernels_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace tierkv::executor::avx2 {
namespace {

// Folds the scalar tail a[i..n) · b[i..n) into lanes 0.. of `acc` and
// combines the 8 lanes in the fixed order shared with the generic Dot.
inline float Finish(__m256 acc, const float* a, const float* b, int64_t i,
                    int64_t n) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (int k = 0; i < n; ++i, ++k) lanes[k] = std::fma(a[i], b[i], lanes[k]);
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
         ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

// c[j * ldc + r] = Dot(a_r, b_j) for R rows of a and C rows of b: R·C
// independent FMA chains, so the loop runs at FMA throughput instead of
// FMA latency, and each loaded vector feeds several chains.
template <int R, int C>
void Block(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
           float* c, int64_t ldc) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 vb[C];
    for (int j = 0; j < C; ++j) vb[j] = _mm256_loadu_ps(b + j * ldb + i);
    for (int r = 0; r < R; ++r) {
      const __m256 va = _mm256_loadu_ps(a + r * lda + i);
      for (int j = 0; j < C; ++j)
        acc[r][j] = _mm256_fmadd_ps(va, vb[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j)
      c[j * ldc + r] = Finish(acc[r][j], a + r * lda, b + j * ldb, i, k);
}

using BlockFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t,
                         float*, int64_t);
constexpr int kRows = 4;  // rows of a per block
constexpr int kCols = 3;  // rows of b per block: 12 accumulators + 3 + 1
constexpr BlockFn kBlocks[kRows][kCols] = {
    {Block<1, 1>, Block<1, 2>, Block<1, 3>},
    {Block<2, 1>, Block<2, 2>, Block<2, 3>},
    {Block<3, 1>, Block<3, 2>, Block<3, 3>},
    {Block<4, 1>, Block<4, 2>, Block<4, 3>},
};

// out[r, i..i+8V) = Σ_s p[r, s]·rows[s, i..i+8V) for R rows of p: R·V
// accumulators, one broadcast of p per row and V loads of `rows` per s.
// Each element is a chain of FMAs over s = 0, 1, ... from 0, the order of
// the generic Axpy loop.
template <int R, int V>
void SumBlock(const float* p, int64_t ldp, const float* rows, int64_t ldr,
              int64_t count, float* out, int64_t ldo) {
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t s = 0; s < count; ++s) {
    __m256 vr[V];
    for (int v = 0; v < V; ++v) vr[v] = _mm256_loadu_ps(rows + s * ldr + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(p + r * ldp + s);
      for (int v = 0; v < V; ++v)
        acc[r][v] = _mm256_fmadd_ps(w, vr[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      _mm256_storeu_ps(out + r * ldo + 8 * v, acc[r][v]);
}

using SumBlockFn = void (*)(const float*, int64_t, const float*, int64_t,
                            int64_t, float*, int64_t);
constexpr int kSumRows = 4;
constexpr int kSumVectors = 3;  // 12 accumulators + 3 row vectors + 1
constexpr SumBlockFn kSumBlocks[kSumRows][kSumVectors] = {
    {SumBlock<1, 1>, SumBlock<1, 2>, SumBlock<1, 3>},
    {SumBlock<2, 1>, SumBlock<2, 2>, SumBlock<2, 3>},
    {SumBlock<3, 1>, SumBlock<3, 2>, SumBlock<3, 3>},
    {SumBlock<4, 1>, SumBlock<4, 2>, SumBlock<4, 3>},
};

}  // namespace

float Dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  }
  return Finish(acc, a, b, i, n);
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i),
                                            _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] = std::fma(alpha, x[i], y[i]);
}

void DotMatrix(const float* a, int64_t lda, int64_t m, const float* b,
               int64_t ldb, int64_t n, int64_t k, float* c, int64_t ldc) {
  // b rows outermost: the kCols rows of b stay in L1 while a streams by.
  for (int64_t j = 0; j < n; j += kCols) {
    const int64_t cols = std::min<int64_t>(kCols, n - j);
    for (int64_t r = 0; r < m; r += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, m - r);
      kBlocks[rows - 1][cols - 1](a + r * lda, lda, b + j * ldb, ldb, k,
                                  c + j * ldc + r, ldc);
    }
  }
}

void WeightedRowSums(const float* p, int64_t ldp, int64_t m, const float* rows,
                     int64_t ldr, int64_t count, int64_t width, float* out,
                     int64_t ldo) {
  const int64_t vectors = width / 8;
  for (int64_t r = 0; r < m; r += kSumRows) {
    const int64_t nr = std::min<int64_t>(kSumRows, m - r);
    for (int64_t v = 0; v < vectors; v += kSumVectors) {
      const int64_t nv = std::min<int64_t>(kSumVectors, vectors - v);
      kSumBlocks[nr - 1][nv - 1](p + r * ldp, ldp, rows + 8 * v, ldr, count,
                                 out + r * ldo + 8 * v, ldo);
    }
    for (int64_t i = vectors * 8; i < width; ++i) {
      for (int64_t rr = r; rr < r + nr; ++rr) {
        float acc = 0;
        for (int64_t s = 0; s < count; ++s)
          acc = std::fma(p[rr * ldp + s], rows[s * ldr + i], acc);
        out[rr * ldo + i] = acc;
      }
    }
  }
}

}  // namespace tierkv::executor::avx2
