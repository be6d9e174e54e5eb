// HF tensor naming, loading and random initialization (see weights.h).
#include "executor/weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <functional>

#include "executor/dtype.h"

namespace tierkv::executor {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

namespace {

struct Binding {
  ExpectedTensor spec;
  Tensor* dst;  // null when only listing names; owned by the ModelWeights
};

// Walks every tensor of the config in a fixed order. When `w` is non-null
// its containers are sized and each binding points into it.
std::vector<Binding> Bind(const ModelConfig& c, ModelWeights* w) {
  std::vector<Binding> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, TensorInit init,
                 bool quantizable, Tensor* dst) {
    out.push_back({{std::move(name), std::move(shape), init, quantizable},
                   w ? dst : nullptr});
  };
  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  ModelWeights dummy;
  ModelWeights& m = w ? *w : dummy;
  if (w) m.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  add("model.embed_tokens.weight", {c.vocab_size, h}, TensorInit::kEmbedding,
      false, &m.embed_tokens);
  auto add_mlp = [&](const std::string& prefix, int64_t inter, MlpWeights* mw) {
    add(prefix + ".gate_proj.weight", {inter, h}, TensorInit::kMatrix, true,
        mw ? &mw->gate_proj : nullptr);
    add(prefix + ".up_proj.weight", {inter, h}, TensorInit::kMatrix, true,
        mw ? &mw->up_proj : nullptr);
    add(prefix + ".down_proj.weight", {h, inter}, TensorInit::kMatrix, true,
        mw ? &mw->down_proj : nullptr);
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights* lw = w ? &m.layers[l] : nullptr;
    add(p + "input_layernorm.weight", {h}, TensorInit::kNormWeight, false,
        lw ? &lw->input_layernorm : nullptr);
    add(p + "post_attention_layernorm.weight", {h}, TensorInit::kNormWeight,
        false, lw ? &lw->post_attention_layernorm : nullptr);
    AttentionWeights* a = lw ? &lw->attn : nullptr;
    const std::string s = p + "self_attn.";
    add(s + "q_a_proj.weight", {c.q_lora_rank, h}, TensorInit::kMatrix, true,
        a ? &a->q_a_proj : nullptr);
    add(s + "q_a_layernorm.weight", {c.q_lora_rank}, TensorInit::kNormWeight,
        false, a ? &a->q_a_layernorm : nullptr);
    add(s + "q_b_proj.weight", {heads * c.qk_head_dim(), c.q_lora_rank},
        TensorInit::kMatrix, true, a ? &a->q_b_proj : nullptr);
    add(s + "kv_a_proj_with_mqa.weight", {c.latent_dim(), h},
        TensorInit::kMatrix, true, a ? &a->kv_a_proj : nullptr);
    add(s + "kv_a_layernorm.weight", {c.kv_lora_rank}, TensorInit::kNormWeight,
        false, a ? &a->kv_a_layernorm : nullptr);
    add(s + "kv_b_proj.weight",
        {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
        TensorInit::kMatrix, true, a ? &a->kv_b_proj : nullptr);
    add(s + "o_proj.weight", {h, heads * c.v_head_dim}, TensorInit::kMatrix,
        true, a ? &a->o_proj : nullptr);
    if (c.indexer_full[l]) {
      IndexerWeights* iw = nullptr;
      if (a) iw = &a->indexer.emplace();
      const std::string ip = s + "indexer.";
      add(ip + "wq_b.weight",
          {c.index_n_heads * c.index_head_dim, c.q_lora_rank},
          TensorInit::kMatrix, true, iw ? &iw->wq_b : nullptr);
      add(ip + "wk.weight", {c.index_head_dim, h}, TensorInit::kMatrix, true,
          iw ? &iw->wk : nullptr);
      add(ip + "k_norm.weight", {c.index_head_dim}, TensorInit::kNormWeight,
          false, iw ? &iw->k_norm_weight : nullptr);
      add(ip + "k_norm.bias", {c.index_head_dim}, TensorInit::kBias, false,
          iw ? &iw->k_norm_bias : nullptr);
      add(ip + "weights_proj.weight", {c.index_n_heads, h}, TensorInit::kMatrix,
          false, iw ? &iw->weights_proj : nullptr);
    }
    const std::string mp = p + "mlp";
    if (c.IsMoeLayer(l)) {
      MoeWeights* moe = nullptr;
      if (lw) {
        moe = &lw->moe.emplace();
        moe->experts.resize(static_cast<size_t>(c.n_routed_experts));
      }
      add(mp + ".gate.weight", {c.n_routed_experts, h}, TensorInit::kMatrix,
          false, moe ? &moe->gate : nullptr);
      add(mp + ".gate.e_score_correction_bias", {c.n_routed_experts},
          TensorInit::kBias, false,
          moe ? &moe->e_score_correction_bias : nullptr);
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        add_mlp(fmt::format("{}.experts.{}", mp, e), c.moe_intermediate_size,
                moe ? &moe->experts[e] : nullptr);
      }
      if (c.n_shared_experts > 0) {
        MlpWeights* sh = moe ? &moe->shared_experts.emplace() : nullptr;
        add_mlp(mp + ".shared_experts",
                c.n_shared_experts * c.moe_intermediate_size, sh);
      }
    } else {
      MlpWeights* d = lw ? &lw->dense_mlp.emplace() : nullptr;
      add_mlp(mp, c.intermediate_size, d);
    }
  }
  add("model.norm.weight", {h}, TensorInit::kNormWeight, false, &m.norm);
  add("lm_head.weight", {c.vocab_size, h}, TensorInit::kMatrix, false,
      &m.lm_head);
  return out;
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config) {
  std::vector<ExpectedTensor> out;
  for (auto& b : Bind(config, nullptr)) out.push_back(std::move(b.spec));
  return out;
}

uint64_t ParameterCount(const ModelConfig& config) {
  uint64_t n = 0;
  for (const auto& b : Bind(config, nullptr)) {
    uint64_t e = 1;
    for (int64_t d : b.spec.shape) e *= static_cast<uint64_t>(d);
    n += e;
  }
  return n;
}

Result<Tensor> ReadTensorF32(const SafetensorsReader& reader,
                             const std::string& name,
                             const std::vector<int64_t>& expected_shape,
                             int64_t block_rows, int64_t block_cols) {
  const TensorView* v = reader.Find(name);
  if (v == nullptr) {
    return Status::NotFound(
        fmt::format("missing tensor '{}' (expected shape {}) in the checkpoint",
                    name, ShapeString(expected_shape)));
  }
  if (v->shape != expected_shape) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' in {} has shape {}, expected {}", name, v->file,
        ShapeString(v->shape), ShapeString(expected_shape)));
  }
  auto dtype = ParseDType(v->dtype);
  if (!dtype.ok()) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' in {}: {}", name, v->file, dtype.status().message()));
  }
  Tensor t;
  t.shape = v->shape;
  t.data.resize(static_cast<size_t>(t.numel()));
  ConvertToF32(*dtype, v->data, t.data);
  if (*dtype != DType::kF8E4M3) return t;

  // Block dequantization: W[i][j] *= scale_inv[i / br][j / bc].
  if (t.shape.size() != 2) {
    return Status::InvalidArgument(
        fmt::format("fp8 tensor '{}' must be 2-D, has shape {}", name,
                    ShapeString(t.shape)));
  }
  const std::string scale_name = name + "_scale_inv";
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const std::vector<int64_t> scale_shape = {
      (rows + block_rows - 1) / block_rows,
      (cols + block_cols - 1) / block_cols};
  const TensorView* sv = reader.Find(scale_name);
  if (sv == nullptr) {
    return Status::NotFound(fmt::format(
        "fp8 tensor '{}' has no block scale tensor '{}' (expected shape {})",
        name, scale_name, ShapeString(scale_shape)));
  }
  auto scale =
      ReadTensorF32(reader, scale_name, scale_shape, block_rows, block_cols);
  if (!scale.ok()) return scale.status();
  for (int64_t i = 0; i < rows; ++i) {
    const float* srow = scale->data.data() + (i / block_rows) * scale_shape[1];
    float* row = t.data.data() + i * cols;
    for (int64_t j = 0; j < cols; ++j) row[j] *= srow[j / block_cols];
  }
  return t;
}

