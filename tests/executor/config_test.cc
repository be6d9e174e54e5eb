// Tests for executor/config: HF config.json parsing, IndexShare, YaRN.
#include "executor/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "executor/presets.h"
#include "executor/weights.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::executor {
namespace {

using nlohmann::json;

// GLM-5.2's config.json keys (glm5-dsa.md §1), without indexer_types.
json Glm52Json() {
  return json::parse(R"({
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
    "hidden_size": 6144, "num_hidden_layers": 78, "num_attention_heads": 64,
    "num_key_value_heads": 64, "q_lora_rank": 2048, "kv_lora_rank": 512,
    "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "qk_head_dim": 256,
    "v_head_dim": 256, "head_dim": 192, "index_n_heads": 32,
    "index_head_dim": 128, "index_topk": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048, "intermediate_size": 12288,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "vocab_size": 154880,
    "rope_parameters": {"rope_theta": 8000000, "rope_type": "default"},
    "rope_interleave": true, "indexer_rope_interleave": true,
    "rms_norm_eps": 1e-05, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "norm_topk_prob": true, "n_group": 1, "topk_group": 1,
    "max_position_embeddings": 1048576, "index_topk_freq": 4,
    "index_skip_topk_offset": 3, "index_share_for_mtp_iteration": true,
    "tie_word_embeddings": false, "moe_router_dtype": "float32"})");
}

// DeepSeek-V3.2's HF config keys (glm5-dsa.md §1).
json DeepSeekV32Json() {
  return json::parse(R"({
    "model_type": "deepseek_v32", "hidden_size": 7168,
    "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048, "intermediate_size": 18432,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "vocab_size": 129280,
    "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40,
      "original_max_position_embeddings": 4096, "beta_fast": 32,
      "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rms_norm_eps": 1e-06, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "norm_topk_prob": true, "n_group": 8, "topk_group": 4,
    "max_position_embeddings": 163840,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
      "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}})");
}

TEST(ModelConfig, Glm52IndexShareKeysGiveFullLayers0To2ThenEveryFourth) {
  auto c = ParseModelConfig(Glm52Json());
  ASSERT_OK(c);
  std::vector<int64_t> full;
  for (int64_t l = 0; l < 78; ++l) {
    if (c->indexer_full[l]) full.push_back(l);
  }
  std::vector<int64_t> expected = {0, 1, 2};
  for (int64_t l = 6; l <= 74; l += 4) expected.push_back(l);
  EXPECT_EQ(full, expected);
  EXPECT_EQ(c->NumFullIndexerLayers(), 21);
  EXPECT_EQ(full.back(), 74);
}

TEST(ModelConfig, Glm52ParsesEveryKeyOfTheReference) {
  auto c = ParseModelConfig(Glm52Json());
  ASSERT_OK(c);
  EXPECT_EQ(c->hidden_size, 6144);
  EXPECT_EQ(c->qk_head_dim(), 256);
  EXPECT_EQ(c->latent_dim(), 576);
  EXPECT_EQ(c->index_head_dim, 128);
  EXPECT_TRUE(c->indexer_rope_interleave);
  EXPECT_DOUBLE_EQ(c->rope_theta, 8000000.0);
  EXPECT_FALSE(c->yarn.enabled);
  EXPECT_DOUBLE_EQ(c->SoftmaxScale(), 0.0625);  // 256^-0.5, no YaRN
  EXPECT_EQ(c->first_k_dense_replace, 3);
  EXPECT_FALSE(c->IsMoeLayer(2));
  EXPECT_TRUE(c->IsMoeLayer(3));
  EXPECT_DOUBLE_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
}

TEST(ModelConfig, ExplicitIndexerTypesWinOverFreqAndOffset) {
  json j = Glm52Json();
  json types = json::array();
  for (int i = 0; i < 78; ++i) types.push_back(i % 2 == 0 ? "full" : "shared");
  j["indexer_types"] = types;
  auto c = ParseModelConfig(j);
  ASSERT_OK(c);
  EXPECT_TRUE(c->indexer_full[0]);
  EXPECT_FALSE(c->indexer_full[1]);
  EXPECT_TRUE(c->indexer_full[2]);
  EXPECT_EQ(c->NumFullIndexerLayers(), 39);
}

TEST(ModelConfig, WithoutIndexShareKeysEveryLayerIsFull) {
  json j = Glm52Json();
  j.erase("index_topk_freq");
  j.erase("index_skip_topk_offset");
  j.erase("indexer_rope_interleave");
  auto c = ParseModelConfig(j);
  ASSERT_OK(c);
  EXPECT_EQ(c->NumFullIndexerLayers(), 78);
  EXPECT_FALSE(c->indexer_rope_interleave);  // default false when absent
}

TEST(ModelConfig, DeepSeekYarnAppliesMscaleSquaredToSoftmaxScale) {
  auto c = ParseModelConfig(DeepSeekV32Json());
  ASSERT_OK(c);
  EXPECT_TRUE(c->yarn.enabled);
  EXPECT_DOUBLE_EQ(c->yarn.factor, 40.0);
  EXPECT_EQ(c->yarn.original_max_position_embeddings, 4096);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->SoftmaxScale(), m * m / std::sqrt(192.0), 1e-12);
  EXPECT_NEAR(c->SoftmaxScale(), 0.13523, 5e-5);
  EXPECT_EQ(c->n_group, 8);
  EXPECT_EQ(c->topk_group, 4);
  EXPECT_EQ(c->weight_block_rows, 128);
  EXPECT_EQ(c->NumFullIndexerLayers(), 61);
}

