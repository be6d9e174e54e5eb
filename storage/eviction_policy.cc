// EvictionPolicy: names and the factory.
#include "storage/eviction_policy.h"

#include <fmt/format.h>

namespace tierkv::storage {

Result<EvictionPolicyKind> ParseEvictionPolicy(std::string_view name) {
  if (name == "lru") return EvictionPolicyKind::kLru;
  if (name == "2q") return EvictionPolicyKind::kTwoQueue;
  if (name == "s3fifo") return EvictionPolicyKind::kS3Fifo;
  if (name == "topk") return EvictionPolicyKind::kTopk;
  return Status::InvalidArgument(fmt::format(
      "unknown eviction policy '{}' (known: lru, 2q, s3fifo, topk)", name));
}

std::string_view EvictionPolicyName(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kLru:
      return "lru";
    case EvictionPolicyKind::kTwoQueue:
      return "2q";
    case EvictionPolicyKind::kS3Fifo:
      return "s3fifo";
    case EvictionPolicyKind::kTopk:
      return "topk";
  }
  return "unknown";
}

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
  }
  return NewLruPolicy();
}

}  // namespace tierkv::storage
