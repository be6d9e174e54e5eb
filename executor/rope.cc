// Rotary embeddings (see rope.h).
#include "executor/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tierkv::executor {
namespace {

double YarnMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// DeepSeek find_correction_dim.
double CorrectionDim(double rotations, int64_t dim, double base,
                     double max_pos) {
  return static_cast<double>(dim) *
         std::log(max_pos / (rotations * 2 * std::numbers::pi)) /
         (2 * std::log(base));
}

}  // namespace

Rope::Rope(const ModelConfig& config) : dim_(config.qk_rope_head_dim) {
  const int64_t half = dim_ / 2;
  const double base = config.rope_theta;
  inv_freq_.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq_[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) /
                                            static_cast<double>(dim_));
  }
  const YarnScaling& y = config.yarn;
  if (y.enabled && y.factor > 1.0) {
    const double orig = static_cast<double>(y.original_max_position_embeddings);
    double low = std::floor(CorrectionDim(y.beta_fast, dim_, base, orig));
    double high = std::ceil(CorrectionDim(y.beta_slow, dim_, base, orig));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim_ - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp =
          std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double smooth = 1.0 - ramp;
      inv_freq_[i] =
          inv_freq_[i] / y.factor * (1.0 - smooth) + inv_freq_[i] * smooth;
    }
    cos_sin_scale_ =
        YarnMscale(y.factor, y.mscale) / YarnMscale(y.factor, y.mscale_all_dim);
  }
}

void Rope::Apply(float* x, int64_t num_heads, int64_t stride, int64_t pos,
                 bool interleaved) const {
  const int64_t half = dim_ / 2;
  float cs[256], sn[256];
  float* c = cs;
  float* s = sn;
  std::vector<float> heap;
  if (half > 256) {
    heap.resize(static_cast<size_t>(2 * half));
    c = heap.data();
    s = heap.data() + half;
  }
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * inv_freq_[i];
    c[i] = static_cast<float>(std::cos(angle) * cos_sin_scale_);
    s[i] = static_cast<float>(std::sin(angle) * cos_sin_scale_);
  }
  for (int64_t h = 0; h < num_heads; ++h) {
    float* v = x + h * stride;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = interleaved ? 2 * i : i;
      const int64_t b = interleaved ? 2 * i + 1 : i + half;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * c[i] - x1 * s[i];
      v[b] = x0 * s[i] + x1 * c[i];
    }
  }
}

}  // namespace tierkv::executor
