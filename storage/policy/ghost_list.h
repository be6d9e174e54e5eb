// GhostList: the keys of segments an eviction policy evicted, each with a
// value (e.g. its score), so a policy can recognise a segment stored again
// soon after it left (2q, s3fifo: a reused segment; topk: its score).
//
// Bounded: Remember() forgets the oldest entries past `limit` (a policy
// passes a multiple of the segments the tier holds, so memory stays
// proportional to the tier: ~80 B per key). O(1) amortized per call.
//
// Thread safety: none (its policy's lock).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>

#include "tierkv/types.h"

namespace tierkv::storage {

// The value of a GhostList that remembers keys only.
struct Unit {};

// How many keys a policy remembers: ghost_factor x the segments its tier
// holds (+1, so an empty tier still remembers its last eviction).
inline size_t GhostLimit(double ghost_factor, uint64_t resident) {
  if (ghost_factor <= 0) return 0;
  return static_cast<size_t>(ghost_factor * static_cast<double>(resident + 1));
}

template <typename Value>
class GhostList {
 public:
  // Remembers `key` with `value` (replacing an earlier memory of it), then
  // forgets the oldest keys while more than `limit` are remembered.
  void Remember(const SegmentKey& key, Value value, size_t limit) {
    map_[key] = {std::move(value), ++seq_};
    order_.push_back({key, seq_});
    while (order_.size() > limit) {
      const auto& [old, seq] = order_.front();
      // Only the newest memory of a key may forget it.
      if (auto it = map_.find(old); it != map_.end() && it->second.seq == seq) {
        map_.erase(it);
      }
      order_.pop_front();
    }
  }

  // The value remembered for `key`, forgotten now; nullopt when none.
  std::optional<Value> Take(const SegmentKey& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    Value v = std::move(it->second.value);
    map_.erase(it);
    return v;
  }

 private:
  struct Entry {
    Value value;
    uint64_t seq;  // of the newest Remember of the key
  };
  std::unordered_map<SegmentKey, Entry> map_;
  std::deque<std::pair<SegmentKey, uint64_t>> order_;  // oldest first
  uint64_t seq_ = 0;
};

}  // namespace tierkv::storage
