// SlotPolicy: which resident token of one SparseWorkingSet group is
// replaced next (include/tierkv/sparse_working_set.h). Internal to
// libtierkv; one instance per group, one thread.
//
// A step: BeginStep, then Selected for every id of the selection (hits
// first, then each miss after its slot is filled), asking Victim for a slot
// whenever a miss finds no free one. Victim never returns a slot selected
// in the current step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tierkv/sparse_working_set.h"

namespace tierkv::client_internal {

class SlotPolicy {
 public:
  virtual ~SlotPolicy() = default;
  // Step `step` (1, 2, ...) begins with `context_tokens` visible.
  virtual void BeginStep(uint64_t step, int64_t context_tokens) = 0;
  // `token`, now in `slot`, is selected in the current step.
  virtual void Selected(uint32_t slot, int32_t token) = 0;
  // The resident slot to replace, not selected in the current step;
  // nullopt when every resident slot is selected or protected.
  virtual std::optional<uint32_t> Victim() = 0;
  // `slot` was emptied by the working set (after Victim, or Reset).
  virtual void Emptied(uint32_t slot) = 0;
  virtual void Reset() = 0;
};

// `token_of_slot`: the group's map (-1: free), read by the policy, owned by
// the working set; it outlives the policy.
std::unique_ptr<SlotPolicy> NewLruSlotPolicy(uint32_t slots);
std::unique_ptr<SlotPolicy> NewTopkSlotPolicy(
    uint32_t slots, const WorkingSetOptions& options,
    const std::vector<int32_t>* token_of_slot,
    const std::vector<int32_t>* slot_of_token);

}  // namespace tierkv::client_internal
