// The batch-copy kernel (see copy_batch.h).
#include "storage/device/cuda/chunked_copy.cuh"
#include "storage/device/cuda/copy_batch.h"

namespace tierkv::storage::cuda {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
// Chunks a thread loads before it stores any: with 16-byte chunks a block
// has 16 KiB in flight, which hides the bus latency of reads from mapped
// host memory (as the row gather does, row_gather.cu).
constexpr uint32_t kChunksPerThread = 4;

__global__ void CopyBatchKernel(const CopyItem* __restrict__ items,
                                uint32_t count) {
  for (uint32_t i = blockIdx.x; i < count; i += gridDim.x) {
    const CopyItem item = items[i];
    CopyAligned<kThreadsPerBlock, kChunksPerThread>(item.src, item.dst,
                                                    item.bytes, threadIdx.x);
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
