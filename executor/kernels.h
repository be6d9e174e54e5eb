// Kernels: the dense fp32 building blocks of the executor.
//
// All reductions accumulate in fp32 with a fixed lane structure (8 partial
// sums combined in a fixed order), so a result depends only on its inputs,
// never on threading or on how many tokens are batched together.
//
// Two implementations share that structure: generic (x86-64 baseline,
// separate multiply and add, vectorized by -O3 without -ffast-math) and
// AVX2 + FMA (kernels_avx2.cc, fused multiply-adds, register-blocked
// DotMatrix). The process picks one at first use: AVX2 when the CPU has
// AVX2 and FMA, unless TIERKV_EXECUTOR_KERNELS=generic. Every caller in a
// process uses the same one, so bit-identity between cache types, thread
// counts and chunkings holds within a process; across the two
// implementations results agree to rounding (~1e-6 relative).
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

// "avx2" or "generic": the implementation this process uses (see above).
const char* KernelIsa();

// c[j·ldc + i] = Dot(a_i, b_j, k) for i < m, j < n, where a_i = a + i·lda
// and b_j = b + j·ldb: every element bit-identical to a Dot call on the same
// rows, whatever m and n are. Serial.
void DotMatrix(const float* a, int64_t lda, int64_t m, const float* b,
               int64_t ldb, int64_t n, int64_t k, float* c, int64_t ldc);

// out[r·ldo + i] = Σ_s p[r·ldp + s]·rows[s·ldr + i] for r < m, i < width,
// accumulated over s = 0 .. count-1 in order from 0: each element equals
// zeroing it and calling Axpy(p[r, s], row_s, out_r, width) for s in order.
// (A matrix product P·ROWS whose reduction runs over rows; used where the
// reduced dimension is the slow one, e.g. Σ_s p_s c_s in attention.) Serial.
void WeightedRowSums(const float* p, int64_t ldp, int64_t m, const float* rows,
                     int64_t ldr, int64_t count, int64_t width, float* out,
                     int64_t ldo);

// y[t, o] = Σ_i w[o, i]·x[t, i] for t < tokens; w is [out, in] row-major
// (HF layout), x is [tokens, in], y is [tokens, out]; y[t, o] equals
// Dot(w_o, x_t, in) exactly. Parallel over blocks of (rows × tokens);
// `pool` may be null (serial).
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
