// Deterministic token ids for executor tests.
#pragma once

#include <cstdint>
#include <vector>

namespace tierkv::executor {

// `n` ids below 128 (the tiny preset's vocabulary) from an LCG seeded with
// `seed`.
inline std::vector<int32_t> TestTokens(int64_t n, uint32_t seed = 7) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t s = seed;
  for (auto& v : t) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<int32_t>((s >> 8) % 128);
  }
  return t;
}

}  // namespace tierkv::executor
