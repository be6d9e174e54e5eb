// TopkPolicy (`topk`): the segments sparse attention keeps selecting stay in
// DRAM; rarely selected ones go first (DESIGN.md §4).
//
// DeepSeek Sparse Attention reads, each decode step, only the rows of the
// tokens its indexer selects, and it keeps selecting some pages again and
// again (attention sinks, the recent window, the passages a question is
// about) while most of a long context is read rarely. Engines report how
// often each page's tokens were selected (SparseWorkingSet counts, sent
// with Client::ReportTopk every few steps); a segment's score is those
// reports plus one per use (a match, a read, a store), decaying by half
// every half_life_ticks of the tier's clock. The lowest score goes first,
// so under pressure the rarely selected latent pages leave DRAM (for NVMe,
// under a write policy) and the selected ones stay, where LRU would evict
// whatever a long prefill or another request touched last. The engine
// reports index-key segments with a larger weight than their page's
// latent rows (every decode step scans all index keys of a full layer).
//
// Order: every score decays by the same factor per tick, so two segments
// compare by   key = log2(score when last updated) + updated_at / half_life,
// which is fixed between a segment's updates: an ordered set (intrusive
// red-black tree, no allocation) of keys ranks the evictable segments, and
// every hook is O(log n). A non-negative double orders like its bit
// pattern, so the set is keyed by the key's bits (scores are >= 1 after
// any update, so keys are >= 0).
//
// History: an evicted segment's score is remembered (a ghost: key, score,
// when; ~80 B) for ghost_factor x the segments the tier holds, oldest
// forgotten first, and a segment stored again (promoted back from NVMe)
// starts from that score, decayed, plus one. Without it a page the indexer
// keeps selecting that once left DRAM comes back at score 1, below every
// segment that was resident at a report, and is the next victim: reports
// reach only resident segments, so the resident set at the first reports
// stays, selected or not.
#include <bit>
#include <cmath>

#include "storage/policy/eviction_policy.h"
#include "storage/policy/ghost_list.h"

namespace tierkv::storage {
namespace {

class TopkPolicy final : public EvictionPolicy {
 public:
  explicit TopkPolicy(const EvictionPolicyOptions& o)
      : half_life_(o.half_life_ticks > 0 ? o.half_life_ticks : 65536),
        ghost_factor_(o.ghost_factor) {}
  ~TopkPolicy() override { set_.clear(); }

  EvictionPolicyKind kind() const override { return EvictionPolicyKind::kTopk; }

  void Admit(PolicyState& s, uint64_t now) override {
    s.last_use = now;
    s.uses = 1;
    s.score = 1;
    s.scored_at = now;
    resident_++;
    if (auto ghost = ghost_.Take(s.key)) {
      s.score += Decayed(ghost->score, ghost->scored_at, now);
    }
  }

  void Evicted(const PolicyState& s) override {
    resident_--;
    ghost_.Remember(s.key, {s.score, s.scored_at},
                    GhostLimit(ghost_factor_, resident_));
  }

  void Use(PolicyState& s, uint64_t now) override {
    s.last_use = now;
    if (s.uses < UINT32_MAX) ++s.uses;
    Add(s, 1.0, now);
  }

  void Report(PolicyState& s, double weight, uint64_t now) override {
    if (weight > 0) Add(s, weight, now);
  }

  // A segment's place depends on its score alone: released or written
  // back, it goes where its key says.
  void Link(PolicyState& s, uint64_t, LinkAt) override {
    s.rank = RankOf(s);
    set_.insert(s);
    s.linked = true;
    bytes_ += s.bytes;
  }

  void Unlink(PolicyState& s) override {
    if (!s.linked) return;
    set_.erase(set_.iterator_to(s));
    s.linked = false;
    bytes_ -= s.bytes;
  }

  PolicyState* Victim() override {
    return set_.empty() ? nullptr : &*set_.begin();
  }

  uint64_t linked_bytes() const override { return bytes_; }

 private:
  double Decayed(double score, uint64_t at, uint64_t now) const {
    return score * std::exp2(-static_cast<double>(now - at) / half_life_);
  }

  void Add(PolicyState& s, double weight, uint64_t now) {
    s.score = Decayed(s.score, s.scored_at, now) + weight;
    s.scored_at = now;
    if (!s.linked) return;
    set_.erase(set_.iterator_to(s));
    s.rank = RankOf(s);
    set_.insert(s);
  }

  uint64_t RankOf(const PolicyState& s) const {
    const double key =
        std::max(0.0, std::log2(s.score) +
                          static_cast<double>(s.scored_at) / half_life_);
    return std::bit_cast<uint64_t>(key);
  }

  struct Ghost {
    double score = 0;
    uint64_t scored_at = 0;
  };

  const double half_life_;
  const double ghost_factor_;
  PolicySet set_;  // ascending rank: the victim first
  uint64_t bytes_ = 0;
  uint64_t resident_ = 0;   // admitted and not evicted
  GhostList<Ghost> ghost_;  // scores of evicted segments
};

}  // namespace

std::unique_ptr<EvictionPolicy> NewTopkPolicy(
    const EvictionPolicyOptions& options) {
  return std::make_unique<TopkPolicy>(options);
}

}  // namespace tierkv::storage
