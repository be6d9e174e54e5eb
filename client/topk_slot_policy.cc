// TopkSlotPolicy: the resident token with the lowest decayed selection
// score goes first; sinks and the recent window are never evicted.
//
// A token's score after its selections at steps s_1 < ... < s_n, seen at
// step s, is Σ decay^(s - s_i). Scores of tokens not selected now all
// shrink by the same factor each step, so their order never changes while
// nobody is selected; comparing two tokens needs only
//   key = ln(score at last selection) + ln(1/decay) · last_selection_step,
// fixed between selections. So a min-heap of keys, updated when a token is
// selected, ranks every resident token: O(log slots) per selection and
// eviction. Entries are invalidated by a per-slot version instead of
// removed (lazy deletion), and the heap is rebuilt when stale entries
// outnumber live ones 3 to 1, so it stays O(slots).
#include <algorithm>
#include <cmath>

#include "client/slot_policy.h"

namespace tierkv::client_internal {
namespace {

class TopkSlotPolicy final : public SlotPolicy {
 public:
  TopkSlotPolicy(uint32_t slots, const WorkingSetOptions& o,
                 const std::vector<int32_t>* token_of_slot,
                 const std::vector<int32_t>* slot_of_token)
      : options_(o),
        log_inverse_decay_(-std::log(o.decay)),
        token_of_slot_(*token_of_slot),
        slot_of_token_(*slot_of_token),
        version_(slots, 0),
        selected_step_(slots, 0) {}

  void BeginStep(uint64_t step, int64_t context_tokens) override {
    step_ = step;
    const int64_t window = std::max<int64_t>(
        0, context_tokens - static_cast<int64_t>(options_.recent_tokens));
    // Tokens leaving the recent window become evictable: rank them now.
    for (int64_t t = std::max<int64_t>(window_start_, options_.sink_tokens);
         t < window; ++t) {
      if (t < static_cast<int64_t>(slot_of_token_.size()) &&
          slot_of_token_[t] >= 0) {
        Push(static_cast<uint32_t>(slot_of_token_[t]));
      }
    }
    window_start_ = std::max(window_start_, window);
  }

  void Selected(uint32_t slot, int32_t token) override {
    const auto t = static_cast<size_t>(token);
    if (t >= score_.size()) {
      score_.resize(t + 1, 0.0);
      last_.resize(t + 1, 0);
    }
    score_[t] = score_[t] * std::pow(options_.decay,
                                     static_cast<double>(step_ - last_[t])) +
                1.0;
    last_[t] = step_;
    selected_step_[slot] = step_;
    if (!Protected(token)) Push(slot);
  }

  std::optional<uint32_t> Victim() override {
    std::optional<uint32_t> victim;
    set_aside_.clear();
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), Later);
      const Entry e = heap_.back();
      heap_.pop_back();
      if (e.version != version_[e.slot]) continue;  // stale
      const int32_t token = token_of_slot_[e.slot];
      if (token < 0 || Protected(token)) continue;  // re-ranked on leaving
      if (selected_step_[e.slot] == step_) {
        set_aside_.push_back(e);  // needed now; still ranked
        continue;
      }
      victim = e.slot;
      break;
    }
    for (const Entry& e : set_aside_) {
      heap_.push_back(e);
      std::push_heap(heap_.begin(), heap_.end(), Later);
    }
    return victim;
  }

  void Emptied(uint32_t slot) override {
    version_[slot]++;
    selected_step_[slot] = 0;
  }

  void Reset() override {
    heap_.clear();
    std::fill(version_.begin(), version_.end(), 0);
    std::fill(selected_step_.begin(), selected_step_.end(), 0);
    score_.clear();
    last_.clear();
    window_start_ = 0;
    step_ = 0;
  }

 private:
  struct Entry {
    double key;
    uint32_t slot;
    uint32_t version;
  };
  // Min-heap on key; ties: the lower slot first (deterministic).
  static bool Later(const Entry& a, const Entry& b) {
    return a.key != b.key ? a.key > b.key : a.slot > b.slot;
  }

  bool Protected(int32_t token) const {
    return token < static_cast<int64_t>(options_.sink_tokens) ||
           token >= window_start_;
  }

  void Push(uint32_t slot) {
    const auto t = static_cast<size_t>(token_of_slot_[slot]);
    const double key = std::log(score_[t]) +
                       log_inverse_decay_ * static_cast<double>(last_[t]);
    heap_.push_back({key, slot, ++version_[slot]});
    std::push_heap(heap_.begin(), heap_.end(), Later);
    if (heap_.size() > 4 * version_.size()) Compact();
  }

  // Drops stale entries: one live entry per ranked slot remains.
  void Compact() {
    std::erase_if(heap_, [&](const Entry& e) {
      return e.version != version_[e.slot] || token_of_slot_[e.slot] < 0;
    });
    std::make_heap(heap_.begin(), heap_.end(), Later);
  }

  const WorkingSetOptions options_;
  const double log_inverse_decay_;
  const std::vector<int32_t>& token_of_slot_;
  const std::vector<int32_t>& slot_of_token_;
  std::vector<uint32_t> version_;        // per slot
  std::vector<uint64_t> selected_step_;  // per slot
  std::vector<double> score_;            // per token, at its last selection
  std::vector<uint64_t> last_;           // per token: its last selection
  std::vector<Entry> heap_;
  std::vector<Entry> set_aside_;
  int64_t window_start_ = 0;  // first token of the recent window
  uint64_t step_ = 0;
};

}  // namespace

std::unique_ptr<SlotPolicy> NewTopkSlotPolicy(
    uint32_t slots, const WorkingSetOptions& options,
    const std::vector<int32_t>* token_of_slot,
    const std::vector<int32_t>* slot_of_token) {
  return std::make_unique<TopkSlotPolicy>(slots, options, token_of_slot,
                                          slot_of_token);
}

}  // namespace tierkv::client_internal
