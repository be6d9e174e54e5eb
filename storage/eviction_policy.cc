// EvictionPolicy: names and the factory.
#include "storage/eviction_policy.h"

#include <fmt/format.h>

namespace tierkv::storage {

Result<EvictionPolicyKind> ParseEvictionPolicy(std::string_view name) {
  if (name == "lru") return EvictionPolicyKind::kLru;
  if (name == "2q") return EvictionPolicyKind::kTwoQueue;
  return Status::InvalidArgument(
      fmt::format("unknown eviction policy '{}' (known: lru, 2q)", name));
}

std::string_view EvictionPolicyName(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kLru:
      return "lru";
    case EvictionPolicyKind::kTwoQueue:
      return "2q";
  }
  return "unknown";
}

std::unique_ptr<EvictionPolicy> NewEvictionPolicy(
    EvictionPolicyKind kind, const EvictionPolicyOptions& options) {
  switch (kind) {
    case EvictionPolicyKind::kLru:
      return NewLruPolicy();
    case EvictionPolicyKind::kTwoQueue:
      return NewTwoQueuePolicy(options);
  }
  return NewLruPolicy();
}

}  // namespace tierkv::storage
