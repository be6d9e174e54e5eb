// EvictionPolicyKind: the eviction policies a namespace may name
// (`eviction_policy` in tierkvd's config; eviction_policy.h has the
// policies themselves).
#pragma once

#include <cstdint>
#include <string_view>

#include "tierkv/status.h"

namespace tierkv::storage {

enum class EvictionPolicyKind : uint8_t {
  kLru = 0,
  kTwoQueue = 1,
  kS3Fifo = 2,
  kTopk = 3,
  kWeights = 4,  // weights namespaces: by schedule hints and pins
};

// "lru" | "2q" | "s3fifo" | "topk" | "weights"; InvalidArgument naming the
// known ones otherwise.
Result<EvictionPolicyKind> ParseEvictionPolicy(std::string_view name);
std::string_view EvictionPolicyName(EvictionPolicyKind kind);

}  // namespace tierkv::storage
