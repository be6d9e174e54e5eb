// Feed-forward blocks: the dense SwiGLU MLP and the DeepSeek/GLM MoE
// (glm5-dsa.md §2.3).
//
// Routing (noaux_tc): s = sigmoid(gate · x); choice = s +
// e_score_correction_bias; with n_group > 1 keep the topk_group groups with the
// largest sum of their top-2 choice scores; take the num_experts_per_tok best
// choices; weights = s of those (without bias), divided by their sum (+1e-20)
// when norm_topk_prob, times routed_scaling_factor. Output = Σ w_k·expert_k(x)
// + shared_experts(x), summed in routing order (deterministic).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "executor/config.h"
#include "executor/weights.h"

namespace tierkv::executor {

class ThreadPool;

struct ExpertRoute {
  std::vector<int32_t> experts;  // best first; ties: smaller id
  std::vector<float> weights;    // same order
};

ExpertRoute RouteToken(const ModelConfig& config,
                       std::span<const float> router_logits,
                       std::span<const float> correction_bias);

// out[t] = down(silu(gate(x[t])) * up(x[t])); x, out are [tokens, hidden].
void MlpForward(ThreadPool* pool, const MlpWeights& w, const float* x,
                int64_t tokens, float* out);

// out[t] = MoE(x[t]); x, out are [tokens, hidden].
void MoeForward(ThreadPool* pool, const ModelConfig& config,
                const MoeWeights& w, const float* x, int64_t tokens,
                float* out);

}  // namespace tierkv::executor
