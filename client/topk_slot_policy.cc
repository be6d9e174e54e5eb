// TopkSlotPolicy: the resident token least likely to be selected again
// goes first; sinks and the recent window go last.
//
// Eviction only ever chooses among tokens the current step did not select,
// so what matters is how likely a token that left the selection is to come
// back. Its score counts its returns: selections that follow a step which
// did not select it (the first one included), each weighing decay^(steps
// since). A step that keeps it selected (a stay) weighs kStayWeight: DSA
// keeps ~44% of a step's selection in the next (TensorRT-LLM's
// DeepSeek-V3.2 measurements), so a long run says less about coming back
// than as many returns would, but the indexer keeps the tokens it scores
// highest, so a stay says something. On the synthetic traces counting
// returns rather than selections saves 1-5 points more misses, and
// weighing stays 0.25 saves 0.1-1.2 points more than ignoring them (0.5 and
// 1 no better); recorded traces move by under 0.3 points either way
// (bench/RESULTS.md, tierkv-bench topk).
//
// Scores of tokens not selected all shrink by the same factor each step, so
// their order never changes while nobody returns; comparing two tokens
// needs only
//   key = ln(score at last return) + ln(1/decay) · last_return_step,
// fixed between returns. A min-heap of keys ranks the candidates: a
// selected token leaves it (its entry is invalidated by a per-slot
// version, lazy deletion) and comes back at the next step with its new
// key, so a selection and an eviction cost O(log slots); the heap is
// rebuilt when stale entries outnumber live ones 3 to 1.
#include <algorithm>
#include <cmath>

#include "client/slot_policy.h"

namespace tierkv::client_internal {
namespace {

constexpr double kStayWeight = 0.25;

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
    // Last step's selections are candidates again, ranked by their new
    // scores (while selected they stay out of the heap: popping and
    // setting aside hundreds of them per miss made a step O(k^2 log n)).
    for (uint32_t slot : selected_before_) {
      if (token_of_slot_[slot] >= 0 && !Protected(token_of_slot_[slot])) {
        Push(slot);
      }
    }
    selected_before_.clear();
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
      seen_.resize(t + 1, 0);
    }
    // A return counts 1, a stay (selected by the step before too)
    // kStayWeight: eviction only ever asks how likely a token that left is
    // to come back.
    const bool stay = seen_[t] != 0 && seen_[t] + 1 == step_;
    score_[t] = score_[t] * std::pow(options_.decay,
                                     static_cast<double>(step_ - last_[t])) +
                (stay ? kStayWeight : 1.0);
    last_[t] = step_;
    seen_[t] = step_;
    selected_step_[slot] = step_;
    version_[slot]++;  // out of the heap until the next step
    selected_before_.push_back(slot);
  }

  std::optional<uint32_t> Victim() override {
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), Later);
      const Entry e = heap_.back();
      heap_.pop_back();
      if (e.version != version_[e.slot]) continue;  // stale or selected
      const int32_t token = token_of_slot_[e.slot];
      if (token < 0 || Protected(token)) continue;  // re-ranked on leaving
      return e.slot;
    }
    return ProtectedVictim();
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
    seen_.clear();
    selected_before_.clear();
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

  // Protection is a preference: with every unprotected resident token
  // selected now, the protected one with the lowest key goes (sinks and
  // the window are O(sinks + recent_tokens) to scan).
  std::optional<uint32_t> ProtectedVictim() const {
    std::optional<uint32_t> best;
    double best_key = 0;
    auto consider = [&](int64_t t) {
      if (t < 0 || t >= static_cast<int64_t>(slot_of_token_.size())) return;
      const int32_t slot = slot_of_token_[static_cast<size_t>(t)];
      if (slot < 0 || selected_step_[static_cast<uint32_t>(slot)] == step_) {
        return;
      }
      const double key = Key(static_cast<size_t>(t));
      if (!best || key < best_key) {
        best = static_cast<uint32_t>(slot);
        best_key = key;
      }
    };
    for (int64_t t = 0; t < options_.sink_tokens; ++t) consider(t);
    for (int64_t t = window_start_;
         t < static_cast<int64_t>(slot_of_token_.size()); ++t) {
      consider(t);
    }
    return best;
  }

  double Key(size_t token) const {
    return std::log(score_[token]) +
           log_inverse_decay_ * static_cast<double>(last_[token]);
  }

  bool Protected(int32_t token) const {
    return token < static_cast<int64_t>(options_.sink_tokens) ||
           token >= window_start_;
  }

  void Push(uint32_t slot) {
    const auto t = static_cast<size_t>(token_of_slot_[slot]);
    heap_.push_back({Key(t), slot, ++version_[slot]});
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
  std::vector<uint64_t> last_;           // per token: its score's time
  std::vector<uint64_t> seen_;           // per token: its last selection
  std::vector<Entry> heap_;
  std::vector<uint32_t> selected_before_;  // slots selected this step
  int64_t window_start_ = 0;               // first token of the recent window
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
