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

// Absorbed MQA runs in three steps so that the two projections batch over
// every token of a chunk while the attention itself is per token (each
// token has its own selection):
//
//   AbsorbQueries   q_abs[t, h] = [W_UK[h]ᵀ q_nope[t, h], q_pe[t, h]]
//   AbsorbedAttend  o_lat[h] = Σ_s softmax_s(scale · q_abs[h]·c_s)
//   c_s[:kv_lora] ProjectValues   out[t, h] = W_UV[h] o_lat[t, h]
//
// Every output element depends only on its own token's inputs (kernels.h),
// so a chunk of n tokens gives the same bits as n one-token calls.

// q: [n, heads, nope + rope] with RoPE applied; q_abs: [n, heads,
// kv_lora + rope].
void AbsorbQueries(ThreadPool* pool, const MlaDims& d, const Tensor& kv_b,
                   const float* q, int64_t n, float* q_abs);

// One token. q_abs: [heads, kv_lora + rope]; latent: [num_selected,
// kv_lora + rope] rows of the selected tokens; o_lat: [heads, kv_lora].
// REQUIRES: num_selected >= 1.
void AbsorbedAttend(ThreadPool* pool, const MlaDims& d, const float* q_abs,
                    const float* latent, int64_t num_selected, float* o_lat);

// o_lat: [n, heads, kv_lora]; out: [n, heads, v].
void ProjectValues(ThreadPool* pool, const MlaDims& d, const Tensor& kv_b,
                   const float* o_lat, int64_t n, float* out);

// q as above; expanded: [num_selected, heads * (nope + v)] = kv_b_proj · c_s
// of the selected tokens; latent: their latent rows (for k_pe); out:
// [heads, v]. REQUIRES: num_selected >= 1.
void MhaAttention(ThreadPool* pool, const MlaDims& d, const float* q,
                  const float* expanded, const float* latent,
                  int64_t num_selected, float* out);

}  // namespace tierkv::executor
