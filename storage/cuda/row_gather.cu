// The row-gather kernel (see row_gather.h).
#include <cstdint>

#include "storage/cuda/row_gather.h"

namespace tierkv::storage::cuda {
namespace {

constexpr unsigned kWarpsPerBlock = 8;
constexpr unsigned kThreadsPerWarp = 32;

__global__ void GatherRowsKernel(std::byte* __restrict__ dst,
                                 const uint32_t* __restrict__ dst_rows,
                                 const std::byte* const* __restrict__ rows,
                                 uint32_t count, uint32_t row_bytes) {
  const uint32_t row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= count) return;
  const unsigned lane = threadIdx.x % kThreadsPerWarp;
  const std::byte* src = rows[row];
  const uint32_t target = dst_rows == nullptr ? row : dst_rows[row];
  std::byte* out = dst + static_cast<uint64_t>(target) * row_bytes;
  const bool vector = row_bytes % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vector) {
    const auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(out);
    for (uint32_t i = lane; i < row_bytes / 16; i += kThreadsPerWarp) {
      d[i] = s[i];
    }
  } else {
    for (uint32_t i = lane; i < row_bytes; i += kThreadsPerWarp) {
      out[i] = src[i];
    }
  }
}

}  // namespace

cudaError_t LaunchGatherRows(std::byte* dst, const uint32_t* dst_rows,
                             const std::byte* const* rows, uint32_t count,
                             uint32_t row_bytes, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = (count + kWarpsPerBlock - 1) / kWarpsPerBlock;
  GatherRowsKernel<<<blocks, kWarpsPerBlock * kThreadsPerWarp, 0, stream>>>(
      dst, dst_rows, rows, count, row_bytes);
  return cudaGetLastError();
}

}  // namespace tierkv::storage::cuda
