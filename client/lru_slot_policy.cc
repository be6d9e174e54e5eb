// LruSlotPolicy: the least recently selected resident token goes first
// (HiSparse's exact LRU), as a doubly linked list over slot indices: O(1)
// per hook, no allocation after construction.
#include <algorithm>

#include "client/slot_policy.h"

namespace tierkv::client_internal {
namespace {

constexpr uint32_t kNone = UINT32_MAX;

class LruSlotPolicy final : public SlotPolicy {
 public:
  explicit LruSlotPolicy(uint32_t slots)
      : prev_(slots, kNone), next_(slots, kNone), linked_(slots, false) {}

  void BeginStep(uint64_t, int64_t) override { selected_in_step_ = 0; }

  // Front = most recent, so this step's selections gather at the front
  // and the back is one of them only when every linked slot is.
  void Selected(uint32_t slot, int32_t) override {
    Unlink(slot);
    prev_[slot] = kNone;
    next_[slot] = head_;
    (head_ == kNone ? tail_ : prev_[head_]) = slot;
    head_ = slot;
    linked_[slot] = true;
    count_++;
    selected_in_step_++;
  }

  std::optional<uint32_t> Victim() override {
    if (count_ <= selected_in_step_) return std::nullopt;
    return tail_;
  }

  void Emptied(uint32_t slot) override { Unlink(slot); }

  void Reset() override {
    std::fill(prev_.begin(), prev_.end(), kNone);
    std::fill(next_.begin(), next_.end(), kNone);
    std::fill(linked_.begin(), linked_.end(), false);
    head_ = tail_ = kNone;
    count_ = selected_in_step_ = 0;
  }

 private:
  void Unlink(uint32_t slot) {
    if (!linked_[slot]) return;
    const uint32_t p = prev_[slot], n = next_[slot];
    (p == kNone ? head_ : next_[p]) = n;
    (n == kNone ? tail_ : prev_[n]) = p;
    linked_[slot] = false;
    count_--;
  }

  std::vector<uint32_t> prev_, next_;
  std::vector<bool> linked_;
  uint32_t head_ = kNone, tail_ = kNone;
  uint32_t count_ = 0;  // linked (resident) slots
  uint32_t selected_in_step_ = 0;
};

}  // namespace

std::unique_ptr<SlotPolicy> NewLruSlotPolicy(uint32_t slots) {
  return std::make_unique<LruSlotPolicy>(slots);
}

}  // namespace tierkv::client_internal
