// MemoryDevice: a Device backed by heap memory, for tests and benchmarks
// (a test double: it lives in tests/testing/, never in tierkvd).
//
// Behaves like a zero-filled block device of a fixed size with the same
// alignment rules as an O_DIRECT file (block_size defaults to 4096), so tests
// that run on it catch alignment bugs that would fail on NVMe. Flush is a
// no-op. Nothing persists past destruction.
//
// Thread safety: as Device. There is deliberately no internal lock: IOs to
// disjoint ranges run in parallel, and overlapping concurrent IOs are a data
// race that ThreadSanitizer reports, which is what tests of the callers'
// extent pinning want.
#pragma once

#include <cstdint>
#include <memory>

#include "storage/nvme/device.h"

namespace tierkv::testing {

class MemoryDevice final : public storage::Device {
 public:
  // REQUIRES: block_size a power of two, size_bytes a multiple of it,
  // max_io_bytes a non-zero multiple of it.
  explicit MemoryDevice(uint64_t size_bytes, uint32_t block_size = 4096,
                        uint32_t max_io_bytes = 1 << 20);

  // Direct access to the backing bytes (test inspection and corruption).
  std::span<std::byte> TEST_bytes() { return {data_.get(), size()}; }

 protected:
  Result<size_t> ReadImpl(uint64_t offset, std::span<std::byte> dst) override;
  Result<size_t> WriteImpl(uint64_t offset,
                           std::span<const std::byte> src) override;
  Status FlushImpl() override { return Status::OK(); }

 private:
  std::unique_ptr<std::byte[]> data_;
};

// Factory: InvalidArgument when the geometry is invalid.
Result<std::unique_ptr<storage::Device>> NewMemoryDevice(
    uint64_t size_bytes, uint32_t block_size = 4096);

}  // namespace tierkv::testing
