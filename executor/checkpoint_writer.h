// WriteRandomCheckpoint: creates a seeded random HF-style checkpoint
// (config.json + safetensors with HF tensor names) of any ModelConfig, for
// tests, demos and benchmarks.
#pragma once

#include <cstdint>
#include <filesystem>

#include "executor/config.h"
#include "executor/dtype.h"
#include "tierkv/status.h"

namespace tierkv::executor {

struct CheckpointWriterOptions {
  // Seed of GenerateRandomTensor. Default: 0.
  uint64_t seed = 0;
  // Storage dtype. kF8E4M3 stores the fp8-quantizable matrices as e4m3 with
  // fp32 `weight_scale_inv` per 128x128 block and everything else as bf16.
  // Default: BF16.
  DType dtype = DType::kBF16;
  // Tensors are split into shards of at most this many bytes (a single
  // tensor may exceed it); more than one shard adds
  // model.safetensors.index.json. Default: 2 GiB.
  uint64_t max_shard_bytes = 2ull << 30;
  // Write config.json only (for shapes too large to materialize, e.g.
  // glm5-shape). Default: false.
  bool config_only = false;
};

// Creates `dir` if needed and writes config.json (+ weights). Returns
// InvalidArgument if the config does not validate, IOError on write errors.
Status WriteRandomCheckpoint(const std::filesystem::path& dir,
                             const ModelConfig& config,
                             const CheckpointWriterOptions& options);

}  // namespace tierkv::executor
