// PopulatedMemory: a memory resource that serves small allocations from
// chunks whose pages were populated ahead of use, then from the heap.
//
// Why: a host tier's index grows by one node (~250 B) per segment it holds,
// and into a fresh arena that growth is the only memory a Put allocates.
// Each new page of it costs a fault when first touched: ~1.3 us on bare
// metal, 12-28 us on the 2-core VM once the guest's recently used pages are
// gone (its host backs guest memory lazily), so that 72 KiB Puts into a
// fresh arena spent about a quarter of their time faulting in index nodes
// (bench/RESULTS.md, "fresh arena"). The arena is populated when it is
// created (the namespace's `prefault`); HostTier::ReserveIndex populates the
// index's memory for the segments the arena will hold the same way.
//
// Thread safety: none; the owner serializes calls (a host tier shard holds
// its lock). Chunk memory is returned only when the resource is destroyed:
// the pool resource above it recycles freed nodes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <vector>

namespace tierkv::storage {

// Anonymous memory with every page populated as written, unmapped on
// destruction. Empty (ok() false) when the mapping failed.
class PopulatedChunk {
 public:
  PopulatedChunk() = default;
  // Maps `bytes` rounded up to whole pages (mmap MAP_POPULATE). May take
  // long (a fault's worth per page): call it without locks held.
  static PopulatedChunk Map(size_t bytes);
  ~PopulatedChunk();
  PopulatedChunk(PopulatedChunk&& other) noexcept;
  PopulatedChunk& operator=(PopulatedChunk&& other) noexcept;

  bool ok() const { return base_ != nullptr; }
  std::byte* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  std::byte* base_ = nullptr;
  size_t size_ = 0;
};

class PopulatedMemory final : public std::pmr::memory_resource {
 public:
  // Larger requests always go to the heap: a big hash table's bucket
  // arrays, which the pool above does not recycle, and which would strand
  // chunk space each time the table grows. (A pool's chunk of 256 blocks of
  // 256 B is 64 KiB and a few bytes.)
  static constexpr size_t kMaxChunkAllocation = 128 * 1024;

  PopulatedMemory() = default;
  PopulatedMemory(const PopulatedMemory&) = delete;
  PopulatedMemory& operator=(const PopulatedMemory&) = delete;

  // Appends a chunk; allocations use it once the earlier ones are full.
  void Add(PopulatedChunk chunk);

  uint64_t populated_bytes() const { return populated_bytes_; }
  // Bytes allocated from the heap and not yet deallocated.
  uint64_t heap_bytes() const { return heap_bytes_; }

 private:
  void* do_allocate(size_t bytes, size_t alignment) override;
  void do_deallocate(void* p, size_t bytes, size_t alignment) override;
  bool do_is_equal(
      const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }
  bool InChunk(const void* p) const;

  std::vector<PopulatedChunk> chunks_;
  size_t current_ = 0;  // chunks before it are full
  size_t used_ = 0;     // bytes handed out from chunks_[current_]
  uint64_t populated_bytes_ = 0;
  uint64_t heap_bytes_ = 0;
};

}  // namespace tierkv::storage
