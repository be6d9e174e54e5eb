#include "tests/testing/memory_device.h"

#include <bit>
#include <cstring>

namespace tierkv::testing {

MemoryDevice::MemoryDevice(uint64_t size_bytes, uint32_t block_size,
                           uint32_t max_io_bytes)
    : Device(size_bytes, block_size, max_io_bytes),
      data_(std::make_unique<std::byte[]>(size_bytes)) {}

Result<size_t> MemoryDevice::ReadImpl(uint64_t offset,
                                      std::span<std::byte> dst) {
  std::memcpy(dst.data(), data_.get() + offset, dst.size());
  return dst.size();
}

Result<size_t> MemoryDevice::WriteImpl(uint64_t offset,
                                       std::span<const std::byte> src) {
  std::memcpy(data_.get() + offset, src.data(), src.size());
  return src.size();
}

Result<std::unique_ptr<storage::Device>> NewMemoryDevice(uint64_t size_bytes,
                                                         uint32_t block_size) {
  if (block_size == 0 || !std::has_single_bit(block_size) ||
      size_bytes % block_size != 0) {
    return Status::InvalidArgument(
        "memory device: block_size must be a power of two dividing the size");
  }
  return std::unique_ptr<storage::Device>(
      std::make_unique<MemoryDevice>(size_bytes, block_size));
}

}  // namespace tierkv::testing
