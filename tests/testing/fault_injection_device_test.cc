// FaultInjectionDevice: every configured fault shows up exactly as asked,
// and the Device layer turns it into a Status (or transparently retries).
#include "tests/testing/fault_injection_device.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "storage/nvme/io_buffer.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::testing {
namespace {

using storage::IoBuffer;
using storage::IoOp;

class FaultInjectionDeviceTest : public ::testing::Test {
 protected:
  FaultInjectionDeviceTest()
      : memory_(std::make_shared<MemoryDevice>(1 << 20)), dev_(memory_) {
    buf_ = IoBuffer::AllocateAligned(4 * 4096, 4096);
    for (size_t i = 0; i < buf_.size(); ++i)
      buf_.data()[i] = std::byte(i * 13 + 1);
  }
  std::shared_ptr<MemoryDevice> memory_;
  FaultInjectionDevice dev_;
  IoBuffer buf_;
};

TEST_F(FaultInjectionDeviceTest, FailsExactlyTheNthIoWithItsErrno) {
  dev_.FailNthIo(3, EIO);
  EXPECT_OK(dev_.Write(0, buf_.span()));
  EXPECT_OK(dev_.Read(0, buf_.span()));
  Status third = dev_.Write(0, buf_.span());
  EXPECT_EQ(third.code(), StatusCode::kIOError);
  EXPECT_NE(third.message().find(std::strerror(EIO)), std::string_view::npos)
      << third.ToString();
  EXPECT_OK(dev_.Write(0, buf_.span()));
  EXPECT_EQ(dev_.injected_faults(), 1u);
  EXPECT_EQ(dev_.Stats().errors, 1u);
}

TEST_F(FaultInjectionDeviceTest, NthIoCanCountOnlyOneKindOfOp) {
  dev_.FailNthIo(1, EIO, IoOp::kRead);
  EXPECT_OK(dev_.Write(0, buf_.span()));
  EXPECT_EQ(dev_.Read(0, buf_.span()).code(), StatusCode::kIOError);
}

TEST_F(FaultInjectionDeviceTest, FullDeviceFailsWritesWithEnospcUntilCleared) {
  dev_.FailWrites(ENOSPC);
  Status s = dev_.Write(0, buf_.span());
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find(std::strerror(ENOSPC)), std::string_view::npos);
  EXPECT_EQ(dev_.Flush().code(), StatusCode::kIOError);
  EXPECT_OK(dev_.Read(0, buf_.span()));  // reads unaffected
  dev_.ClearFaults();
  EXPECT_OK(dev_.Write(0, buf_.span()));
  EXPECT_OK(dev_.Flush());
}

TEST_F(FaultInjectionDeviceTest, ShortTransfersAreResubmittedTransparently) {
  dev_.ShortIo(2);
  ASSERT_OK(dev_.Write(4096, buf_.span()));
  EXPECT_EQ(0, std::memcmp(memory_->TEST_bytes().data() + 4096, buf_.data(),
                           buf_.size()));
  EXPECT_EQ(dev_.Stats().short_ios, 2u);
}

TEST_F(FaultInjectionDeviceTest, NoProgressIsAnIOError) {
  dev_.StallIo(1);
  EXPECT_EQ(dev_.Read(0, buf_.span()).code(), StatusCode::kIOError);
}

TEST_F(FaultInjectionDeviceTest, CorruptReadsFlipReturnedBytesNotTheStore) {
  ASSERT_OK(dev_.Write(0, buf_.span()));
  dev_.CorruptReads(true);
  IoBuffer back = IoBuffer::AllocateAligned(buf_.size(), 4096);
  ASSERT_OK(dev_.Read(0, back.span()));
  EXPECT_NE(0, std::memcmp(back.data(), buf_.data(), buf_.size()));
  EXPECT_EQ(
      0, std::memcmp(memory_->TEST_bytes().data(), buf_.data(), buf_.size()));
  dev_.CorruptReads(false);
  ASSERT_OK(dev_.Read(0, back.span()));
  EXPECT_EQ(0, std::memcmp(back.data(), buf_.data(), buf_.size()));
}

TEST_F(FaultInjectionDeviceTest, CorruptStoredBytesChangesOnlyThatRange) {
  ASSERT_OK(dev_.Write(0, buf_.span()));
  ASSERT_OK(dev_.CorruptStoredBytes(5000, 3));  // unaligned range
  std::span<std::byte> stored = memory_->TEST_bytes();
  for (size_t i = 0; i < buf_.size(); ++i) {
    const bool flipped = i >= 5000 && i < 5003;
    EXPECT_EQ(stored[i],
              flipped ? (buf_.data()[i] ^ std::byte{0xFF}) : buf_.data()[i])
        << i;
  }
  EXPECT_EQ(dev_.CorruptStoredBytes(1 << 20, 1).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(FaultInjectionDeviceTest, ReconfiguringDuringIoIsThreadSafe) {
  std::thread io([&] {
    IoBuffer local = IoBuffer::AllocateAligned(4096, 4096);
    for (int i = 0; i < 2000; ++i) {
      dev_.Write(uint64_t(i % 16) * 4096, local.span()).PermitUncheckedError();
    }
  });
  for (int i = 0; i < 500; ++i) {
    dev_.FailWrites(i % 2 ? EIO : 0);
    dev_.ShortIo(1);
  }
  io.join();
  dev_.ClearFaults();
  EXPECT_OK(dev_.Write(0, buf_.span()));
}

}  // namespace
}  // namespace tierkv::testing
