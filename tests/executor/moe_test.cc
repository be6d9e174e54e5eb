// Tests for executor/moe: noaux_tc routing.
#include "executor/moe.h"

#include <gtest/gtest.h>

#include <cmath>

#include "executor/presets.h"

namespace tierkv::executor {
namespace {

float Sig(float x) { return 1.0f / (1.0f + std::exp(-x)); }

TEST(RouteToken, BiasPicksExpertsButWeightsUseUnbiasedScores) {
  ModelConfig c = PresetConfig("tiny").value();
  c.n_group = 1;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.5;
  // 8 experts, top-2. Expert 7 has a low logit but a large bias.
  const std::vector<float> logits = {2.0f, 1.0f, 0, 0, 0, 0, 0, -1.0f};
  std::vector<float> bias(8, 0.0f);
  bias[7] = 5.0f;
  const ExpertRoute r = RouteToken(c, logits, bias);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{7, 0}));
  const float s7 = Sig(-1.0f), s0 = Sig(2.0f);
  EXPECT_NEAR(r.weights[0], 2.5f * s7 / (s7 + s0), 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5f * s0 / (s7 + s0), 1e-6);
}

TEST(RouteToken, GroupLimitedRoutingKeepsOnlyTheBestGroups) {
  ModelConfig c = PresetConfig("tiny").value();
  c.n_group = 4;     // groups {0,1} {2,3} {4,5} {6,7}
  c.topk_group = 1;  // keep one group
  c.norm_topk_prob = false;
  c.routed_scaling_factor = 1.0;
  // Expert 0 is the single best, but group {6,7} has the best top-2 sum.
  const std::vector<float> logits = {3.0f, -3.0f, 0, 0, 0, 0, 2.0f, 2.0f};
  const std::vector<float> bias(8, 0.0f);
  const ExpertRoute r = RouteToken(c, logits, bias);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{6, 7}));
  EXPECT_NEAR(r.weights[0], Sig(2.0f), 1e-6);  // not normalized
}

}  // namespace
}  // namespace tierkv::executor
