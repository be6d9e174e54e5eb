// Dense fp32 kernels (see kernels.h).
#include "executor/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "executor/kernels_avx2.h"
#include "executor/thread_pool.h"

namespace tierkv::executor {
namespace {

bool UseAvx2() {
  static const bool use = [] {
    const char* forced = std::getenv("TIERKV_EXECUTOR_KERNELS");
    if (forced != nullptr && std::string_view(forced) == "generic") {
      return false;
    }
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return use;
}

float GenericDot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  for (int k = 0; i < n; ++i, ++k) acc[k] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
         ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace

const char* KernelIsa() { return UseAvx2() ? "avx2" : "generic"; }

float Dot(const float* a, const float* b, int64_t n) {
  return UseAvx2() ? avx2::Dot(a, b, n) : GenericDot(a, b, n);
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
  if (UseAvx2()) return avx2::Axpy(alpha, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void DotMatrix(const float* a, int64_t lda, int64_t m, const float* b,
               int64_t ldb, int64_t n, int64_t k, float* c, int64_t ldc) {
  if (UseAvx2()) return avx2::DotMatrix(a, lda, m, b, ldb, n, k, c, ldc);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      c[j * ldc + i] = GenericDot(a + i * lda, b + j * ldb, k);
    }
  }
}

void WeightedRowSums(const float* p, int64_t ldp, int64_t m, const float* rows,
                     int64_t ldr, int64_t count, int64_t width, float* out,
                     int64_t ldo) {
  if (UseAvx2()) {
    return avx2::WeightedRowSums(p, ldp, m, rows, ldr, count, width, out, ldo);
  }
  for (int64_t r = 0; r < m; ++r) {
    float* o = out + r * ldo;
    std::fill(o, o + width, 0.0f);
    for (int64_t s = 0; s < count; ++s) {
      Axpy(p[r * ldp + s], rows + s * ldr, o, width);
    }
  }
}

void MatMul(ThreadPool* pool, const Tensor& w, const float* x, int64_t tokens,
            float* y) {
  const int64_t out = w.rows(), in = w.cols();
  const float* wp = w.ptr();
  // Square tasks of `block` weight rows × `block` tokens, each side about
  // 128 KiB, so a task's operands stay in L2 while it runs.
  const int64_t block =
      std::clamp<int64_t>(32768 / std::max<int64_t>(1, in), 4, 64) / 4 * 4;
  const int64_t row_blocks = (out + block - 1) / block;
  const int64_t token_blocks = (tokens + block - 1) / block;
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r0 = task / token_blocks * block;
      const int64_t t0 = task % token_blocks * block;
      DotMatrix(wp + r0 * in, in, std::min(block, out - r0), x + t0 * in, in,
                std::min(block, tokens - t0), in, y + t0 * out + r0, out);
    }
  };
  if (pool == nullptr) {
    body(0, row_blocks * token_blocks);
  } else {
    pool->ParallelFor(row_blocks * token_blocks, /*grain=*/1, body);
  }
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  const float ms = Dot(x, x, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(ms + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

void LayerNorm(const float* x, const float* w, const float* b, int64_t n,
               float eps, float* out) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  float var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(var + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - mean) * inv * w[i] + b[i];
}

void SoftmaxInPlace(float* x, int64_t n) {
  if (n <= 0) return;
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float Silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace tierkv::executor
