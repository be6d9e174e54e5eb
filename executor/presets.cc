// Preset model shapes (see presets.h for the list and intended uses).
#include "executor/presets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tierkv::executor {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.model_type = "glm_moe_dsa";
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.q_lora_rank = 32;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.index_n_heads = 2;
  c.index_head_dim = 16;
  c.index_topk = 16;
  c.indexer_rope_interleave = true;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 4096;
  c.indexer_full = IndexShareFullLayers(4, /*freq=*/2, /*offset=*/2);
  c.n_routed_experts = 8;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.intermediate_size = 96;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5;
  c.first_k_dense_replace = 1;
  c.rms_norm_eps = 1e-5;
  return c;
}

ModelConfig Glm5Small() {
  ModelConfig c;
  c.model_type = "glm_moe_dsa";
  c.vocab_size = 16384;
  c.hidden_size = 1024;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 16;
  c.q_lora_rank = 512;
  c.kv_lora_rank = 512;  // latent row 512 + 64 = 576, as in GLM-5
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.index_n_heads = 8;
  c.index_head_dim = 64;
  c.index_topk = 256;
  c.indexer_rope_interleave = true;
  c.rope_theta = 1000000.0;
  c.max_position_embeddings = 65536;
  c.indexer_full = IndexShareFullLayers(8, /*freq=*/4, /*offset=*/3);
  c.n_routed_experts = 32;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 4;
  c.moe_intermediate_size = 256;
  c.intermediate_size = 2048;
  c.n_group = 1;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.5;
  c.first_k_dense_replace = 1;
  c.rms_norm_eps = 1e-5;
  return c;
}

// GLM-5.2 (glm5-dsa.md §1, GLM-5.2 column).
ModelConfig Glm5Shape() {
  ModelConfig c;
  c.model_type = "glm_moe_dsa";
  c.vocab_size = 154880;
  c.hidden_size = 6144;
  c.num_hidden_layers = 78;
  c.num_attention_heads = 64;
  c.q_lora_rank = 2048;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 192;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 256;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 2048;
  c.indexer_rope_interleave = true;
  c.rope_interleave = true;
  c.rope_theta = 8000000.0;
  c.max_position_embeddings = 1048576;
  c.indexer_full = IndexShareFullLayers(78, /*freq=*/4, /*offset=*/3);
  c.n_routed_experts = 256;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 2048;
  c.intermediate_size = 12288;
  c.n_group = 1;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.5;
  c.norm_topk_prob = true;
  c.first_k_dense_replace = 3;
  c.rms_norm_eps = 1e-5;
  return c;
}

}  // namespace

std::vector<std::string> PresetNames() {
  return {"tiny", "glm5-small", "glm5-shape"};
}

Result<ModelConfig> PresetConfig(std::string_view name) {
  if (name == "tiny") return Tiny();
  if (name == "glm5-small") return Glm5Small();
  if (name == "glm5-shape") return Glm5Shape();
  return Status::InvalidArgument(fmt::format(
      "unknown preset '{}'; known: {}", name, fmt::join(PresetNames(), ", ")));
}

}  // namespace tierkv::executor
