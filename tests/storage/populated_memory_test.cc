// PopulatedMemory: small blocks come from the populated chunks in order
// until they are full, then from chunks mapped on demand; a freed block is
// the next one of its size handed out; large blocks come from the heap.
// heap_bytes counts everything beyond the populated chunks.
#include "storage/host/populated_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace tierkv::storage {
namespace {

TEST(PopulatedMemoryTest, BumpsFromPopulatedChunksAndRecyclesFreedBlocks) {
  PopulatedChunk chunk = PopulatedChunk::Map(8192);
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk.size(), 8192u);
  const std::byte* base = chunk.base();
  PopulatedMemory memory;
  memory.Add(std::move(chunk));
  EXPECT_EQ(memory.populated_bytes(), 8192u);

  void* a = memory.allocate(200, 8);  // a 208-byte block
  void* b = memory.allocate(200, 8);
  EXPECT_EQ(a, base);
  EXPECT_EQ(b, base + 208);
  std::memset(b, 1, 200);
  memory.deallocate(a, 200, 8);
  EXPECT_EQ(memory.allocate(200, 8), a);  // reused, not bumped
  void* c = memory.allocate(16, 8);       // another size: bumped
  EXPECT_EQ(c, base + 416);
  EXPECT_EQ(memory.heap_bytes(), 0u);
}

TEST(PopulatedMemoryTest, GrowsByChunksMappedOnDemandWhenFull) {
  PopulatedMemory memory;
  memory.Add(PopulatedChunk::Map(4096));
  for (int i = 0; i < 4096 / 256; ++i) (void)memory.allocate(256, 16);
  EXPECT_EQ(memory.heap_bytes(), 0u);
  void* spill = memory.allocate(256, 16);
  EXPECT_EQ(memory.heap_bytes(), PopulatedMemory::kGrowChunkBytes);
  std::memset(spill, 2, 256);  // the on-demand chunk is writable
  // A later populated chunk is used once the current one is full.
  memory.Add(PopulatedChunk::Map(4096));
  EXPECT_EQ(memory.populated_bytes(), 8192u);
}

TEST(PopulatedMemoryTest, LargeBlocksGoToTheHeap) {
  PopulatedMemory memory;
  memory.Add(PopulatedChunk::Map(1 << 20));
  const size_t big = PopulatedMemory::kMaxBlock + 1;
  void* p = memory.allocate(big, 16);
  EXPECT_EQ(memory.heap_bytes(), big);
  memory.deallocate(p, big, 16);
  EXPECT_EQ(memory.heap_bytes(), 0u);
  void* aligned = memory.allocate(64, 64);  // over-aligned: the heap too
  EXPECT_EQ(reinterpret_cast<uintptr_t>(aligned) % 64, 0u);
  EXPECT_EQ(memory.heap_bytes(), 64u);
  memory.deallocate(aligned, 64, 64);
  EXPECT_EQ(memory.heap_bytes(), 0u);
}

TEST(PopulatedMemoryTest, AnEmptyChunkAddsNothing) {
  PopulatedMemory memory;
  memory.Add(PopulatedChunk::Map(0));
  EXPECT_EQ(memory.populated_bytes(), 0u);
}

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer a freed block, and a chunk's unused tail, are
// poisoned: a use of an erased index node is caught as with malloc.
TEST(PopulatedMemoryDeathTest, FreedAndUnusedBytesArePoisoned) {
  PopulatedMemory memory;
  memory.Add(PopulatedChunk::Map(4096));
  auto* p = static_cast<char*>(memory.allocate(64, 8));
  p[63] = 1;  // handed out: addressable
  memory.deallocate(p, 64, 8);
  EXPECT_DEATH(static_cast<volatile char*>(p)[32] = 1, "use-after-poison");
  EXPECT_DEATH(static_cast<volatile char*>(p)[64 + 100] = 1,
               "use-after-poison");
}
#endif

}  // namespace
}  // namespace tierkv::storage
