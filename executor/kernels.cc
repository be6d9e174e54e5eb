// Dense fp32 kernels (see kernels.h).
#include "executor/kernels.h"

#include <algorithm>
#include <cmath>

#include "executor/thread_pool.h"

namespace tierkv::executor {

float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  for (int k = 0; i < n; ++i, ++k) acc[k] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
         ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void MatMul(ThreadPool* pool, const Tensor& w, const float* x, int64_t tokens,
            float* y) {
  const int64_t out = w.rows(), in = w.cols();
  const float* wp = w.ptr();
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const float* row = wp + o * in;
      for (int64_t t = 0; t < tokens; ++t) {
        y[t * out + o] = Dot(row, x + t * in, in);
      }
    }
  };
  // ~32K multiply-adds per chunk keeps scheduling overhead small.
  const int64_t grain =
      std::max<int64_t>(1, 32768 / std::max<int64_t>(1, in * tokens));
  if (pool == nullptr) {
    body(0, out);
  } else {
    pool->ParallelFor(out, grain, body);
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
