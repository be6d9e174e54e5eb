// Tensor: a dense row-major fp32 array with its shape; the executor's only
// in-memory weight representation (checkpoints in bf16/fp16/fp8 are
// converted once at load time so every kernel runs on fp32).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tierkv::executor {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // For 2-D weights [out, in].
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
  const float* ptr() const { return data.data(); }
};

// "[a, b]" for messages.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace tierkv::executor
