// Rope: rotary position embedding for MLA and the indexer, with DeepSeek's
// YaRN frequency correction (glm5-dsa.md §1).
//
// inv_freq_i = theta^(-2i/d), i < d/2. Two layouts rotate the same angles:
//   interleaved (GPT-J): pairs (x[2i], x[2i+1]);
//   half-split (NeoX):   pairs (x[i], x[i + d/2]).
// With YaRN, inv_freq is blended with inv_freq/factor by the ramp of
// DeepSeek's precompute_freqs_cis, and cos/sin are scaled by
// yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) (vLLM;
// 1.0 for DeepSeek-V3.2). The attention-logit mscale² lives in
// ModelConfig::SoftmaxScale().
//
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <vector>

#include "executor/config.h"

namespace tierkv::executor {

class Rope {
 public:
  // `dim` = qk_rope_head_dim of `config`.
  explicit Rope(const ModelConfig& config);

  int64_t dim() const { return dim_; }
  const std::vector<double>& inv_freq() const { return inv_freq_; }

  // Rotates the `dim` values at x + h*stride for h < num_heads, at `pos`.
  void Apply(float* x, int64_t num_heads, int64_t stride, int64_t pos,
             bool interleaved) const;

 private:
  int64_t dim_;
  double cos_sin_scale_ = 1.0;
  std::vector<double> inv_freq_;
};

}  // namespace tierkv::executor
