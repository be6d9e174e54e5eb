// Parsing and validation of HF config.json for glm_moe_dsa / deepseek_v32.
#include "executor/config.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tierkv::executor {
namespace {

using nlohmann::json;

Status KeyError(std::string_view key, std::string_view what) {
  return Status::InvalidArgument(
      fmt::format("config.json: key '{}' {}", key, what));
}

// Reads an integer key; a missing key is an error when `required`.
Status ReadInt(const json& j, const char* key, bool required, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return KeyError(key, "is required but missing");
    return Status::OK();
  }
  // Integral floats (64.0) are accepted; anything outside int64 is an
  // error, not a cast (a double past 2^63 converts with undefined
  // behaviour; found by fuzz/model_config_fuzzer).
  constexpr double kTwo63 = 9223372036854775808.0;
  if (it->is_number_float()) {
    const double v = it->get<double>();
    if (std::floor(v) == v && v >= -kTwo63 && v < kTwo63) {
      *out = static_cast<int64_t>(v);
      return Status::OK();
    }
  } else if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      *out = static_cast<int64_t>(v);
      return Status::OK();
    }
  } else if (it->is_number_integer()) {
    *out = it->get<int64_t>();
    return Status::OK();
  }
  return KeyError(key, fmt::format("must be an integer, got {}", it->dump()));
}

Status ReadDouble(const json& j, const char* key, bool required, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return KeyError(key, "is required but missing");
    return Status::OK();
  }
  if (!it->is_number()) {
    return KeyError(key, fmt::format("must be a number, got {}", it->dump()));
  }
  *out = it->get<double>();
  return Status::OK();
}

Status ReadBool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::OK();
  if (!it->is_boolean()) {
    return KeyError(key, fmt::format("must be a boolean, got {}", it->dump()));
  }
  *out = it->get<bool>();
  return Status::OK();
}

// RoPE: GLM uses `rope_parameters` {rope_theta, rope_type}; DeepSeek uses a
// top-level `rope_theta` plus `rope_scaling` {type: yarn, ...}.
Status ParseRope(const json& j, ModelConfig* c) {
  const json* scaling = nullptr;
  bool have_theta = false;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    if (it->contains("rope_theta")) {
      TIERKV_RETURN_IF_ERROR(
          ReadDouble(*it, "rope_theta", true, &c->rope_theta));
      have_theta = true;
    }
    scaling = &*it;
  }
  if (j.contains("rope_theta") && !j["rope_theta"].is_null()) {
    TIERKV_RETURN_IF_ERROR(ReadDouble(j, "rope_theta", true, &c->rope_theta));
    have_theta = true;
  }
  if (!have_theta) {
    return KeyError("rope_theta",
                    "is required but missing (neither top-level nor in "
                    "rope_parameters)");
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && it->is_object()) {
    scaling = &*it;
  }
  if (scaling == nullptr) return Status::OK();
  std::string type;
  for (const char* k : {"rope_type", "type"}) {
    if (auto t = scaling->find(k); t != scaling->end() && t->is_string()) {
      type = t->get<std::string>();
    }
  }
  if (type.empty() || type == "default") return Status::OK();
  if (type != "yarn") {
    return KeyError("rope_scaling",
                    fmt::format("has unsupported rope type '{}' (supported: "
                                "default, yarn)",
                                type));
  }
  YarnScaling& y = c->yarn;
  y.enabled = true;
  TIERKV_RETURN_IF_ERROR(ReadDouble(*scaling, "factor", true, &y.factor));
  TIERKV_RETURN_IF_ERROR(ReadInt(*scaling, "original_max_position_embeddings",
                                 false, &y.original_max_position_embeddings));
  TIERKV_RETURN_IF_ERROR(
      ReadDouble(*scaling, "beta_fast", false, &y.beta_fast));
  TIERKV_RETURN_IF_ERROR(
      ReadDouble(*scaling, "beta_slow", false, &y.beta_slow));
  TIERKV_RETURN_IF_ERROR(ReadDouble(*scaling, "mscale", false, &y.mscale));
  TIERKV_RETURN_IF_ERROR(
      ReadDouble(*scaling, "mscale_all_dim", false, &y.mscale_all_dim));
  return Status::OK();
}

