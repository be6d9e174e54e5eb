// PinnedStaging: buffers lent from the arena registered with the device,
// heap buffers when it is full, every byte back when the owners go.
#include "storage/device/pinned_staging.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "storage/device/device_backend.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

std::unique_ptr<DeviceBackend> Emulated() {
  auto b = OpenEmulatedBackend({.streams = 1});
  EXPECT_OK(b);
  return std::move(b).value();
}

TEST(PinnedStagingTest, LendsPinnedMemoryThenHeapMemoryAndTakesItBack) {
  auto device = Emulated();
  auto staging = PinnedStaging::Create(*device, 64 << 10);
  ASSERT_OK(staging);
  // The arena is registered: a second registration of it overlaps.
  PinnedStaging::Buffer a = (*staging)->Borrow(40000);
  ASSERT_TRUE(a.pinned);
  EXPECT_EQ(a.bytes.size(), 40000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.bytes.data()) % 4096, 0u);
  EXPECT_EQ(device->RegisterHost(a.bytes).code(), StatusCode::kAlreadyExists);
  PinnedStaging::Buffer b = (*staging)->Borrow(16384);
  ASSERT_TRUE(b.pinned);
  // 40 KiB + 16 KiB of 64 KiB lent: 20 KiB more does not fit.
  PinnedStaging::Buffer c = (*staging)->Borrow(20000);
  EXPECT_FALSE(c.pinned);
  ASSERT_EQ(c.bytes.size(), 20000u);
  c.bytes[19999] = std::byte{1};  // heap memory, writable
  PinnedStagingStats st = (*staging)->Stats();
  EXPECT_EQ(st.capacity_bytes, 64u << 10);
  EXPECT_EQ(st.in_use_bytes, (40u << 10) + (16u << 10));
  EXPECT_EQ(st.pinned_borrows, 2u);
  EXPECT_EQ(st.heap_borrows, 1u);
  // A copy of the owner keeps the bytes lent (a quarantined release).
  std::shared_ptr<void> kept = a.owner;
  a = {};
  b = {};
  EXPECT_EQ((*staging)->Stats().in_use_bytes, 40u << 10);
  kept.reset();
  EXPECT_EQ((*staging)->Stats().in_use_bytes, 0u);
  EXPECT_TRUE((*staging)->Borrow(60000).pinned);  // room again
}

TEST(PinnedStagingTest, AStagingThatEndsUnregistersItsArena) {
  auto device = Emulated();
  std::byte* base = nullptr;
  {
    auto staging = PinnedStaging::Create(*device, 8192);
    ASSERT_OK(staging);
    PinnedStaging::Buffer a = (*staging)->Borrow(8192);
    base = a.bytes.data();
  }
  EXPECT_EQ(device->UnregisterHost(base).code(), StatusCode::kNotFound);
  EXPECT_EQ(PinnedStaging::Create(*device, 0).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierkv::storage
