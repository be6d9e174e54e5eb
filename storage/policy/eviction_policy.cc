// EvictionPolicy: the factory and the ordered insertion policies share.
#include "storage/policy/eviction_policy.h"

namespace tierkv::storage {

void InsertByRank(PolicyList& list, PolicyState& s) {
  auto front = list.begin();
  auto back = list.end();
  while (front != back) {
    if (front->rank <= s.rank) {  // s goes before the first not above it
      list.insert(front, s);
      return;
    }
    ++front;
    if (front == back) break;
    auto before = std::prev(back);
    if (before->rank >= s.rank) {  // s goes after the last not below it
      list.insert(back, s);
      return;
    }
    back = before;
  }
  list.insert(front, s);
}

std::unique_ptr<EvictionPolicy> NewEvictionPolicy(
    EvictionPolicyKind kind, const EvictionPolicyOptions& options) {
  switch (kind) {
    case EvictionPolicyKind::kLru:
      return NewLruPolicy();
    case EvictionPolicyKind::kTwoQueue:
      return NewTwoQueuePolicy(options);
    case EvictionPolicyKind::kS3Fifo:
      return NewS3FifoPolicy(options);
    case EvictionPolicyKind::kTopk:
      return NewTopkPolicy(options);
    case EvictionPolicyKind::kWeights:
      return NewWeightsPolicy();
  }
  return NewLruPolicy();
}

}  // namespace tierkv::storage