// IndexShare: explicit `indexer_types` wins, then `index_topk_pattern`
// ("FSSS..."), then index_topk_freq / index_skip_topk_offset, else all full.
Status ParseIndexShare(const json& j, ModelConfig* c) {
  const int64_t n = c->num_hidden_layers;
  if (auto it = j.find("indexer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != n) {
      return KeyError("indexer_types",
                      fmt::format("must be a list of {} strings", n));
    }
    c->indexer_full.clear();
    for (const auto& v : *it) {
      if (!v.is_string() || (v.get<std::string>() != "full" &&
                             v.get<std::string>() != "shared")) {
        return KeyError("indexer_types",
                        fmt::format("entries must be \"full\" or \"shared\", "
                                    "got {}",
                                    v.dump()));
      }
      c->indexer_full.push_back(v.get<std::string>() == "full");
    }
  } else if (auto p = j.find("index_topk_pattern");
             p != j.end() && p->is_string()) {
    const std::string pat = p->get<std::string>();
    if (static_cast<int64_t>(pat.size()) != n) {
      return KeyError("index_topk_pattern",
                      fmt::format("must have {} characters", n));
    }
    c->indexer_full.clear();
    for (char ch : pat) {
      if (ch != 'F' && ch != 'S') {
        return KeyError("index_topk_pattern", "may only contain F and S");
      }
      c->indexer_full.push_back(ch == 'F');
    }
  } else {
    int64_t freq = 1, offset = 2;
    TIERKV_RETURN_IF_ERROR(ReadInt(j, "index_topk_freq", false, &freq));
    TIERKV_RETURN_IF_ERROR(
        ReadInt(j, "index_skip_topk_offset", false, &offset));
    c->indexer_full = IndexShareFullLayers(n, freq, offset);
  }
  if (n > 0 && !c->indexer_full[0]) {
    return KeyError("indexer_types",
                    "layer 0 must be \"full\" (a shared layer needs an earlier "
                    "full layer)");
  }
  return Status::OK();
}

}  // namespace

std::vector<bool> IndexShareFullLayers(int64_t num_layers, int64_t freq,
                                       int64_t offset) {
  freq = std::max<int64_t>(freq, 1);
  std::vector<bool> full(static_cast<size_t>(std::max<int64_t>(num_layers, 0)));
  for (int64_t i = 0; i < num_layers; ++i) {
    full[i] = std::max<int64_t>(i - offset + 1, 0) % freq == 0;
  }
  return full;
}

