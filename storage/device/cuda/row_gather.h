// The row-gather kernel's launcher (row_gather.cu), for CudaBackend.
//
// Copies rows[i] (row_bytes each, addresses the device can read: device
// memory or mapped, registered host memory) to dst + t * row_bytes, where
// t is dst_rows[i] (the working set's slots) or i when dst_rows is NULL, one
// warp per row, in the widest chunks (16, 8, 4 or 1 bytes) the row's source
// and target addresses are both aligned to, the row's last bytes % chunk
// one by one (GLM-5's 656-byte fp8 latent row goes in 16-byte chunks; its
// 132-byte index-key row in 4-byte chunks where slots are 4-byte aligned).
// Each lane loads up to 4 chunks before storing them, so a warp keeps up
// to 2 KiB of a row in flight across the bus. `rows` and `dst_rows` are
// readable by the device (device memory, or mapped pinned host memory).
// Asynchronous on `stream`; returns the launch's error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tierkv::storage::cuda {

cudaError_t LaunchGatherRows(std::byte* dst, const uint32_t* dst_rows,
                             const std::byte* const* rows, uint32_t count,
                             uint32_t row_bytes, cudaStream_t stream);

}  // namespace tierkv::storage::cuda
