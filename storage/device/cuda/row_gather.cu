// The row-gather kernel (see row_gather.h).
#include <cstdint>

#include "storage/device/cuda/row_gather.h"

namespace tierkv::storage::cuda {
namespace {

constexpr unsigned kWarpsPerBlock = 8;
constexpr unsigned kThreadsPerWarp = 32;
// Chunks a lane loads before it stores any: with 16-byte chunks a warp has
// 2 KiB of a row in flight (a 656-byte fp8 latent row whole), which hides
// the bus latency of rows read from mapped host memory.
constexpr uint32_t kChunksPerLane = 4;

// Copies bytes [0, bytes - bytes % sizeof(T)) of one row in chunks of T
// (src and out aligned to sizeof(T)), every lane loading all of its chunks
// of a round before storing them, then the tail bytes one by one. Returns
// nothing: the warp's lanes together cover the row.
template <typename T>
__device__ void CopyRow(const std::byte* __restrict__ src,
                        std::byte* __restrict__ out, uint32_t bytes,
                        unsigned lane) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(out);
  const uint32_t n = bytes / sizeof(T);
  constexpr uint32_t kRound = kChunksPerLane * kThreadsPerWarp;
  for (uint32_t first = 0; first < n; first += kRound) {
    T chunk[kChunksPerLane];
#pragma unroll
    for (uint32_t k = 0; k < kChunksPerLane; ++k) {
      const uint32_t i = first + k * kThreadsPerWarp + lane;
      if (i < n) chunk[k] = s[i];
    }
#pragma unroll
    for (uint32_t k = 0; k < kChunksPerLane; ++k) {
      const uint32_t i = first + k * kThreadsPerWarp + lane;
      if (i < n) d[i] = chunk[k];
    }
  }
  for (uint32_t i = n * sizeof(T) + lane; i < bytes; i += kThreadsPerWarp) {
    out[i] = src[i];
  }
}

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
  // The widest chunk both addresses are aligned to (a 132-byte index-key
  // row lands in slots 4-byte aligned: 4-byte chunks, not bytes); the row's
  // length needs no alignment, its tail goes byte by byte.
  const uintptr_t both =
      reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(out);
  if (both % 16 == 0) {
    CopyRow<uint4>(src, out, row_bytes, lane);
  } else if (both % 8 == 0) {
    CopyRow<uint2>(src, out, row_bytes, lane);
  } else if (both % 4 == 0) {
    CopyRow<uint32_t>(src, out, row_bytes, lane);
  } else {
    CopyRow<uint8_t>(src, out, row_bytes, lane);
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
