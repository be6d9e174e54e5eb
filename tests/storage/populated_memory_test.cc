// PopulatedMemory: small allocations come from the populated chunks in
// order, aligned, until they are full; then, and for large requests, from
// the heap, whose live bytes it counts.
#include "storage/host/populated_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace tierkv::storage {
namespace {

TEST(PopulatedMemoryTest, ServesFromChunksThenFromTheHeap) {
  PopulatedChunk chunk = PopulatedChunk::Map(8192);
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk.size(), 8192u);
  const std::byte* base = chunk.base();
  PopulatedMemory memory;
  memory.Add(std::move(chunk));
  EXPECT_EQ(memory.populated_bytes(), 8192u);

  void* a = memory.allocate(100, 8);
  void* b = memory.allocate(100, 256);
  EXPECT_EQ(a, base);
  EXPECT_EQ(b, base + 256);  // aligned past a
  std::memset(b, 1, 100);
  // The rest of the chunk, then the heap.
  void* rest = memory.allocate(8192 - 360, 8);  // b ends at 356, 360 aligned
  EXPECT_EQ(rest, base + 360);
  EXPECT_EQ(memory.heap_bytes(), 0u);
  void* spill = memory.allocate(64, 8);
  EXPECT_EQ(memory.heap_bytes(), 64u);
  memory.deallocate(spill, 64, 8);
  EXPECT_EQ(memory.heap_bytes(), 0u);
  memory.deallocate(a, 100, 8);  // chunk memory: kept until destruction
  EXPECT_EQ(memory.heap_bytes(), 0u);
}

TEST(PopulatedMemoryTest, LargeRequestsGoToTheHeap) {
  PopulatedMemory memory;
  memory.Add(PopulatedChunk::Map(1 << 20));
  const size_t big = PopulatedMemory::kMaxChunkAllocation + 1;
  void* p = memory.allocate(big, 16);
  EXPECT_EQ(memory.heap_bytes(), big);
  memory.deallocate(p, big, 16);
  EXPECT_EQ(memory.heap_bytes(), 0u);
  void* small = memory.allocate(PopulatedMemory::kMaxChunkAllocation, 16);
  EXPECT_EQ(memory.heap_bytes(), 0u);  // fits the chunk
  memory.deallocate(small, PopulatedMemory::kMaxChunkAllocation, 16);
}

TEST(PopulatedMemoryTest, AFailedOrEmptyMappingAddsNothing) {
  PopulatedMemory memory;
  memory.Add(PopulatedChunk::Map(0));
  EXPECT_EQ(memory.populated_bytes(), 0u);
  void* p = memory.allocate(32, 8);
  EXPECT_EQ(memory.heap_bytes(), 32u);
  memory.deallocate(p, 32, 8);
}

}  // namespace
}  // namespace tierkv::storage
