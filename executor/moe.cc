// Dense MLP and MoE (see moe.h).
#include "executor/moe.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "executor/kernels.h"

namespace tierkv::executor {
namespace {

// Indices of the k largest values (ties: smaller index), best first.
std::vector<int32_t> BestK(std::span<const float> v, int64_t k) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min<int64_t>(k, static_cast<int64_t>(v.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) {
                      return v[a] > v[b] || (v[a] == v[b] && a < b);
                    });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

}  // namespace

ExpertRoute RouteToken(const ModelConfig& c, std::span<const float> logits,
                       std::span<const float> bias) {
  const int64_t e_count = c.n_routed_experts;
  std::vector<float> scores(static_cast<size_t>(e_count));
  std::vector<float> choice(static_cast<size_t>(e_count));
  for (int64_t e = 0; e < e_count; ++e) {
    scores[e] = Sigmoid(logits[e]);
    choice[e] = scores[e] + bias[e];
  }
  if (c.n_group > 1) {
    const int64_t per_group = e_count / c.n_group;
    std::vector<float> group_score(static_cast<size_t>(c.n_group));
    for (int64_t g = 0; g < c.n_group; ++g) {
      std::span<const float> grp(choice.data() + g * per_group,
                                 static_cast<size_t>(per_group));
      float sum = 0;
      for (int32_t i : BestK(grp, std::min<int64_t>(2, per_group)))
        sum += grp[i];
      group_score[g] = sum;
    }
    const std::vector<int32_t> keep = BestK(group_score, c.topk_group);
    std::vector<bool> kept(static_cast<size_t>(c.n_group), false);
    for (int32_t g : keep) kept[g] = true;
    for (int64_t e = 0; e < e_count; ++e) {
      if (!kept[e / per_group]) {
        choice[e] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  ExpertRoute r;
  r.experts = BestK(choice, c.num_experts_per_tok);
  float sum = 0;
  for (int32_t e : r.experts) {
    r.weights.push_back(scores[e]);
    sum += scores[e];
  }
  const float norm = c.norm_topk_prob ? 1.0f / (sum + 1e-20f) : 1.0f;
  for (float& w : r.weights) {
    w = w * norm * static_cast<float>(c.routed_scaling_factor);
  }
  return r;
}

void MlpForward(ThreadPool* pool, const MlpWeights& w, const float* x,
                int64_t tokens, float* out) {
  const int64_t inter = w.gate_proj.rows();
  std::vector<float> gate(static_cast<size_t>(tokens * inter));
  std::vector<float> up(static_cast<size_t>(tokens * inter));
  MatMul(pool, w.gate_proj, x, tokens, gate.data());
  MatMul(pool, w.up_proj, x, tokens, up.data());
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = Silu(gate[i]) * up[i];
  MatMul(pool, w.down_proj, gate.data(), tokens, out);
}

void MoeForward(ThreadPool* pool, const ModelConfig& c, const MoeWeights& w,
                const float* x, int64_t tokens, float* out) {
  const int64_t hidden = c.hidden_size;
  const int64_t e_count = c.n_routed_experts;
  const int64_t k = c.num_experts_per_tok;
  std::vector<float> logits(static_cast<size_t>(tokens * e_count));
  MatMul(pool, w.gate, x, tokens, logits.data());
  std::vector<ExpertRoute> routes(static_cast<size_t>(tokens));
  // Per expert: (token, slot) pairs routed to it.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> assigned(
      static_cast<size_t>(e_count));
  for (int64_t t = 0; t < tokens; ++t) {
    routes[t] = RouteToken(
        c, std::span<const float>(logits.data() + t * e_count, e_count),
        w.e_score_correction_bias.data);
    for (int64_t slot = 0; slot < k; ++slot) {
      assigned[routes[t].experts[slot]].push_back({t, slot});
    }
  }
  // Expert outputs per (token, slot), batched per expert.
  std::vector<float> slot_out(static_cast<size_t>(tokens * k * hidden));
  std::vector<float> xin, yout;
  for (int64_t e = 0; e < e_count; ++e) {
    const auto& list = assigned[e];
    if (list.empty()) continue;
    const int64_t n = static_cast<int64_t>(list.size());
    xin.resize(static_cast<size_t>(n * hidden));
    yout.resize(static_cast<size_t>(n * hidden));
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(xin.data() + i * hidden, x + list[i].first * hidden,
                  static_cast<size_t>(hidden) * 4);
    }
    MlpForward(pool, w.experts[e], xin.data(), n, yout.data());
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(
          slot_out.data() + (list[i].first * k + list[i].second) * hidden,
          yout.data() + i * hidden, static_cast<size_t>(hidden) * 4);
    }
  }
  std::vector<float> shared;
  if (w.shared_experts) {
    shared.resize(static_cast<size_t>(tokens * hidden));
    MlpForward(pool, *w.shared_experts, x, tokens, shared.data());
  }
  for (int64_t t = 0; t < tokens; ++t) {
    float* o = out + t * hidden;
    std::fill(o, o + hidden, 0.0f);
    for (int64_t slot = 0; slot < k; ++slot) {
      Axpy(routes[t].weights[slot], slot_out.data() + (t * k + slot) * hidden,
           o, hidden);
    }
    if (w.shared_experts) Axpy(1.0f, shared.data() + t * hidden, o, hidden);
  }
}

}  // namespace tierkv::executor
