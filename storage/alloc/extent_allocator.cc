// ExtentAllocator: best fit over free extents indexed by offset and size
// (see extent_allocator.h).
#include "storage/alloc/extent_allocator.h"

#include <cassert>

namespace tierkv::storage {

ExtentAllocator::ExtentAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity & ~(alignment - 1)), alignment_(alignment) {
  assert(alignment != 0 && (alignment & (alignment - 1)) == 0);
  if (capacity_ > 0) InsertFree(0, capacity_);
}

void ExtentAllocator::InsertFree(uint64_t offset, uint64_t length) {
  free_by_offset_.emplace(offset, length);
  free_by_size_.emplace(length, offset);
}

void ExtentAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

std::optional<Extent> ExtentAllocator::Allocate(uint64_t length) {
  if (length == 0 || length > capacity_) return std::nullopt;
  const uint64_t need = RoundUp(length);
  auto fit = free_by_size_.lower_bound({need, 0});
  if (fit == free_by_size_.end()) return std::nullopt;
  const auto [free_len, offset] = *fit;
  EraseFree(free_by_offset_.find(offset));
  if (free_len > need) InsertFree(offset + need, free_len - need);
  allocated_ += need;
  return Extent{offset, need};
}

void ExtentAllocator::Free(const Extent& extent) {
  uint64_t offset = extent.offset;
  uint64_t length = extent.length;
  allocated_ -= length;
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && offset + length == next->first) {
    length += next->second;
    auto after = std::next(next);
    EraseFree(next);
    next = after;
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(offset, length);
}

bool ExtentAllocator::Reserve(const Extent& extent) {
  if (extent.length == 0 || extent.offset % alignment_ != 0 ||
      extent.length % alignment_ != 0 || extent.offset > capacity_ ||
      extent.length > capacity_ - extent.offset) {
    return false;
  }
  auto it = free_by_offset_.upper_bound(extent.offset);
  if (it == free_by_offset_.begin()) return false;
  --it;
  const uint64_t free_off = it->first;
  const uint64_t free_len = it->second;
  if (extent.offset + extent.length > free_off + free_len) return false;
  EraseFree(it);
  if (extent.offset > free_off) InsertFree(free_off, extent.offset - free_off);
  const uint64_t end = extent.offset + extent.length;
  if (free_off + free_len > end) InsertFree(end, free_off + free_len - end);
  allocated_ += extent.length;
  return true;
}

ExtentAllocatorStats ExtentAllocator::Stats() const {
  ExtentAllocatorStats s;
  s.capacity_bytes = capacity_;
  s.allocated_bytes = allocated_;
  s.free_bytes = capacity_ - allocated_;
  s.largest_free_bytes =
      free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.free_extents = free_by_offset_.size();
  return s;
}

}  // namespace tierkv::storage
