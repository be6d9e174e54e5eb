// Greedy and temperature sampling (see sampler.h).
#include "executor/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tierkv::executor {

Sampler::Sampler(const SamplerOptions& options)
    : options_(options), rng_(options.seed) {}

int32_t Sampler::Sample(std::span<const float> logits) {
  const auto n = static_cast<int32_t>(logits.size());
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  if (options_.greedy) return best;
  std::vector<double> p(logits.size());
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) {
    p[i] = std::exp((static_cast<double>(logits[i]) - logits[best]) /
                    options_.temperature);
    sum += p[i];
  }
  // 53 random bits -> [0, 1).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (int32_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return i;
  }
  return best;
}

}  // namespace tierkv::executor