double ModelConfig::SoftmaxScale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (yarn.enabled && yarn.factor > 1.0 && yarn.mscale_all_dim != 0.0) {
    const double m = 0.1 * yarn.mscale_all_dim * std::log(yarn.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

int64_t ModelConfig::NumFullIndexerLayers() const {
  int64_t n = 0;
  for (bool f : indexer_full) n += f ? 1 : 0;
  return n;
}

Status ModelConfig::Validate() const {
  auto positive = [](const char* key, int64_t v) -> Status {
    if (v <= 0) return KeyError(key, fmt::format("must be > 0, got {}", v));
    return Status::OK();
  };
  TIERKV_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  TIERKV_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  TIERKV_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  TIERKV_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  TIERKV_RETURN_IF_ERROR(positive("q_lora_rank", q_lora_rank));
  TIERKV_RETURN_IF_ERROR(positive("kv_lora_rank", kv_lora_rank));
  TIERKV_RETURN_IF_ERROR(positive("qk_nope_head_dim", qk_nope_head_dim));
  TIERKV_RETURN_IF_ERROR(positive("qk_rope_head_dim", qk_rope_head_dim));
  TIERKV_RETURN_IF_ERROR(positive("v_head_dim", v_head_dim));
  TIERKV_RETURN_IF_ERROR(positive("index_n_heads", index_n_heads));
  TIERKV_RETURN_IF_ERROR(positive("index_head_dim", index_head_dim));
  TIERKV_RETURN_IF_ERROR(positive("index_topk", index_topk));
  TIERKV_RETURN_IF_ERROR(positive("n_routed_experts", n_routed_experts));
  TIERKV_RETURN_IF_ERROR(positive("num_experts_per_tok", num_experts_per_tok));
  TIERKV_RETURN_IF_ERROR(
      positive("moe_intermediate_size", moe_intermediate_size));
  TIERKV_RETURN_IF_ERROR(positive("n_group", n_group));
  TIERKV_RETURN_IF_ERROR(positive("topk_group", topk_group));
  TIERKV_RETURN_IF_ERROR(positive("moe_layer_freq", moe_layer_freq));
  if (qk_rope_head_dim % 2 != 0) {
    return KeyError("qk_rope_head_dim", "must be even");
  }
  if (index_head_dim < qk_rope_head_dim) {
    return KeyError("index_head_dim",
                    "must be >= qk_rope_head_dim (the indexer ropes its first "
                    "qk_rope_head_dim dims)");
  }
  if (num_experts_per_tok > n_routed_experts) {
    return KeyError("num_experts_per_tok", "must be <= n_routed_experts");
  }
  if (n_routed_experts % n_group != 0) {
    return KeyError("n_group", "must divide n_routed_experts");
  }
  if (topk_group > n_group) return KeyError("topk_group", "must be <= n_group");
  if (n_group > 1 &&
      num_experts_per_tok > topk_group * (n_routed_experts / n_group)) {
    return KeyError("topk_group",
                    "keeps fewer experts than num_experts_per_tok");
  }
  if (first_k_dense_replace > 0 && intermediate_size <= 0) {
    return KeyError("intermediate_size",
                    "must be > 0 when first_k_dense_replace > 0");
  }
  if (n_shared_experts < 0) return KeyError("n_shared_experts", "must be >= 0");
  if (!(rms_norm_eps > 0)) return KeyError("rms_norm_eps", "must be > 0");
  if (!(rope_theta > 0)) return KeyError("rope_theta", "must be > 0");
  if (yarn.enabled && !(yarn.factor >= 1.0)) {
    return KeyError("rope_scaling.factor", "must be >= 1");
  }
  if (static_cast<int64_t>(indexer_full.size()) != num_hidden_layers) {
    return KeyError("indexer_types", "must have one entry per layer");
  }
  if (weight_block_rows <= 0 || weight_block_cols <= 0) {
    return KeyError("quantization_config.weight_block_size", "must be > 0");
  }
  return Status::OK();
}

Result<ModelConfig> ParseModelConfig(const json& j) {
  if (!j.is_object()) {
    return Status::InvalidArgument("config.json: top level must be an object");
  }
  ModelConfig c;
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) {
    c.model_type = it->get<std::string>();
  } else {
    return KeyError("model_type", "is required but missing");
  }
  if (c.model_type != "glm_moe_dsa" && c.model_type != "deepseek_v32") {
    return KeyError("model_type",
                    fmt::format("is '{}'; supported: glm_moe_dsa, deepseek_v32",
                                c.model_type));
  }
  struct IntKey {
    const char* key;
    int64_t* out;
    bool required;
  };
  const IntKey ints[] = {
      {"vocab_size", &c.vocab_size, true},
      {"hidden_size", &c.hidden_size, true},
      {"num_hidden_layers", &c.num_hidden_layers, true},
      {"num_attention_heads", &c.num_attention_heads, true},
      {"q_lora_rank", &c.q_lora_rank, true},
      {"kv_lora_rank", &c.kv_lora_rank, true},
      {"qk_nope_head_dim", &c.qk_nope_head_dim, true},
      {"qk_rope_head_dim", &c.qk_rope_head_dim, true},
      {"v_head_dim", &c.v_head_dim, true},
      {"index_n_heads", &c.index_n_heads, true},
      {"index_head_dim", &c.index_head_dim, true},
      {"index_topk", &c.index_topk, true},
      {"n_routed_experts", &c.n_routed_experts, true},
      {"n_shared_experts", &c.n_shared_experts, true},
      {"num_experts_per_tok", &c.num_experts_per_tok, true},
      {"moe_intermediate_size", &c.moe_intermediate_size, true},
      {"intermediate_size", &c.intermediate_size, true},
      {"first_k_dense_replace", &c.first_k_dense_replace, true},
      {"n_group", &c.n_group, false},
      {"topk_group", &c.topk_group, false},
      {"moe_layer_freq", &c.moe_layer_freq, false},
      {"max_position_embeddings", &c.max_position_embeddings, false},
  };
  for (const IntKey& k : ints) {
    TIERKV_RETURN_IF_ERROR(ReadInt(j, k.key, k.required, k.out));
  }
  int64_t kv_heads = c.num_attention_heads;
  TIERKV_RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", false, &kv_heads));
  if (kv_heads != c.num_attention_heads) {
    return KeyError("num_key_value_heads",
                    "must equal num_attention_heads for MLA");
  }
  int64_t qk_head_dim = c.qk_head_dim();
  TIERKV_RETURN_IF_ERROR(ReadInt(j, "qk_head_dim", false, &qk_head_dim));
  if (qk_head_dim != c.qk_head_dim()) {
    return KeyError("qk_head_dim",
                    "must equal qk_nope_head_dim + qk_rope_head_dim");
  }
  TIERKV_RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", true, &c.rms_norm_eps));
  TIERKV_RETURN_IF_ERROR(
      ReadDouble(j, "routed_scaling_factor", false, &c.routed_scaling_factor));
  TIERKV_RETURN_IF_ERROR(ReadBool(j, "norm_topk_prob", &c.norm_topk_prob));
  TIERKV_RETURN_IF_ERROR(
      ReadBool(j, "indexer_rope_interleave", &c.indexer_rope_interleave));
  TIERKV_RETURN_IF_ERROR(ReadBool(j, "rope_interleave", &c.rope_interleave));
  TIERKV_RETURN_IF_ERROR(
      ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  if (auto it = j.find("scoring_func");
      it != j.end() && it->is_string() && it->get<std::string>() != "sigmoid") {
    return KeyError("scoring_func", fmt::format("is '{}'; only sigmoid is "
                                                "supported",
                                                it->get<std::string>()));
  }
  TIERKV_RETURN_IF_ERROR(ParseRope(j, &c));
  TIERKV_RETURN_IF_ERROR(ParseIndexShare(j, &c));
  if (auto q = j.find("quantization_config"); q != j.end() && q->is_object()) {
    if (auto b = q->find("weight_block_size"); b != q->end()) {
      if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
          !(*b)[1].is_number_integer()) {
        return KeyError("quantization_config.weight_block_size",
                        "must be [rows, cols]");
      }
      c.weight_block_rows = (*b)[0].get<int64_t>();
      c.weight_block_cols = (*b)[1].get<int64_t>();
    }
  }
  TIERKV_RETURN_IF_ERROR(c.Validate());
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return Status::NotFound(fmt::format("{} does not exist", path.string()));
  }
  std::ifstream in(path);
  if (!in) return Status::IOError(fmt::format("cannot open {}", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Status::InvalidArgument(
        fmt::format("{} is not valid JSON", path.string()));
  }
  return ParseModelConfig(j);
}

json ModelConfigToJson(const ModelConfig& c) {
  json j;
  j["architectures"] = {c.model_type == "deepseek_v32"
                            ? "DeepseekV32ForCausalLM"
                            : "GlmMoeDsaForCausalLM"};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_attention_heads;
  j["q_lora_rank"] = c.q_lora_rank;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["qk_head_dim"] = c.qk_head_dim();
  j["v_head_dim"] = c.v_head_dim;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["indexer_rope_interleave"] = c.indexer_rope_interleave;
  j["rope_interleave"] = c.rope_interleave;
  if (c.yarn.enabled) {
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", c.yarn.factor},
                         {"original_max_position_embeddings",
                          c.yarn.original_max_position_embeddings},
                         {"beta_fast", c.yarn.beta_fast},
                         {"beta_slow", c.yarn.beta_slow},
                         {"mscale", c.yarn.mscale},
                         {"mscale_all_dim", c.yarn.mscale_all_dim}};
  } else {
    j["rope_parameters"] = {{"rope_theta", c.rope_theta},
                            {"rope_type", "default"}};
  }
  if (c.max_position_embeddings > 0) {
    j["max_position_embeddings"] = c.max_position_embeddings;
  }
  json types = json::array();
  for (bool f : c.indexer_full) types.push_back(f ? "full" : "shared");
  j["indexer_types"] = types;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["intermediate_size"] = c.intermediate_size;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["scoring_func"] = "sigmoid";
  j["topk_method"] = "noaux_tc";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  return j;
}

}  // namespace tierkv::executor
