// The batch-copy kernel (see copy_batch.h).
#include "storage/device/cuda/copy_batch.h"

namespace tierkv::storage::cuda {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
// Chunks a thread loads before it stores any: with 16-byte chunks a block
// has 16 KiB in flight, which hides the bus latency of reads from mapped
// host memory (as the row gather does, row_gather.cu).
constexpr uint32_t kChunksPerThread = 4;

template <typename T>
__device__ void CopyWith(const std::byte* __restrict__ src,
                         std::byte* __restrict__ dst, uint64_t bytes) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  const uint64_t n = bytes / sizeof(T);
  constexpr uint64_t kRound = kChunksPerThread * kThreadsPerBlock;
  for (uint64_t first = 0; first < n; first += kRound) {
    T chunk[kChunksPerThread];
#pragma unroll
    for (uint32_t k = 0; k < kChunksPerThread; ++k) {
      const uint64_t i = first + k * kThreadsPerBlock + threadIdx.x;
      if (i < n) chunk[k] = s[i];
    }
#pragma unroll
    for (uint32_t k = 0; k < kChunksPerThread; ++k) {
      const uint64_t i = first + k * kThreadsPerBlock + threadIdx.x;
      if (i < n) d[i] = chunk[k];
    }
  }
  for (uint64_t i = n * sizeof(T) + threadIdx.x; i < bytes;
       i += kThreadsPerBlock) {
    dst[i] = src[i];
  }
}

__global__ void CopyBatchKernel(const CopyItem* __restrict__ items,
                                uint32_t count) {
  for (uint32_t i = blockIdx.x; i < count; i += gridDim.x) {
    const CopyItem item = items[i];
    const uintptr_t both = reinterpret_cast<uintptr_t>(item.src) |
                           reinterpret_cast<uintptr_t>(item.dst);
    if (both % 16 == 0) {
      CopyWith<uint4>(item.src, item.dst, item.bytes);
    } else if (both % 8 == 0) {
      CopyWith<uint2>(item.src, item.dst, item.bytes);
    } else if (both % 4 == 0) {
      CopyWith<uint32_t>(item.src, item.dst, item.bytes);
    } else {
      CopyWith<uint8_t>(item.src, item.dst, item.bytes);
    }
  }
}

}  // namespace

cudaError_t LaunchCopyBatch(const CopyItem* items, uint32_t count,
                            uint32_t max_blocks, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const uint32_t blocks = count < max_blocks ? count : max_blocks;
  CopyBatchKernel<<<blocks == 0 ? 1 : blocks, kThreadsPerBlock, 0, stream>>>(
      items, count);
  return cudaGetLastError();
}

}  // namespace tierkv::storage::cuda
