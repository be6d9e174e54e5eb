// PopulatedMemory: the memory resource of a host tier shard's index: small
// blocks bumped from chunks whose pages were populated ahead of use (then
// from chunks mapped on demand), recycled through per-size free lists; large
// blocks from the heap.
//
// Why: a host tier's index grows by one node (~220 B) per segment it holds,
// and into a fresh arena that growth is the only memory a Put allocates.
// Each new page of it costs a fault when first touched: ~1.3 us on bare
// metal, 12-28 us on the 2-core VM once the guest's recently used pages are
// gone (its host backs guest memory lazily), so that 72 KiB Puts into a
// fresh arena spent about a quarter of their time faulting in index nodes
// (bench/RESULTS.md, "fresh arena"). The arena is populated when it is
// created (the namespace's `prefault`); HostTier::ReserveIndex populates the
// index's memory for the segments the arena will hold the same way.
// Why not std::pmr::unsynchronized_pool_resource over it: its per-block
// bookkeeping made an evicting Reserve ~20% slower than glibc malloc (1.18
// against 0.95 us at 8 KiB, `tierkv-bench eviction`); a node freed by an
// eviction is reused by the next reservation, and a free list does that in
// two stores.
//
// Thread safety: none; the owner serializes calls (a host tier shard holds
// its lock). Chunks are unmapped when the resource is destroyed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <vector>

namespace tierkv::storage {

// Anonymous memory, unmapped on destruction; with `populate`, every page is
// allocated now (as if written). Empty (ok() false) when mapping failed.
class PopulatedChunk {
 public:
  PopulatedChunk() = default;
  // Maps `bytes` rounded up to whole pages. Populating takes a fault's
  // time per page: call it without locks held.
  static PopulatedChunk Map(size_t bytes, bool populate = true);
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
  // Blocks up to this size (an index node; small bucket arrays) come from
  // chunks and are recycled; larger ones (bucket arrays) from the heap.
  static constexpr size_t kMaxBlock = 512;
  static constexpr size_t kBlockAlign = 16;
  // A chunk mapped (not populated) when the populated ones are full.
  static constexpr size_t kGrowChunkBytes = 256 * 1024;

  PopulatedMemory() = default;
  PopulatedMemory(const PopulatedMemory&) = delete;
  PopulatedMemory& operator=(const PopulatedMemory&) = delete;

  // Adds a populated chunk; blocks come from it once the earlier chunks
  // are full (and before any chunk mapped on demand after it).
  void Add(PopulatedChunk chunk);

  uint64_t populated_bytes() const { return populated_bytes_; }
  // Memory beyond the populated chunks: chunks mapped on demand plus live
  // heap blocks.
  uint64_t heap_bytes() const { return heap_bytes_; }

 private:
  void* do_allocate(size_t bytes, size_t alignment) override;
  void do_deallocate(void* p, size_t bytes, size_t alignment) override;
  bool do_is_equal(
      const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }
  static bool Small(size_t bytes, size_t alignment) {
    return bytes <= kMaxBlock && alignment <= kBlockAlign;
  }
  // A fresh block of `bytes` (a multiple of kBlockAlign) from the chunks.
  void* Bump(size_t bytes);

  struct FreeBlock {
    FreeBlock* next;
  };
  // Free lists by size class (bytes / kBlockAlign).
  std::array<FreeBlock*, kMaxBlock / kBlockAlign + 1> free_{};
  std::vector<PopulatedChunk> chunks_;
  size_t current_ = 0;  // chunks before it are full
  size_t used_ = 0;     // bytes bumped from chunks_[current_]
  uint64_t populated_bytes_ = 0;
  uint64_t heap_bytes_ = 0;
};

}  // namespace tierkv::storage
