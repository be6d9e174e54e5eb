// WeightsPolicy (`weights`): a weights namespace's DRAM eviction order by
// the schedule its WeightsCatalog feeds it (issue 28; shared/reference/
// weights.md §5 "Policies").
//
// The catalog knows, per sealed shard, when it is next needed (kWeightsHint)
// and whether it is pinned (kWeightsPin); it folds that into one standing
// per chunk (the nearest next use over the shards naming it, pinned if any
// pinned shard names it) and hands the table over with SetSchedule. Order,
// first victim first:
//   1. chunks no hinted shard names, least recently used first;
//   2. hinted chunks, the farthest next use first (Belady: what is needed
//      last goes first), ties in the order they became evictable;
//   pinned chunks are never victims (held back, out of the order, until
//      their pin ends).
// Every chunk of one version shares the version's next use, so a version
// leaves DRAM together rather than a few chunks of each.
//
// The table outlives residency: a chunk evicted and promoted again comes
// back with its standing. It holds only hinted or pinned chunks (the
// catalog bounds them by what sealed shards name).
//
// Order: an ordered set (intrusive red-black tree) keyed by rank: band 1
// is [0, 2^62) (last use, tier ticks), band 2 is 2^62 + (2^61 - next use),
// so every hook is O(log n) and Victim O(1).
#include <algorithm>

#include "storage/policy/eviction_policy.h"

namespace tierkv::storage {
namespace {

constexpr uint64_t kHintedBand = uint64_t{1} << 62;
constexpr int64_t kFarthest = int64_t{1} << 61;

class WeightsPolicy final : public EvictionPolicy {
 public:
  ~WeightsPolicy() override { set_.clear(); }

  EvictionPolicyKind kind() const override {
    return EvictionPolicyKind::kWeights;
  }

  void Admit(PolicyState& s, uint64_t now) override {
    s.last_use = now;
    s.uses = 1;
  }

  void Use(PolicyState& s, uint64_t now) override {
    s.last_use = now;
    if (s.uses < UINT32_MAX) ++s.uses;
    // A hinted chunk's rank is its next use, not its last: it stays put.
    if (s.linked && s.rank < kHintedBand) Reinsert(s);
  }

  void Link(PolicyState& s, uint64_t now, LinkAt at) override {
    if (at == LinkAt::kNow) s.last_use = now;
    Place(s);
  }

  void Unlink(PolicyState& s) override {
    s.queue = kOut;
    if (!s.linked) return;
    set_.erase(set_.iterator_to(s));
    s.linked = false;
    bytes_ -= s.bytes;
  }

  PolicyState* Victim() override {
    return set_.empty() ? nullptr : &*set_.begin();
  }

  // Only the keys whose standing changed are re-ranked: a hint of one
  // shard moves that shard's chunks, not every hinted chunk's.
  std::vector<SegmentKey> SetSchedule(ScheduleTable table) override {
    std::vector<SegmentKey> changed;
    for (const auto& [key, standing] : table_) {
      const auto it = table.find(key);
      if (it == table.end() || !(it->second == standing)) {
        changed.push_back(key);
      }
    }
    for (const auto& [key, standing] : table) {
      if (!table_.contains(key)) changed.push_back(key);
    }
    table_ = std::move(table);
    return changed;
  }

  void Rerank(PolicyState& s) override {
    if (s.linked) {
      Reinsert(s);
    } else if (s.queue == kHeldBack) {
      Place(s);
    }
  }

  uint64_t linked_bytes() const override { return bytes_; }

 private:
  // PolicyState::queue: whether an evictable segment is held back (pinned).
  static constexpr uint8_t kOut = 0;
  static constexpr uint8_t kHeldBack = 1;

  // Links an evictable segment where its standing puts it, or holds it
  // back when it is pinned.
  void Place(PolicyState& s) {
    const auto it = table_.find(s.key);
    if (it != table_.end() && it->second.pinned) {
      s.queue = kHeldBack;
      return;
    }
    s.queue = kOut;
    s.rank = RankOf(s, it == table_.end() ? nullptr : &it->second);
    set_.insert(s);
    s.linked = true;
    bytes_ += s.bytes;
  }

  void Reinsert(PolicyState& s) {
    set_.erase(set_.iterator_to(s));
    s.linked = false;
    bytes_ -= s.bytes;
    Place(s);
  }

  static uint64_t RankOf(const PolicyState& s,
                         const ScheduleStanding* standing) {
    if (standing == nullptr || !standing->next_use_ms) {
      return std::min(s.last_use, kHintedBand - 1);
    }
    const int64_t next = std::clamp<int64_t>(*standing->next_use_ms,
                                             -kFarthest + 1, kFarthest - 1);
    return kHintedBand + static_cast<uint64_t>(kFarthest - next);
  }

  PolicySet set_;  // ascending rank: the victim first
  uint64_t bytes_ = 0;
  ScheduleTable table_;  // hinted or pinned chunks only
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewWeightsPolicy() {
  return std::make_unique<WeightsPolicy>();
}

}  // namespace tierkv::storage
