// StagingPool: reusable page-aligned memory for the bounce buffers of a
// batch of direct-IO writes or reads, so a sustained demotion (or NVMe
// Load) stream neither zeroes nor page-faults its staging memory on every
// batch.
//
// Why: segments sit in the host arena at 64-byte alignment with arbitrary
// lengths, so O_DIRECT writes of them go through block-aligned copies. A
// heap buffer per segment (aligned_alloc, zero-filled) cost as much time as
// the device write itself: glibc hands a freed 30 MiB batch back to the
// kernel and the next batch faults it in again (bench/RESULTS.md, "nvme
// demotion staging"). This keeps a few mmap'd regions, pre-faulted once,
// and hands one out per batch (CacheLib navy's
// BufferManager, RocksDB's AlignedBuffer reuse, in one small class).
//
// Thread safety: thread-safe. A region may be returned (its IoBuffer
// destroyed) on any thread, also after the pool itself is gone.
#pragma once

#include <cstdint>
#include <memory>

#include "storage/nvme/io_buffer.h"

namespace tierkv::storage {

class StagingPool {
 public:
  // Keeps up to `max_pooled_bytes` of returned regions for reuse; larger
  // or further returns are unmapped.
  explicit StagingPool(uint64_t max_pooled_bytes);
  ~StagingPool();

  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A page-aligned region of at least `bytes` (the next power of two, from
  // 1 MiB: a pooled region of that size class if there is one) whose
  // contents are unspecified (callers write every byte they submit, or
  // read into it); empty when `bytes` is 0 or the memory cannot be mapped.
  // Destroying the IoBuffer returns the region to the pool, which keeps
  // the largest regions within its cap.
  IoBuffer Take(uint64_t bytes);

  // Bytes held for reuse now (tests, stats).
  uint64_t pooled_bytes() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace tierkv::storage
