// StagingPool: regions are reused, bounded, and safe to return late.
#include "storage/nvme/staging_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>

namespace tierkv::storage {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(StagingPoolTest, AReturnedRegionIsReusedForTheNextBatch) {
  StagingPool pool(64 * kMiB);
  EXPECT_TRUE(pool.Take(0).empty());
  std::byte* first = nullptr;
  {
    IoBuffer b = pool.Take(27 * kMiB);
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(b.size(), 32 * kMiB) << "a power of two, so 27 and 28 MiB share";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
    std::memset(b.data(), 0x5a, b.size());  // all of it is writable
    first = b.data();
    EXPECT_EQ(pool.pooled_bytes(), 0u) << "in use";
  }
  EXPECT_EQ(pool.pooled_bytes(), 32 * kMiB);
  IoBuffer again = pool.Take(28 * kMiB);
  EXPECT_EQ(again.data(), first) << "the same region, not a new mapping";
  EXPECT_EQ(pool.pooled_bytes(), 0u);
}

TEST(StagingPoolTest, PooledBytesStayUnderTheCapLargestKept) {
  StagingPool pool(8 * kMiB);
  {
    IoBuffer a = pool.Take(4 * kMiB);
    IoBuffer b = pool.Take(4 * kMiB);
    IoBuffer c = pool.Take(4 * kMiB);
    ASSERT_FALSE(a.empty());
    ASSERT_FALSE(b.empty());
    ASSERT_FALSE(c.empty());
    EXPECT_NE(a.data(), b.data());
  }
  EXPECT_EQ(pool.pooled_bytes(), 8 * kMiB) << "the third one was unmapped";
  {
    IoBuffer small = pool.Take(kMiB);
    EXPECT_EQ(small.size(), kMiB) << "a small batch maps its own size class";
    EXPECT_EQ(pool.pooled_bytes(), 8 * kMiB)
        << "and does not take a larger batch's region";
    IoBuffer big = pool.Take(8 * kMiB);
    ASSERT_FALSE(big.empty());
  }
  // Returned in reverse: 8 MiB first (dropping both 4 MiB regions to make
  // room), then 1 MiB (no room, and smaller than all: unmapped).
  EXPECT_EQ(pool.pooled_bytes(), 8 * kMiB);
  IoBuffer again = pool.Take(8 * kMiB);
  EXPECT_EQ(pool.pooled_bytes(), 0u) << "the 8 MiB region was kept, reused";
}

TEST(StagingPoolTest, ARegionMayOutliveThePool) {
  auto pool = std::make_unique<StagingPool>(64 * kMiB);
  IoBuffer b = pool->Take(kMiB);
  ASSERT_FALSE(b.empty());
  pool.reset();
  std::memset(b.data(), 1, b.size());  // still mapped
  b = IoBuffer();                      // returned to the pool's state
}

}  // namespace
}  // namespace tierkv::storage
