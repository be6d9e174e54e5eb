// Tests for executor/rope: both layouts, relative-position property, YaRN.
#include "executor/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "executor/kernels.h"
#include "executor/presets.h"

namespace tierkv::executor {
namespace {

ModelConfig RopeConfig() {
  ModelConfig c = PresetConfig("tiny").value();  // rope dim 8
  c.rope_theta = 100.0;
  return c;
}

// (h) Interleaved rotates (x0, x1); half-split rotates (x0, x4).
TEST(Rope, LayoutsRotateDifferentPairs) {
  const Rope rope(RopeConfig());
  const float angle = static_cast<float>(3 * rope.inv_freq()[0]);  // = 3 rad
  std::vector<float> a = {1, 0, 0, 0, 0, 0, 0, 0};
  rope.Apply(a.data(), 1, 8, /*pos=*/3, /*interleaved=*/true);
  EXPECT_NEAR(a[0], std::cos(angle), 1e-6);
  EXPECT_NEAR(a[1], std::sin(angle), 1e-6);
  EXPECT_EQ(a[4], 0.0f);
  std::vector<float> b = {1, 0, 0, 0, 0, 0, 0, 0};
  rope.Apply(b.data(), 1, 8, 3, /*interleaved=*/false);
  EXPECT_NEAR(b[0], std::cos(angle), 1e-6);
  EXPECT_NEAR(b[4], std::sin(angle), 1e-6);
  EXPECT_EQ(b[1], 0.0f);
}

// (h) For each layout, q·k after RoPE depends only on the position offset;
// mixing layouts between q and k breaks that.
TEST(Rope, BothLayoutsEncodeRelativePositionAndAreNotInterchangeable) {
  const Rope rope(RopeConfig());
  const std::vector<float> q0 = {0.3f,  -1.2f, 0.8f, 0.1f,
                                 -0.5f, 0.9f,  0.4f, -0.7f};
  const std::vector<float> k0 = {1.1f, 0.2f,  -0.3f, 0.6f,
                                 0.5f, -0.8f, 0.2f,  0.9f};
  auto score = [&](int64_t pq, int64_t pk, bool lq, bool lk) {
    auto q = q0, k = k0;
    rope.Apply(q.data(), 1, 8, pq, lq);
    rope.Apply(k.data(), 1, 8, pk, lk);
    return Dot(q.data(), k.data(), 8);
  };
  for (bool layout : {true, false}) {
    EXPECT_NEAR(score(10, 7, layout, layout), score(25, 22, layout, layout),
                1e-4);
    EXPECT_GT(
        std::fabs(score(10, 7, layout, layout) - score(10, 2, layout, layout)),
        1e-3);
  }
  EXPECT_GT(std::fabs(score(10, 7, true, false) - score(25, 22, true, false)),
            1e-3);
}

TEST(Rope, YarnScalesOnlyLowFrequencies) {
  ModelConfig c = RopeConfig();
  c.qk_rope_head_dim = 64;
  c.rope_theta = 10000;
  const Rope plain(c);
  c.yarn.enabled = true;
  c.yarn.factor = 40;
  c.yarn.original_max_position_embeddings = 4096;
  const Rope yarn(c);
  // Highest frequency (i = 0) is untouched; the lowest is divided by 40.
  EXPECT_DOUBLE_EQ(yarn.inv_freq()[0], plain.inv_freq()[0]);
  EXPECT_NEAR(yarn.inv_freq()[31], plain.inv_freq()[31] / 40, 1e-15);
}

}  // namespace
}  // namespace tierkv::executor
