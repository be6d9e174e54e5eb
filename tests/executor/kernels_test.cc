// Tests for executor/kernels: the batch-independence contract that chunked
// prefill, decode and the tier cache rely on (an output element never
// depends on how many rows or tokens are computed together), in whichever
// implementation this process picked (KernelIsa()).
#include "executor/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "executor/thread_pool.h"

namespace tierkv::executor {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(Kernels, IsaIsNamed) {
  const std::string isa = KernelIsa();
  EXPECT_TRUE(isa == "avx2" || isa == "generic") << isa;
}

TEST(Kernels, DotMatchesDoubleSumToRounding) {
  for (int64_t n : {1, 7, 8, 9, 64, 577}) {
    const auto a = Random(n, 1), b = Random(n, 2);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += double(a[i]) * b[i];
    EXPECT_NEAR(Dot(a.data(), b.data(), n), want, 1e-5 * std::sqrt(n)) << n;
  }
}

// Every block shape, every edge (m % 4, n % 3, k % 8 nonzero) and strides
// wider than the rows: each element must be exactly Dot of its two rows.
TEST(Kernels, DotMatrixElementsAreExactlyDot) {
  for (int64_t m : {1, 3, 4, 5, 11}) {
    for (int64_t n : {1, 2, 3, 7}) {
      for (int64_t k : {5, 8, 29, 64}) {
        const int64_t lda = k + 3, ldb = k + 1, ldc = m + 2;
        const auto a = Random(m * lda, 3), b = Random(n * ldb, 4);
        std::vector<float> c(n * ldc, -7.0f);
        DotMatrix(a.data(), lda, m, b.data(), ldb, n, k, c.data(), ldc);
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t i = 0; i < m; ++i) {
            ASSERT_EQ(c[j * ldc + i],
                      Dot(a.data() + i * lda, b.data() + j * ldb, k))
                << "m=" << m << " n=" << n << " k=" << k << " i=" << i
                << " j=" << j;
          }
          for (int64_t i = m; i < ldc; ++i) ASSERT_EQ(c[j * ldc + i], -7.0f);
        }
      }
    }
  }
}

TEST(Kernels, WeightedRowSumsAreExactlyAxpyInOrder) {
  for (int64_t m : {1, 4, 6}) {
    for (int64_t width : {3, 8, 24, 61}) {
      for (int64_t count : {1, 5, 40}) {
        const int64_t ldp = count + 2, ldr = width + 5, ldo = width + 1;
        const auto p = Random(m * ldp, 5), rows = Random(count * ldr, 6);
        std::vector<float> out(m * ldo, -7.0f);
        WeightedRowSums(p.data(), ldp, m, rows.data(), ldr, count, width,
                        out.data(), ldo);
        for (int64_t r = 0; r < m; ++r) {
          std::vector<float> want(width, 0.0f);
          for (int64_t s = 0; s < count; ++s) {
            Axpy(p[r * ldp + s], rows.data() + s * ldr, want.data(), width);
          }
          for (int64_t i = 0; i < width; ++i) {
            ASSERT_EQ(out[r * ldo + i], want[i])
                << "m=" << m << " width=" << width << " count=" << count;
          }
          ASSERT_EQ(out[r * ldo + width], -7.0f);
        }
      }
    }
  }
}

// MatMul of a chunk of tokens equals MatMul of each token alone, for any
// thread count: what makes chunked prefill bit-identical to decode.
TEST(Kernels, MatMulIsIndependentOfTokenBatchAndThreads) {
  Tensor w;
  w.shape = {203, 70};
  w.data = Random(203 * 70, 7);
  const int64_t tokens = 131;
  const auto x = Random(tokens * 70, 8);
  ThreadPool two(2);
  std::vector<float> batched(tokens * 203);
  MatMul(&two, w, x.data(), tokens, batched.data());
  std::vector<float> one(203);
  for (int64_t t = 0; t < tokens; ++t) {
    MatMul(nullptr, w, x.data() + t * 70, 1, one.data());
    for (int64_t o = 0; o < 203; ++o) {
      ASSERT_EQ(batched[t * 203 + o], one[o]) << "t=" << t << " o=" << o;
      ASSERT_EQ(one[o], Dot(w.ptr() + o * 70, x.data() + t * 70, 70));
    }
  }
}

}  // namespace
}  // namespace tierkv::executor
