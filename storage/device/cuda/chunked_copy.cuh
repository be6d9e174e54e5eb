// The copy loop the row-gather and batch-copy kernels share: a group of
// kThreads threads (a warp, or a block) copies one run of bytes, each
// thread loading kChunks chunks before storing any, so that a group keeps
// kThreads * kChunks * 16 bytes in flight across the bus (reads of mapped
// host memory take a PCIe round trip each).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tierkv::storage::cuda {

// Copies bytes [0, bytes - bytes % sizeof(T)) in chunks of T (src and dst
// aligned to sizeof(T)), then the tail bytes one by one; `thread` is the
// caller's index in its group, in [0, kThreads).
template <typename T, uint32_t kThreads, uint32_t kChunks>
__device__ void CopyChunks(const std::byte* __restrict__ src,
                           std::byte* __restrict__ dst, uint64_t bytes,
                           uint32_t thread) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  const uint64_t n = bytes / sizeof(T);
  constexpr uint64_t kRound = uint64_t{kChunks} * kThreads;
  for (uint64_t first = 0; first < n; first += kRound) {
    T chunk[kChunks];
#pragma unroll
    for (uint32_t k = 0; k < kChunks; ++k) {
      const uint64_t i = first + k * kThreads + thread;
      if (i < n) chunk[k] = s[i];
    }
#pragma unroll
    for (uint32_t k = 0; k < kChunks; ++k) {
      const uint64_t i = first + k * kThreads + thread;
      if (i < n) d[i] = chunk[k];
    }
  }
  for (uint64_t i = n * sizeof(T) + thread; i < bytes; i += kThreads) {
    dst[i] = src[i];
  }
}

// CopyChunks in the widest chunks (16, 8, 4 or 1 bytes) both addresses are
// aligned to; the length needs no alignment (its tail goes byte by byte).
template <uint32_t kThreads, uint32_t kChunks>
__device__ void CopyAligned(const std::byte* __restrict__ src,
                            std::byte* __restrict__ dst, uint64_t bytes,
                            uint32_t thread) {
  const uintptr_t both =
      reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst);
  if (both % 16 == 0) {
    CopyChunks<uint4, kThreads, kChunks>(src, dst, bytes, thread);
  } else if (both % 8 == 0) {
    CopyChunks<uint2, kThreads, kChunks>(src, dst, bytes, thread);
  } else if (both % 4 == 0) {
    CopyChunks<uint32_t, kThreads, kChunks>(src, dst, bytes, thread);
  } else {
    CopyChunks<uint8_t, kThreads, kChunks>(src, dst, bytes, thread);
  }
}

}  // namespace tierkv::storage::cuda
