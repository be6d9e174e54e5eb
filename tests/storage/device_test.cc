// Device (NVI) contract: alignment and bounds checks, splitting, counters,
// batches; exercised through the test MemoryDevice and a recording backend.
#include "storage/nvme/device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "tests/testing/memory_device.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

using testing::MemoryDevice;

IoBuffer Filled(size_t bytes, uint8_t seed) {
  IoBuffer buf = IoBuffer::AllocateAligned(bytes, 4096);
  for (size_t i = 0; i < bytes; ++i) buf.data()[i] = std::byte(seed + i * 7);
  return buf;
}

// Records the (offset, length) of every Impl call.
class RecordingDevice final : public Device {
 public:
  RecordingDevice(uint64_t size, uint32_t max_io)
      : Device(size, 4096, max_io) {}
  std::vector<std::pair<uint64_t, size_t>> calls;

 protected:
  Result<size_t> ReadImpl(uint64_t offset, std::span<std::byte> dst) override {
    std::lock_guard lock(mu_);
    calls.emplace_back(offset, dst.size());
    return dst.size();
  }
  Result<size_t> WriteImpl(uint64_t offset,
                           std::span<const std::byte> src) override {
    std::lock_guard lock(mu_);
    calls.emplace_back(offset, src.size());
    return src.size();
  }
  Status FlushImpl() override { return Status::OK(); }

 private:
  std::mutex mu_;
};

TEST(Device, RejectsUnalignedOffsetLengthAndBuffer) {
  MemoryDevice dev(1 << 20);
  IoBuffer buf = IoBuffer::AllocateAligned(8192, 4096);
  EXPECT_EQ(dev.Read(100, buf.span().first(4096)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(dev.Read(0, buf.span().first(4000)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(dev.Write(0, buf.span().subspan(512, 4096)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(dev.Read(0, buf.span().first(0)).code(),
            StatusCode::kInvalidArgument);
  // Bad arguments are not device errors.
  EXPECT_EQ(dev.Stats().errors, 0u);
}

TEST(Device, RejectsIoPastTheEnd) {
  MemoryDevice dev(64 * 1024);
  IoBuffer buf = IoBuffer::AllocateAligned(8192, 4096);
  EXPECT_EQ(dev.Write(60 * 1024, buf.span()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(dev.Read(UINT64_MAX - 4095, buf.span().first(4096)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_OK(dev.Write(56 * 1024, buf.span()));
}

TEST(Device, SplitsIosLargerThanMaxIoBytes) {
  RecordingDevice dev(1 << 20, 8192);
  IoBuffer buf = IoBuffer::AllocateAligned(20480, 4096);
  ASSERT_OK(dev.Write(4096, buf.span()));
  std::vector<std::pair<uint64_t, size_t>> want = {
      {4096, 8192}, {12288, 8192}, {20480, 4096}};
  EXPECT_EQ(dev.calls, want);
  // Counted once, as the caller issued it.
  EXPECT_EQ(dev.Stats().write_ops, 1u);
  EXPECT_EQ(dev.Stats().write_bytes, 20480u);
}

TEST(Device, BatchReportsOneStatusPerRequest) {
  MemoryDevice dev(1 << 20);
  IoBuffer a = Filled(4096, 3);
  IoBuffer b = Filled(2 * 4096, 9);
  std::vector<IoRequest> batch = {
      {IoOp::kWrite, 0, a.span()},
      {IoOp::kWrite, 123, b.span()},  // misaligned
      {IoOp::kWrite, 8192, b.span()},
  };
  dev.SubmitBatch(batch);
  EXPECT_OK(batch[0].status);
  EXPECT_EQ(batch[0].result, 4096u);
  EXPECT_EQ(batch[1].status.code(), StatusCode::kInvalidArgument);
  EXPECT_OK(batch[2].status);
  IoBuffer back = IoBuffer::AllocateAligned(2 * 4096, 4096);
  ASSERT_OK(dev.Read(8192, back.span()));
  EXPECT_EQ(0, std::memcmp(back.data(), b.data(), b.size()));
}

TEST(Device, CompletionCallbackReportsEachRequestOnceWithItsFinalStatus) {
  MemoryDevice dev(1 << 20, 4096, /*max_io_bytes=*/8192);
  IoBuffer small = Filled(4096, 1);
  IoBuffer split = Filled(5 * 4096, 2);  // three chunks of <= 8 KiB
  std::vector<IoRequest> batch = {
      {IoOp::kWrite, 0, small.span()},
      {IoOp::kWrite, 100, small.span()},  // misaligned: never submitted
      {IoOp::kWrite, 8192, split.span()},
  };
  std::vector<int> calls(batch.size(), 0);
  dev.SubmitBatch(batch, [&](size_t i) {
    ++calls[i];
    // Final when reported: a split request only once all chunks are done.
    if (i == 2) {
      EXPECT_EQ(batch[i].result, split.size());
    }
    if (i == 1) {
      EXPECT_EQ(batch[i].status.code(), StatusCode::kInvalidArgument);
    }
  });
  EXPECT_EQ(calls, (std::vector<int>{1, 1, 1}));
  EXPECT_OK(batch[0].status);
  EXPECT_OK(batch[2].status);
}

TEST(Device, CountsOpsBytesAndLatency) {
  MemoryDevice dev(1 << 20);
  IoBuffer buf = Filled(4096, 5);
  ASSERT_OK(dev.Write(0, buf.span()));
  ASSERT_OK(dev.Read(0, buf.span()));
  ASSERT_OK(dev.Read(0, buf.span()));
  ASSERT_OK(dev.Flush());
  DeviceStats s = dev.Stats();
  EXPECT_EQ(s.write_ops, 1u);
  EXPECT_EQ(s.read_ops, 2u);
  EXPECT_EQ(s.read_bytes, 8192u);
  EXPECT_EQ(s.flush_ops, 1u);
  EXPECT_EQ(LatencyHistogram::SampleCount(s.read_latency), 2u);
}

TEST(LatencyHistogram, BucketsAreLog2Microseconds) {
  LatencyHistogram h;
  h.Record(std::chrono::nanoseconds(500));  // < 1 us
  h.Record(std::chrono::microseconds(3));   // [2, 4)
  h.Record(std::chrono::seconds(100));      // overflow bucket
  auto c = h.Snapshot();
  EXPECT_EQ(c[0], 1u);
  EXPECT_EQ(c[2], 1u);
  EXPECT_EQ(c[LatencyHistogram::kBuckets - 1], 1u);
}

}  // namespace
}  // namespace tierkv::storage
