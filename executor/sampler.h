// Sampler: picks the next token from logits, greedily or by seeded
// temperature sampling (reproducible across platforms: it uses
// std::mt19937_64's fully specified output, not std::*_distribution).
//
// Thread safety: not thread-safe (holds RNG state).
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace tierkv::executor {

struct SamplerOptions {
  // Argmax (ties: smaller id). Default: true.
  bool greedy = true;
  // Softmax temperature for sampling; must be > 0. Default: 1.0.
  double temperature = 1.0;
  // RNG seed for sampling. Default: 0.
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  // REQUIRES: !logits.empty().
  int32_t Sample(std::span<const float> logits);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace tierkv::executor
