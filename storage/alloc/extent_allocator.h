// ExtentAllocator: hands out [offset, offset+length) ranges of a linear space
// (a host arena or an NVMe file) for segments of arbitrary size.
//
// Policy: best fit over free extents kept in two ordered indexes (by offset
// for O(log n) coalescing on free, by size for O(log n) best fit), lengths
// rounded up to `alignment`. Waste bounds:
//   * internal: < alignment bytes per extent (e.g. < 64 B on a 72 KiB host
//     segment, < 4 KiB on NVMe);
//   * external: free neighbours are always coalesced, so the free space is
//     the minimum number of extents for the live set; what remains is
//     reported by Stats() (largest free extent vs free bytes) and callers
//     evict until an allocation fits.
//
// Thread safety: none; the owner serializes calls (every tier holds its own
// lock around it).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace tierkv::storage {

struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;  // rounded to the allocator's alignment
  friend bool operator==(const Extent&, const Extent&) = default;
};

struct ExtentAllocatorStats {
  uint64_t capacity_bytes = 0;
  uint64_t allocated_bytes = 0;  // sum of rounded lengths handed out
  uint64_t free_bytes = 0;
  uint64_t largest_free_bytes = 0;
  uint64_t free_extents = 0;
  // 1 - largest_free / free: 0 means all free space is one extent.
  double fragmentation() const {
    return free_bytes == 0
               ? 0.0
               : 1.0 - static_cast<double>(largest_free_bytes) / free_bytes;
  }
};

class ExtentAllocator {
 public:
  // REQUIRES: alignment is a power of two; capacity a multiple of it.
  ExtentAllocator(uint64_t capacity, uint64_t alignment);

  ExtentAllocator(const ExtentAllocator&) = delete;
  ExtentAllocator& operator=(const ExtentAllocator&) = delete;

  // Best-fit allocation of `length` bytes rounded up to the alignment.
  // Returns nullopt when no free extent is large enough (or length is 0).
  std::optional<Extent> Allocate(uint64_t length);

  // Returns an extent obtained from Allocate() or Reserve().
  // REQUIRES: `extent` is currently allocated, exactly as handed out.
  void Free(const Extent& extent);

  // Marks a specific range as allocated (used when rebuilding the state of a
  // persistent tier from its catalog). Returns false when any part of the
  // range is not free, is misaligned or lies outside the capacity.
  bool Reserve(const Extent& extent);

  uint64_t RoundUp(uint64_t length) const {
    return (length + alignment_ - 1) & ~(alignment_ - 1);
  }
  uint64_t alignment() const { return alignment_; }
  uint64_t capacity() const { return capacity_; }
  ExtentAllocatorStats Stats() const;

 private:
  void InsertFree(uint64_t offset, uint64_t length);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  const uint64_t capacity_;
  const uint64_t alignment_;
  uint64_t allocated_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (length, offset)
};

}  // namespace tierkv::storage