Result<ModelWeights> LoadWeights(const ModelConfig& config,
                                 const SafetensorsReader& reader) {
  ModelWeights w;
  for (Binding& b : Bind(config, &w)) {
    auto t = ReadTensorF32(reader, b.spec.name, b.spec.shape,
                           config.weight_block_rows, config.weight_block_cols);
    if (!t.ok()) return t.status();
    *b.dst = std::move(t).value();
  }
  return w;
}

void GenerateRandomTensor(const ExpectedTensor& t, uint64_t seed,
                          std::vector<float>* out) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  out->resize(static_cast<size_t>(n));
  uint64_t state = seed ^ HashName(t.name);
  float scale = 1.0f;
  float offset = 0.0f;
  switch (t.init) {
    case TensorInit::kMatrix:
      // Uniform [-a, a] has variance a²/3; a = sqrt(3/in) gives 1/in.
      scale = std::sqrt(3.0f / static_cast<float>(t.shape.back()));
      break;
    case TensorInit::kEmbedding:
      scale = 1.0f;
      break;
    case TensorInit::kNormWeight:
      scale = 0.1f;
      offset = 1.0f;
      break;
    case TensorInit::kBias:
      scale = 0.1f;
      break;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = SplitMix64(state);
    // 24 random bits -> [-1, 1).
    const float u = static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f;
    (*out)[i] = offset + scale * u;
  }
}

ModelWeights RandomWeights(const ModelConfig& config, uint64_t seed) {
  ModelWeights w;
  for (Binding& b : Bind(config, &w)) {
    b.dst->shape = b.spec.shape;
    GenerateRandomTensor(b.spec, seed, &b.dst->data);
  }
  return w;
}

}  // namespace tierkv::executor
