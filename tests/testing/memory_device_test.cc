// MemoryDevice: a zero-filled, block-aligned heap device; what is written
// reads back, and the factory rejects bad geometry.
#include "tests/testing/memory_device.h"

#include <gtest/gtest.h>

#include <cstring>

#include "storage/nvme/io_buffer.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::testing {
namespace {

using storage::IoBuffer;

IoBuffer Filled(size_t bytes, uint8_t seed) {
  IoBuffer buf = IoBuffer::AllocateAligned(bytes, 4096);
  for (size_t i = 0; i < bytes; ++i) buf.data()[i] = std::byte(seed + i * 7);
  return buf;
}

TEST(MemoryDeviceTest, WritesThenReadsBackSameBytes) {
  MemoryDevice dev(1 << 20);
  IoBuffer src = Filled(3 * 4096, 1);
  ASSERT_OK(dev.Write(8192, src.span()));
  IoBuffer dst = IoBuffer::AllocateAligned(3 * 4096, 4096);
  ASSERT_OK(dev.Read(8192, dst.span()));
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), src.size()));
  EXPECT_EQ(
      0, std::memcmp(src.data(), dev.TEST_bytes().data() + 8192, src.size()));
}

TEST(MemoryDeviceTest, StartsZeroFilled) {
  MemoryDevice dev(64 * 1024);
  IoBuffer dst = Filled(4096, 9);
  ASSERT_OK(dev.Read(60 * 1024, dst.span()));
  for (size_t i = 0; i < dst.size(); ++i) {
    ASSERT_EQ(dst.data()[i], std::byte{0}) << "byte " << i;
  }
}

TEST(MemoryDeviceTest, FactoryRejectsBadGeometry) {
  EXPECT_FALSE(NewMemoryDevice(4096 * 3, 3000).ok());
  EXPECT_FALSE(NewMemoryDevice(5000, 4096).ok());
  EXPECT_OK(NewMemoryDevice(1 << 20));
}

}  // namespace
}  // namespace tierkv::testing
