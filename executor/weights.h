// ModelWeights: every tensor of a glm_moe_dsa / deepseek_v32 decoder, in
// fp32, named and shaped as in the HF checkpoints (glm5-dsa.md §3).
//
// ExpectedTensors() lists the names and shapes a config implies without
// allocating anything (used to check GLM-5.2's full shape cheaply).
// LoadWeights() reads them from safetensors, converting bf16/fp16/fp32 and
// dequantizing fp8-e4m3 with `<name>_scale_inv` block scales. Shared
// (IndexShare) layers have no indexer tensors. Extra tensors in the
// checkpoint (e.g. the MTP layer) are ignored.
//
// Thread safety: plain values, immutable after loading.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "executor/config.h"
#include "executor/tensor.h"
#include "tierkv/status.h"

namespace tierkv::executor {

// How a random checkpoint initializes a tensor, and whether FP8 checkpoints
// quantize it.
enum class TensorInit : uint8_t {
  kMatrix,      // uniform, variance 1/in
  kEmbedding,   // uniform [-1, 1]
  kNormWeight,  // 1 + small noise
  kBias,        // small noise
};

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  TensorInit init = TensorInit::kMatrix;
  // True for matrices that FP8 checkpoints store as e4m3 + weight_scale_inv
  // (all projections except the router gate, indexer.weights_proj,
  // embeddings and lm_head; transformers PR #43912).
  bool fp8_quantizable = false;
};

struct IndexerWeights {
  Tensor wq_b;           // [index_n_heads * index_head_dim, q_lora_rank]
  Tensor wk;             // [index_head_dim, hidden]
  Tensor k_norm_weight;  // [index_head_dim]
  Tensor k_norm_bias;    // [index_head_dim]
  Tensor weights_proj;   // [index_n_heads, hidden]
};

struct AttentionWeights {
  Tensor q_a_proj;        // [q_lora_rank, hidden]
  Tensor q_a_layernorm;   // [q_lora_rank]
  Tensor q_b_proj;        // [heads * (nope + rope), q_lora_rank]
  Tensor kv_a_proj;       // [kv_lora_rank + rope, hidden]
  Tensor kv_a_layernorm;  // [kv_lora_rank]
  Tensor kv_b_proj;       // [heads * (nope + v), kv_lora_rank]
  Tensor o_proj;          // [hidden, heads * v]
  std::optional<IndexerWeights> indexer;  // full layers only
};

struct MlpWeights {
  Tensor gate_proj;  // [inter, hidden]
  Tensor up_proj;    // [inter, hidden]
  Tensor down_proj;  // [hidden, inter]
};

struct MoeWeights {
  Tensor gate;                     // router [n_routed_experts, hidden]
  Tensor e_score_correction_bias;  // [n_routed_experts]
  std::vector<MlpWeights> experts;
  std::optional<MlpWeights> shared_experts;
};

struct LayerWeights {
  Tensor input_layernorm;
  Tensor post_attention_layernorm;
  AttentionWeights attn;
  std::optional<MlpWeights> dense_mlp;  // layers < first_k_dense_replace
  std::optional<MoeWeights> moe;
};

struct ModelWeights {
  Tensor embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor norm;     // [hidden]
  Tensor lm_head;  // [vocab, hidden]
};

// Every tensor the config implies, in a fixed order.
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);
// Sum of the element counts of ExpectedTensors().
uint64_t ParameterCount(const ModelConfig& config);

// Reads one tensor as fp32, checking its shape. fp8-e4m3 tensors are
// dequantized per (block_rows x block_cols) block with the fp32 tensor
// `<name>_scale_inv` of shape [ceil(rows/br), ceil(cols/bc)].
// Returns NotFound naming a missing tensor (or scale), InvalidArgument for
// a wrong shape or unsupported dtype.
Result<Tensor> ReadTensorF32(const SafetensorsReader& reader,
                             const std::string& name,
                             const std::vector<int64_t>& expected_shape,
                             int64_t block_rows, int64_t block_cols);

// Loads all ExpectedTensors(config) from `reader`.
Result<ModelWeights> LoadWeights(const ModelConfig& config,
                                 const SafetensorsReader& reader);

// The deterministic random values a checkpoint writer with `seed` stores
// for `t` (before rounding to the checkpoint dtype). Depends only on
// (seed, name, shape), not on the order of generation.
void GenerateRandomTensor(const ExpectedTensor& t, uint64_t seed,
                          std::vector<float>* out);
// Builds fp32 weights in memory with GenerateRandomTensor (no files).
ModelWeights RandomWeights(const ModelConfig& config, uint64_t seed);

}  // namespace tierkv::executor
