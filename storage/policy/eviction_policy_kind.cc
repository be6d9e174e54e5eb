// EvictionPolicyKind: names.
#include "storage/policy/eviction_policy_kind.h"

#include <fmt/format.h>

namespace tierkv::storage {

Result<EvictionPolicyKind> ParseEvictionPolicy(std::string_view name) {
  if (name == "lru") return EvictionPolicyKind::kLru;
  if (name == "2q") return EvictionPolicyKind::kTwoQueue;
  if (name == "s3fifo") return EvictionPolicyKind::kS3Fifo;
  if (name == "topk") return EvictionPolicyKind::kTopk;
  if (name == "weights") return EvictionPolicyKind::kWeights;
  return Status::InvalidArgument(fmt::format(
      "unknown eviction policy '{}' (known: lru, 2q, s3fifo, topk, weights)",
      name));
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
    case EvictionPolicyKind::kWeights:
      return "weights";
  }
  return "unknown";
}

}  // namespace tierkv::storage
