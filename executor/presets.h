// Named model shapes for tierkv-run --write-random-model and tests.
//
//   tiny        hidden 64, 4 layers, vocab 128: unit tests, runs in ms.
//   glm5-small  hidden 1024, 8 layers, 16 heads, index 8x64 top-256,
//               32 experts top-4, IndexShare (freq 4, offset 3): benchmarks.
//   glm5-shape  GLM-5.2's real config (78 layers, 6144 hidden, ...): proves
//               the loading logic; far too large to materialize.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "executor/config.h"
#include "tierkv/status.h"

namespace tierkv::executor {

// Returns the config of a preset, or InvalidArgument listing the names.
Result<ModelConfig> PresetConfig(std::string_view name);
std::vector<std::string> PresetNames();

}  // namespace tierkv::executor
