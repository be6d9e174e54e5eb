// AVX2 + FMA versions of the kernels in kernels.h, compiled in their own
// translation unit with -mavx2 -mfma; kernels.cc calls them only when the
// CPU has both (see KernelIsa()). Internal to the executor: include
// kernels.h, not this header.
//
// Each function keeps the lane structure of its generic twin (8 partial
// sums over i in steps of 8, the n % 8 tail folded into lanes 0.., the lanes
// combined as ((0+4)+(1+5))+((2+6)+(3+7))), but every multiply-add is one
// fused FMA. So the AVX2 results differ from the generic ones in the last
// bits, and are exactly as batch- and thread-independent.
#pragma once

#include <cstdint>

namespace tierkv::executor::avx2 {

float Dot(const float* a, const float* b, int64_t n);
void Axpy(float alpha, const float* x, float* y, int64_t n);
void DotMatrix(const float* a, int64_t lda, int64_t m, const float* b,
               int64_t ldb, int64_t n, int64_t k, float* c, int64_t ldc);
void WeightedRowSums(const float* p, int64_t ldp, int64_t m, const float* rows,
                     int64_t ldr, int64_t count, int64_t width, float* out,
                     int64_t ldo);

}  // namespace tierkv::executor::avx2
