// The row-gather kernel's launcher (row_gather.cu), for CudaBackend.
//
// Copies rows[i] (row_bytes each, addresses the device can read: device
// memory or mapped, registered host memory) to dst + t * row_bytes, where
// t is dst_rows[i] (the working set's slots) or i when dst_rows is NULL, one
// warp per row, 16-byte loads and stores where the row and its target are
// 16-byte aligned and row_bytes is a multiple of 16 (GLM-5's 656-byte fp8
// latent row and 1152-byte bf16 row both are), byte by byte otherwise.
// `rows` and `dst_rows` are themselves in device memory. Asynchronous on
// `stream`; returns the launch's error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tierkv::storage::cuda {

cudaError_t LaunchGatherRows(std::byte* dst, const uint32_t* dst_rows,
                             const std::byte* const* rows, uint32_t count,
                             uint32_t row_bytes, cudaStream_t stream);

}  // namespace tierkv::storage::cuda
