// Offline LRU and Belady (MIN) prefix-cache simulators (see
// prefix_cache_sim.h).
#include "tools/prefix_cache_sim.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "tools/lru_blocks.h"
#include "tools/prefix_hit_rules.h"

namespace tierkv::tools {
namespace {

constexpr size_t kNeverAgain = std::numeric_limits<size_t>::max();

// Belady's MIN: a max-heap of (next use, block) with lazy deletion. An entry
// is current while its block is resident and its next use is the block's
// latest; next uses of one block strictly increase, so a stale entry never
// looks current.
class MinCache {
 public:
  MinCache(uint32_t blocks, uint64_t capacity, std::span<const size_t> next_use)
      : capacity_(capacity),
        next_use_(next_use),
        current_next_(blocks, kNeverAgain),
        resident_(blocks, false) {}

  bool Contains(uint32_t block) const { return resident_[block]; }

  void Access(uint32_t block, size_t index) {
    if (!resident_[block]) {
      resident_[block] = true;
      ++size_;
      ++inserted_;
    }
    current_next_[block] = next_use_[index];
    heap_.emplace_back(next_use_[index], block);
    std::push_heap(heap_.begin(), heap_.end());
    while (size_ > capacity_) {
      std::pop_heap(heap_.begin(), heap_.end());
      const auto [next, victim] = heap_.back();
      heap_.pop_back();
      if (!resident_[victim] || current_next_[victim] != next) continue;
      resident_[victim] = false;
      --size_;
      ++evicted_;
    }
  }

  uint64_t inserted() const { return inserted_; }
  uint64_t evicted() const { return evicted_; }

 private:
  const uint64_t capacity_;
  const std::span<const size_t> next_use_;
  std::vector<size_t> current_next_;
  std::vector<bool> resident_;
  std::vector<std::pair<size_t, uint32_t>> heap_;
  uint64_t size_ = 0;
  uint64_t inserted_ = 0;
  uint64_t evicted_ = 0;
};

// Applies the counting rules (prefix_hit_rules.h) with `cache`.
template <typename Cache>
void Replay(Cache& cache, std::span<const uint32_t> blocks,
            std::span<const size_t> request_begin, PrefixCacheResult& out) {
  for (size_t r = 0; r + 1 < request_begin.size(); ++r) {
    const size_t begin = request_begin[r];
    const size_t end = request_begin[r + 1];
    size_t leading = 0;
    while (begin + leading < end && cache.Contains(blocks[begin + leading])) {
      ++leading;
    }
    out.hit_blocks += leading;
    out.hit_tokens += HitTokens(leading);
    for (size_t i = begin; i < end; ++i) cache.Access(blocks[i], i);
  }
  out.inserted_blocks = cache.inserted();
  out.evicted_blocks = cache.evicted();
}

}  // namespace

std::string_view OfflinePolicyName(OfflinePolicy policy) {
  switch (policy) {
    case OfflinePolicy::kLru:
      return "lru";
    case OfflinePolicy::kBelady:
      return "belady";
  }
  return "unknown";
}

double PrefixCacheResult::TokenHitRate() const {
  return input_tokens == 0 ? 0.0
                           : static_cast<double>(hit_tokens) /
                                 static_cast<double>(input_tokens);
}

PrefixCacheSimulator::PrefixCacheSimulator(
    std::span<const TraceRequest> requests)
    : trace_(requests) {
  const std::vector<uint32_t>& blocks = trace_.blocks;
  next_use_.assign(blocks.size(), kNeverAgain);
  std::vector<size_t> seen_next(trace_.distinct_blocks, kNeverAgain);
  for (size_t i = blocks.size(); i-- > 0;) {
    next_use_[i] = seen_next[blocks[i]];
    seen_next[blocks[i]] = i;
  }
}

PrefixCacheResult PrefixCacheSimulator::Run(OfflinePolicy policy,
                                            uint64_t capacity_blocks) const {
  return policy == OfflinePolicy::kLru ? Lru(capacity_blocks)
                                       : Belady(capacity_blocks);
}

PrefixCacheResult PrefixCacheSimulator::Totals(uint64_t capacity_blocks) const {
  PrefixCacheResult out;
  out.capacity_blocks = capacity_blocks;
  out.requests = trace_.requests();
  for (uint64_t tokens : trace_.input_tokens) out.input_tokens += tokens;
  out.accessed_blocks = trace_.blocks.size();
  return out;
}

PrefixCacheResult PrefixCacheSimulator::Lru(uint64_t capacity_blocks) const {
  PrefixCacheResult out = Totals(capacity_blocks);
  LruBlocks cache(trace_.distinct_blocks, capacity_blocks);
  Replay(cache, trace_.blocks, trace_.request_begin, out);
  return out;
}

PrefixCacheResult PrefixCacheSimulator::Belady(uint64_t capacity_blocks) const {
  PrefixCacheResult out = Totals(capacity_blocks);
  MinCache cache(trace_.distinct_blocks, capacity_blocks, next_use_);
  Replay(cache, trace_.blocks, trace_.request_begin, out);
  return out;
}

}  // namespace tierkv::tools
