#include "storage/alloc/extent_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace tierkv::storage {
namespace {

TEST(ExtentAllocatorTest, RoundsToAlignmentAndBestFits) {
  ExtentAllocator a(1 << 20, 4096);
  auto e1 = a.Allocate(72 * 1024 + 1);
  ASSERT_TRUE(e1);
  EXPECT_EQ(e1->length, 76u * 1024);
  EXPECT_EQ(a.Stats().allocated_bytes, 76u * 1024);
  auto e2 = a.Allocate(8192);
  auto e3 = a.Allocate(4096);
  ASSERT_TRUE(e2 && e3);
  a.Free(*e2);  // leaves an 8 KiB hole before e3
  auto e4 = a.Allocate(4000);
  ASSERT_TRUE(e4);
  EXPECT_EQ(e4->offset, e2->offset) << "best fit takes the small hole";
}

TEST(ExtentAllocatorTest, CoalescesFreedNeighboursIntoOneExtent) {
  ExtentAllocator a(64 * 4096, 4096);
  std::vector<Extent> live;
  for (int i = 0; i < 64; ++i) live.push_back(*a.Allocate(4096));
  EXPECT_FALSE(a.Allocate(1));
  for (int i = 0; i < 64; i += 2) a.Free(live[i]);
  EXPECT_EQ(a.Stats().free_extents, 32u);
  EXPECT_GT(a.Stats().fragmentation(), 0.9);
  for (int i = 1; i < 64; i += 2) a.Free(live[i]);
  EXPECT_EQ(a.Stats().free_extents, 1u);
  EXPECT_EQ(a.Stats().largest_free_bytes, 64u * 4096);
  EXPECT_EQ(a.Stats().fragmentation(), 0.0);
}

TEST(ExtentAllocatorTest, ReserveCarvesExactRangesForRecovery) {
  ExtentAllocator a(16 * 4096, 4096);
  EXPECT_TRUE(a.Reserve({4096, 8192}));
  EXPECT_FALSE(a.Reserve({8192, 4096})) << "overlaps the first reservation";
  EXPECT_FALSE(a.Reserve({100, 4096})) << "misaligned";
  EXPECT_FALSE(a.Reserve({15 * 4096, 8192})) << "past the end";
  EXPECT_EQ(a.Stats().allocated_bytes, 8192u);
  auto e = a.Allocate(4096);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->offset, 0u);
}

TEST(ExtentAllocatorTest, RandomChurnKeepsAccountingExact) {
  ExtentAllocator a(1 << 24, 64);
  std::mt19937_64 rng(42);
  std::vector<Extent> live;
  uint64_t expected = 0;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      auto e = a.Allocate(1 + rng() % 200000);
      if (e) {
        live.push_back(*e);
        expected += e->length;
      }
    } else {
      size_t idx = rng() % live.size();
      a.Free(live[idx]);
      expected -= live[idx].length;
      live[idx] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(a.Stats().allocated_bytes, expected);
  }
  for (const auto& e : live) a.Free(e);
  EXPECT_EQ(a.Stats().free_extents, 1u);
}

}  // namespace
}  // namespace tierkv::storage
