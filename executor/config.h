// ModelConfig: the architecture of a GLM-5.x (glm_moe_dsa) or DeepSeek-V3.2
// (deepseek_v32) checkpoint, parsed from its HF config.json.
//
// Every key of glm5-dsa.md §1 that the executor needs is a field here. The
// parser validates once, at the edge: a missing required key, a wrong type or
// an inconsistent value returns InvalidArgument naming the key. Derived values
// (softmax scale with the YaRN mscale² factor, the IndexShare layer pattern)
// are computed at parse time so the model never re-reads JSON.
//
// Thread safety: a plain value; immutable after parsing.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::executor {

// DeepSeek's YaRN rope scaling (config `rope_scaling` / `rope_parameters`
// with type "yarn"). GLM-5.x uses plain RoPE (enabled == false).
struct YarnScaling {
  bool enabled = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct ModelConfig {
  std::string model_type;  // "glm_moe_dsa" or "deepseek_v32"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // Lightning indexer.
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  // Indexer RoPE layout: true = interleaved pairs (2i, 2i+1); false =
  // half-split / NeoX pairs (i, i + rope/2). Default: false (vLLM semantics).
  bool indexer_rope_interleave = false;
  // Main MLA RoPE layout. Default: true (GLM `rope_interleave`, DeepSeek ref).
  bool rope_interleave = true;
  double rope_theta = 10000.0;
  YarnScaling yarn;
  int64_t max_position_embeddings = 0;
  // IndexShare: indexer_full[l] is true when layer l runs its own indexer
  // ("full"); shared layers reuse the most recent full layer's top-k.
  std::vector<bool> indexer_full;
  // MoE.
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t intermediate_size = 0;  // dense MLP of the first k layers
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  // FP8 checkpoints: `quantization_config.weight_block_size`. Default 128x128.
  int64_t weight_block_rows = 128;
  int64_t weight_block_cols = 128;

  // Derived.
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // One latent KV row: normalized kv latent followed by the rotated k_pe.
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  bool IsMoeLayer(int64_t layer) const {
    return layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // qk_head_dim^-0.5, times mscale² when YaRN is on (glm5-dsa.md §2.2).
  double SoftmaxScale() const;
  // Number of layers that run their own indexer.
  int64_t NumFullIndexerLayers() const;

  // Checks ranges and cross-field consistency. Returns InvalidArgument
  // naming the offending key.
  Status Validate() const;
};

// IndexShare rule of HF GlmMoeDsaConfig (glm5-dsa.md §4): layer i is full iff
// max(i - offset + 1, 0) % max(freq, 1) == 0.
std::vector<bool> IndexShareFullLayers(int64_t num_layers, int64_t freq,
                                       int64_t offset);

// Parses an HF config.json object. Returns InvalidArgument naming the first
// missing or malformed key.
Result<ModelConfig> ParseModelConfig(const nlohmann::json& json);
// Reads and parses <dir>/config.json (NotFound / IOError / InvalidArgument).
Result<ModelConfig> LoadModelConfig(const std::filesystem::path& dir);
// Serializes to HF config.json keys (explicit `indexer_types` included).
// Round-trips through ParseModelConfig.
nlohmann::json ModelConfigToJson(const ModelConfig& config);

}  // namespace tierkv::executor
