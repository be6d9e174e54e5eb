// LruBlocks: an LRU cache of dense block ids (0 .. blocks-1) for the
// offline simulators (prefix_cache_sim.h, cluster_cache_sim.h): an
// intrusive doubly linked list in arrays, so every operation is O(1)
// without allocation. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace tierkv::tools {

class LruBlocks {
 public:
  static constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();

  // Room for `capacity` of `blocks` distinct ids.
  LruBlocks(uint32_t blocks, uint64_t capacity)
      : capacity_(capacity),
        prev_(blocks, kNil),
        next_(blocks, kNil),
        resident_(blocks, false) {}

  bool Contains(uint32_t block) const { return resident_[block]; }

  // Access `block` (at trace access `index`, unused by LRU).
  void Access(uint32_t block, size_t /*index*/) {
    if (resident_[block]) {
      Unlink(block);
    } else {
      resident_[block] = true;
      ++size_;
      ++inserted_;
    }
    PushMostRecent(block);
    while (size_ > capacity_) {
      const uint32_t victim = lru_;
      Unlink(victim);
      resident_[victim] = false;
      --size_;
      ++evicted_;
    }
  }

  uint64_t inserted() const { return inserted_; }
  uint64_t evicted() const { return evicted_; }

 private:
  void Unlink(uint32_t block) {
    (prev_[block] == kNil ? lru_ : next_[prev_[block]]) = next_[block];
    (next_[block] == kNil ? mru_ : prev_[next_[block]]) = prev_[block];
    prev_[block] = next_[block] = kNil;
  }
  void PushMostRecent(uint32_t block) {
    prev_[block] = mru_;
    (mru_ == kNil ? lru_ : next_[mru_]) = block;
    mru_ = block;
  }

  const uint64_t capacity_;
  std::vector<uint32_t> prev_;  // towards the LRU end
  std::vector<uint32_t> next_;  // towards the MRU end
  std::vector<bool> resident_;
  uint32_t lru_ = kNil;
  uint32_t mru_ = kNil;
  uint64_t size_ = 0;
  uint64_t inserted_ = 0;
  uint64_t evicted_ = 0;
};

}  // namespace tierkv::tools
