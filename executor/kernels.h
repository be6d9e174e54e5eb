// Kernels: the dense fp32 building blocks of the executor.
//
// All reductions accumulate in fp32 with a fixed lane structure (8 partial
// sums combined in a fixed order), so a result depends only on its inputs,
// never on threading or on how many tokens are batched together; -O3
// vectorizes the lanes without -ffast-math.
#pragma once

#include <cstdint>
#include <span>

#include "executor/tensor.h"

namespace tierkv::executor {

class ThreadPool;

// Σ a[i]·b[i].
float Dot(const float* a, const float* b, int64_t n);
// y[i] += alpha·x[i].
void Axpy(float alpha, const float* x, float* y, int64_t n);

// y[t, o] = Σ_i w[o, i]·x[t, i] for t < tokens; w is [out, in] row-major
// (HF layout), x is [tokens, in], y is [tokens, out]. Parallel over output
// rows; `pool` may be null (serial).
void MatMul(ThreadPool* pool, const Tensor& w, const float* x, int64_t tokens,
            float* y);

// out = x·rsqrt(mean(x²) + eps)·w (in place allowed).
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out);
// out = (x - mean)·rsqrt(var + eps)·w + b (in place allowed).
void LayerNorm(const float* x, const float* w, const float* b, int64_t n,
               float eps, float* out);
// In place: x = softmax(x) with max subtraction.
void SoftmaxInPlace(float* x, int64_t n);
float Sigmoid(float x);
float Silu(float x);

}  // namespace tierkv::executor
