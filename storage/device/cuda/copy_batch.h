// The batch-copy kernel's launcher (copy_batch.cu), for CudaBackend.
//
// Why a kernel: a batch of page-sized copies through the copy engines
// (cudaMemcpyBatchAsync, or one cudaMemcpyAsync each) pays a fixed cost per
// copy. On an H200 (tests/gpu, 1024 pages of 41 KiB) that held host ->
// device batches to 0.64x of one contiguous copy of the same bytes, and
// device -> device copies one by one to 0.01x, while the row-gather kernel
// reading mapped host memory reached 0.87x. The kernel costs SM time the
// copy engines would not, so CudaBackend takes it only for copies small
// enough that the engines' per-copy cost dominates.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tierkv::storage::cuda {

// One copy: `bytes` from `src` to `dst`, both addresses the device can
// read and write (device memory, or mapped registered host memory).
struct CopyItem {
  const std::byte* src;
  std::byte* dst;
  uint64_t bytes;
};

// The largest item the launcher takes: callers split bigger copies so that
// blocks share the work evenly.
inline constexpr uint64_t kCopyItemMaxBytes = 64 << 10;

// Copies every items[i] (`items` readable by the device; each at most
// kCopyItemMaxBytes; no item's destination overlapping another item's
// source or destination), one block of threads per item at a time, over
// at most `max_blocks` blocks, in the widest chunks (16, 8, 4 or 1 bytes)
// the item's two addresses are aligned to. Asynchronous on `stream`;
// returns the launch's error.
cudaError_t LaunchCopyBatch(const CopyItem* items, uint32_t count,
                            uint32_t max_blocks, cudaStream_t stream);

}  // namespace tierkv::storage::cuda
