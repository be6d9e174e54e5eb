// Multi-head latent attention (MLA) over a selected set of cached tokens,
// in the two equivalent forms of glm5-dsa.md §2.2:
//
//   absorbed MQA: q_abs[h] = [W_UK[h]ᵀ q_nope[h], q_pe[h]] (kv_lora + rope),
//                 logits against the cached latent rows directly, output
//                 W_UV[h] · Σ p_s c_s. One shared K/V row per token; used
//                 for decode and long prefill.
//   MHA:          k_nope[s, h] = W_UK[h] c_s, v[s, h] = W_UV[h] c_s expanded
//                 per head; cheaper for short prompts.
//
// W_UK[h] = rows [h(nope+v), h(nope+v)+nope) of kv_b_proj, W_UV[h] the next
// v rows. Both forms use scale = ModelConfig::SoftmaxScale().
#pragma once

#include <cstdint>

#include "executor/tensor.h"

namespace tierkv::executor {

class ThreadPool;

struct MlaDims {
  int64_t heads = 0;
  int64_t nope = 0;     // qk_nope_head_dim
  int64_t rope = 0;     // qk_rope_head_dim
  int64_t v = 0;        // v_head_dim
  int64_t kv_lora = 0;  // kv_lora_rank
  float scale = 0;      // softmax scale
  int64_t latent_dim() const { return kv_lora + rope; }
  int64_t expanded_dim() const { return heads * (nope + v); }
};

// q: [heads, nope + rope] with RoPE applied; latent: [num_selected,
// kv_lora + rope] rows of the selected tokens; out: [heads, v].
// REQUIRES: num_selected >= 1.
void AbsorbedAttention(ThreadPool* pool, const MlaDims& d, const Tensor& kv_b,
                       const float* q, const float* latent,
                       int64_t num_selected, float* out);

// q as above; expanded: [num_selected, heads * (nope + v)] = kv_b_proj · c_s
// of the selected tokens; latent: their latent rows (for k_pe); out:
// [heads, v]. REQUIRES: num_selected >= 1.
void MhaAttention(ThreadPool* pool, const MlaDims& d, const float* q,
                  const float* expanded, const float* latent,
                  int64_t num_selected, float* out);

}  // namespace tierkv::executor