TEST(ModelConfig, MissingRequiredKeyIsNamedInTheError) {
  json j = Glm52Json();
  j.erase("kv_lora_rank");
  auto c = ParseModelConfig(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("kv_lora_rank"), std::string::npos)
      << c.status().ToString();
}

// Found by fuzz/model_config_fuzzer: 3.3e54 was cast to int64 (undefined
// behaviour) instead of being rejected.
TEST(ModelConfig, IntegersOutsideInt64AreRejectedNotCast) {
  for (const json& v : {json(3.26667e54), json(-1e19), json(1e300),
                        json(uint64_t{18446744073709551615u})}) {
    json j = Glm52Json();
    j["hidden_size"] = v;
    auto c = ParseModelConfig(j);
    ASSERT_FALSE(c.ok()) << v.dump();
    EXPECT_NE(c.status().message().find("hidden_size"), std::string::npos)
        << c.status().ToString();
  }
  json j = Glm52Json();
  j["hidden_size"] = 6144.0;  // an integral float is still an integer
  EXPECT_TRUE(ParseModelConfig(j).ok());
}

TEST(ModelConfig, WrongTypeAndUnknownModelTypeAreRejected) {
  json j = Glm52Json();
  j["hidden_size"] = "big";
  auto c = ParseModelConfig(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("hidden_size"), std::string::npos);
  j = Glm52Json();
  j["model_type"] = "llama";
  c = ParseModelConfig(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("llama"), std::string::npos);
}

TEST(ModelConfig, SerializedConfigParsesBackIdentically) {
  for (const auto& name : PresetNames()) {
    auto c = PresetConfig(name);
    ASSERT_OK(c);
    auto back = ParseModelConfig(ModelConfigToJson(*c));
    ASSERT_OK(back);
    EXPECT_EQ(back->indexer_full, c->indexer_full) << name;
    EXPECT_EQ(back->hidden_size, c->hidden_size) << name;
    EXPECT_EQ(back->index_topk, c->index_topk) << name;
    EXPECT_EQ(back->indexer_rope_interleave, c->indexer_rope_interleave);
    EXPECT_DOUBLE_EQ(back->rope_theta, c->rope_theta) << name;
  }
}

TEST(ModelConfig, LoadReportsMissingAndInvalidFiles) {
  testing::TempDir dir;
  auto missing = LoadModelConfig(dir.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  std::ofstream(dir.File("config.json")) << "{ not json";
  auto bad = LoadModelConfig(dir.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not valid JSON"), std::string::npos);
}

// The glm5-shape preset proves the loading logic at GLM-5.2 scale without
// allocating: names and shapes only.
TEST(ExpectedTensors,
     Glm5ShapeListsHfNamesAndShapesWithoutIndexerOnSharedLayers) {
  auto c = PresetConfig("glm5-shape");
  ASSERT_OK(c);
  const auto tensors = ExpectedTensors(*c);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& t : tensors) shapes[t.name] = t.shape;
  using V = std::vector<int64_t>;
  EXPECT_EQ(shapes["model.embed_tokens.weight"], (V{154880, 6144}));
  EXPECT_EQ(shapes["lm_head.weight"], (V{154880, 6144}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.q_a_proj.weight"],
            (V{2048, 6144}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.q_b_proj.weight"],
            (V{16384, 2048}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"],
            (V{576, 6144}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.kv_b_proj.weight"],
            (V{28672, 512}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.o_proj.weight"], (V{6144, 16384}));
  EXPECT_EQ(shapes["model.layers.2.self_attn.indexer.wq_b.weight"],
            (V{4096, 2048}));
  EXPECT_EQ(shapes["model.layers.6.self_attn.indexer.wk.weight"],
            (V{128, 6144}));
  EXPECT_EQ(shapes["model.layers.6.self_attn.indexer.weights_proj.weight"],
            (V{32, 6144}));
  EXPECT_EQ(shapes.count("model.layers.3.self_attn.indexer.wk.weight"), 0u);
  EXPECT_EQ(shapes.count("model.layers.5.self_attn.indexer.wq_b.weight"), 0u);
  EXPECT_EQ(shapes["model.layers.2.mlp.gate_proj.weight"], (V{12288, 6144}));
  EXPECT_EQ(shapes.count("model.layers.3.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(shapes["model.layers.3.mlp.gate.e_score_correction_bias"],
            (V{256}));
  EXPECT_EQ(shapes["model.layers.77.mlp.experts.255.down_proj.weight"],
            (V{6144, 2048}));
  EXPECT_EQ(shapes["model.layers.77.mlp.shared_experts.up_proj.weight"],
            (V{2048, 6144}));
  int indexer_layers = 0;
  for (int64_t l = 0; l < 78; ++l) {
    indexer_layers += shapes.count("model.layers." + std::to_string(l) +
                                   ".self_attn.indexer.k_norm.bias");
  }
  EXPECT_EQ(indexer_layers, 21);
  // ~744B parameters without the MTP layer (GLM-5 README: 744B).
  const uint64_t params = ParameterCount(*c);
  EXPECT_GT(params, 740'000'000'000ull);
  EXPECT_LT(params, 750'000'000'000ull);
}

}  // namespace
}  // namespace tierkv::executor
