// The row-gather kernel (see row_gather.h).
#include <cstdint>

#include "storage/device/cuda/chunked_copy.cuh"
#include "storage/device/cuda/row_gather.h"

namespace tierkv::storage::cuda {
namespace {

constexpr unsigned kWarpsPerBlock = 8;
constexpr unsigned kThreadsPerWarp = 32;
// Chunks a lane loads before it stores any: with 16-byte chunks a warp has
// 2 KiB of a row in flight (a 656-byte fp8 latent row whole), which hides
// the bus latency of rows read from mapped host memory.
constexpr uint32_t kChunksPerLane = 4;

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
  // A 132-byte index-key row lands in slots 4-byte aligned: 4-byte
  // chunks, not bytes.
  CopyAligned<kThreadsPerWarp, kChunksPerLane>(src, out, row_bytes, lane);
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
