// The DSA decoder forward pass (see model.h).
#include "executor/model.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "common/safetensors.h"
#include "executor/attention.h"
#include "executor/indexer.h"
#include "executor/kernels.h"
#include "executor/moe.h"

namespace tierkv::executor {
namespace {

// The DeepSeek reference indexer LayerNorm epsilon (nn.LayerNorm default).
constexpr float kIndexerNormEps = 1e-6f;

void RmsNormRows(const float* x, const Tensor& w, int64_t rows, int64_t dim,
                 int64_t stride, float eps, float* out, int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    RmsNorm(x + r * stride, w.ptr(), dim, eps, out + r * out_stride);
  }
}

}  // namespace

Model::Model(ModelConfig config, ModelWeights weights,
             const ModelOptions& options)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      options_(options),
      rope_(config_),
      pool_(options.num_threads) {}

Result<std::unique_ptr<Model>> Model::Create(ModelConfig config,
                                             ModelWeights weights,
                                             const ModelOptions& options) {
  TIERKV_RETURN_IF_ERROR(config.Validate());
  if (static_cast<int64_t>(weights.layers.size()) != config.num_hidden_layers) {
    return Status::InvalidArgument(
        "Model::Create: weights do not match config");
  }
  return std::unique_ptr<Model>(
      new Model(std::move(config), std::move(weights), options));
}

Result<std::unique_ptr<Model>> Model::Load(const std::filesystem::path& dir,
                                           const ModelOptions& options) {
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return config.status();
  auto reader = SafetensorsReader::Open(dir);
  if (!reader.ok()) return reader.status();
  auto weights = LoadWeights(*config, **reader);
  if (!weights.ok()) return weights.status();
  return Create(std::move(config).value(), std::move(weights).value(), options);
}

Result<std::unique_ptr<KvCache>> Model::NewCache(int64_t max_tokens,
                                                 KvDtype dtype) const {
  auto cache =
      InProcessKvCache::Create(GeometryFor(config_, max_tokens, dtype));
  if (!cache.ok()) return cache.status();
  return std::unique_ptr<KvCache>(std::move(cache).value());
}

Result<std::unique_ptr<SparseWorkingSet>> Model::NewWorkingSet(
    KvCache* cache, const WorkingSetOptions& options) const {
  const ModelConfig& c = config_;
  if (options.slots < c.index_topk) {
    return Status::InvalidArgument(
        fmt::format("working set: {} slots cannot hold a selection of "
                    "index_topk {}",
                    options.slots, c.index_topk));
  }
  WorkingSetLayout layout;
  int64_t full = -1;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.indexer_full[l]) full = l;
    if (full < 0) {
      return Status::InvalidArgument(
          fmt::format("working set: layer {} has no full layer before it", l));
    }
    layout.group_of_layer.push_back(static_cast<uint16_t>(full));
    layout.row_bytes.push_back(static_cast<uint32_t>(c.latent_dim() * 4));
  }
  const int64_t ld = c.latent_dim();
  const int64_t page_tokens = cache->geometry().page_tokens;
  RowSource source = [cache, ld, page_tokens](
                         uint16_t layer,
                         int32_t token) -> std::span<const std::byte> {
    if (token < 0 || token >= cache->num_tokens(layer, KvPart::kLatent)) {
      return {};
    }
    auto page = cache->PageView(layer, KvPart::kLatent, token / page_tokens);
    if (!page.ok()) return {};
    return std::as_bytes(
        page->subspan(static_cast<size_t>((token % page_tokens) * ld),
                      static_cast<size_t>(ld)));
  };
  return SparseWorkingSet::Create(layout, options, std::move(source));
}

Result<std::vector<float>> Model::Forward(std::span<const int32_t> tokens,
                                          KvCache* cache, bool all_logits,
                                          SparseWorkingSet* working_set) {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return Status::InvalidArgument("Forward: empty token chunk");
  const KvCacheGeometry& g = cache->geometry();
  if (g.num_layers != c.num_hidden_layers || g.latent_dim != c.latent_dim() ||
      g.index_dim != c.index_head_dim || g.has_index_keys != c.indexer_full) {
    return Status::InvalidArgument(
        "Forward: KvCache geometry does not match "
        "the model config");
  }
  const int64_t start = cache->num_tokens(0, KvPart::kLatent);
  const int64_t hidden = c.hidden_size;
  std::vector<float> x(static_cast<size_t>(n * hidden));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens[t];
    if (id < 0 || id >= c.vocab_size) {
      return Status::InvalidArgument(
          fmt::format("Forward: token id {} outside the vocabulary [0, {})", id,
                      c.vocab_size));
    }
    std::memcpy(x.data() + t * hidden,
                weights_.embed_tokens.ptr() + static_cast<int64_t>(id) * hidden,
                static_cast<size_t>(hidden) * 4);
  }
  const int64_t mha_limit = options_.dense_mha_max_tokens < 0
                                ? c.index_topk
                                : options_.dense_mha_max_tokens;
  bool use_mha = false;
  switch (options_.attention_mode) {
    case AttentionMode::kAuto:
      use_mha = n > 1 && start + n <= mha_limit;
      break;
    case AttentionMode::kAbsorbedMqa:
      use_mha = false;
      break;
    case AttentionMode::kMha:
      use_mha = true;
      break;
  }
  std::vector<std::vector<int32_t>> selection;
  cache->Prefetch(0, start);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (l + 1 < c.num_hidden_layers) cache->Prefetch(l + 1, start);
    // Layer() waits for layer l's cached rows itself, once its projections
    // are done: they need only x, and overlap the load.
    TIERKV_RETURN_IF_ERROR(
        Layer(l, start, n, use_mha, cache, working_set, &selection, &x));
  }
  const int64_t first = all_logits ? 0 : n - 1;
  const int64_t rows = n - first;
  std::vector<float> normed(static_cast<size_t>(rows * hidden));
  RmsNormRows(x.data() + first * hidden, weights_.norm, rows, hidden, hidden,
              static_cast<float>(c.rms_norm_eps), normed.data(), hidden);
  std::vector<float> logits(static_cast<size_t>(rows * c.vocab_size));
  MatMul(&pool_, weights_.lm_head, normed.data(), rows, logits.data());
  return logits;
}

Status Model::Layer(int64_t l, int64_t start, int64_t n, bool use_mha,
                    KvCache* cache, SparseWorkingSet* working_set,
                    std::vector<std::vector<int32_t>>* selection,
                    std::vector<float>* xp) {
  // A decode step reads its selected rows through the working set.
  const bool via_working_set = working_set && n == 1 && !use_mha;
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[l];
  const AttentionWeights& aw = lw.attn;
  std::vector<float>& x = *xp;
  const int64_t hidden = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const int64_t qk = c.qk_head_dim();
  const int64_t ld = c.latent_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  ThreadPool* pool = &pool_;

  std::vector<float> xn(static_cast<size_t>(n * hidden));
  RmsNormRows(x.data(), lw.input_layernorm, n, hidden, hidden, eps, xn.data(),
              hidden);
  // Low-rank q: qr = RMSNorm(q_a_proj x); q = q_b_proj qr, RoPE on the last
  // rope dims of each head.
  std::vector<float> qr(static_cast<size_t>(n * c.q_lora_rank));
  MatMul(pool, aw.q_a_proj, xn.data(), n, qr.data());
  RmsNormRows(qr.data(), aw.q_a_layernorm, n, c.q_lora_rank, c.q_lora_rank, eps,
              qr.data(), c.q_lora_rank);
  std::vector<float> q(static_cast<size_t>(n * heads * qk));
  MatMul(pool, aw.q_b_proj, qr.data(), n, q.data());
  // Latent kv: [RMSNorm(c), RoPE(k_pe)].
  std::vector<float> latent(static_cast<size_t>(n * ld));
  MatMul(pool, aw.kv_a_proj, xn.data(), n, latent.data());
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = start + t;
    rope_.Apply(q.data() + t * heads * qk + c.qk_nope_head_dim, heads, qk, pos,
                c.rope_interleave);
    float* row = latent.data() + t * ld;
    RmsNorm(row, aw.kv_a_layernorm.ptr(), c.kv_lora_rank, eps, row);
    rope_.Apply(row + c.kv_lora_rank, 1, ld, pos, c.rope_interleave);
  }
  // Lightning indexer projections (full layers; IndexShare layers reuse the
  // last full layer's selection).
  const int64_t ih = c.index_n_heads, id = c.index_head_dim;
  std::vector<float> qi, ki, wts;
  if (c.indexer_full[l]) {
    if (!aw.indexer) {
      return Status::Internal(fmt::format("layer {} lacks indexer weights", l));
    }
    const IndexerWeights& iw = *aw.indexer;
    qi.resize(static_cast<size_t>(n * ih * id));
    ki.resize(static_cast<size_t>(n * id));
    wts.resize(static_cast<size_t>(n * ih));
    MatMul(pool, iw.wq_b, qr.data(), n, qi.data());
    MatMul(pool, iw.wk, xn.data(), n, ki.data());
    MatMul(pool, iw.weights_proj, xn.data(), n, wts.data());
    const float head_scale = 1.0f / std::sqrt(static_cast<float>(ih));
    for (int64_t t = 0; t < n; ++t) {
      const int64_t pos = start + t;
      // The indexer ropes its FIRST rope dims (glm5-dsa.md §2.1).
      rope_.Apply(qi.data() + t * ih * id, ih, id, pos,
                  c.indexer_rope_interleave);
      float* k = ki.data() + t * id;
      LayerNorm(k, iw.k_norm_weight.ptr(), iw.k_norm_bias.ptr(), id,
                kIndexerNormEps, k);
      rope_.Apply(k, 1, id, pos, c.indexer_rope_interleave);
      for (int64_t h = 0; h < ih; ++h) wts[t * ih + h] *= head_scale;
    }
  }

  // Everything above needed only x; from here on the layer reads cached
  // rows, so this is where it waits for them (as vLLM's attention calls
  // wait_for_layer_load), the projections having overlapped the load.
  TIERKV_RETURN_IF_ERROR(cache->WaitForLayer(l, start));
  TIERKV_RETURN_IF_ERROR(cache->Write(l, KvPart::kLatent, start, latent));
  if (c.indexer_full[l]) {
    TIERKV_RETURN_IF_ERROR(cache->Write(l, KvPart::kIndexKey, start, ki));
    selection->assign(static_cast<size_t>(n), {});
    std::vector<float> scores;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t visible = start + t + 1;
      std::vector<int32_t>& sel = (*selection)[t];
      if (visible <= c.index_topk && !options_.always_score_indexer) {
        sel.resize(static_cast<size_t>(visible));
        std::iota(sel.begin(), sel.end(), 0);
        continue;
      }
      scores.resize(static_cast<size_t>(visible));
      TIERKV_RETURN_IF_ERROR(
          ScoreCachedKeys(pool, *cache, l, qi.data() + t * ih * id,
                          wts.data() + t * ih, ih, id, visible, scores.data()));
      sel = TopKIndices(scores, c.index_topk);
      if (options_.observer) options_.observer(l, start + t, scores, sel);
    }
    if (via_working_set) {
      TIERKV_RETURN_IF_ERROR(working_set->Select(static_cast<uint16_t>(l),
                                                 (*selection)[0], start + 1));
    }
  } else if (static_cast<int64_t>(selection->size()) != n) {
    return Status::Internal(
        fmt::format("shared layer {} has no earlier full layer", l));
  }

  // Attention over each token's selection.
  MlaDims d;
  d.heads = heads;
  d.nope = c.qk_nope_head_dim;
  d.rope = c.qk_rope_head_dim;
  d.v = c.v_head_dim;
  d.kv_lora = c.kv_lora_rank;
  d.scale = static_cast<float>(c.SoftmaxScale());
  std::vector<float> attn(static_cast<size_t>(n * heads * d.v));
  std::vector<float> expanded_all;
  if (use_mha) {
    // Expand k_nope / v for every visible token once per chunk.
    const int64_t end = start + n;
    std::vector<int32_t> ids(static_cast<size_t>(end));
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<float> all_latent(static_cast<size_t>(end * ld));
    TIERKV_RETURN_IF_ERROR(cache->Gather(l, KvPart::kLatent, ids, all_latent));
    std::vector<float> c_rows(static_cast<size_t>(end * c.kv_lora_rank));
    for (int64_t s = 0; s < end; ++s) {
      std::memcpy(c_rows.data() + s * c.kv_lora_rank,
                  all_latent.data() + s * ld,
                  static_cast<size_t>(c.kv_lora_rank) * 4);
    }
    expanded_all.resize(static_cast<size_t>(end * d.expanded_dim()));
    MatMul(pool, aw.kv_b_proj, c_rows.data(), end, expanded_all.data());
  }
  std::vector<float> q_abs, o_lat;
  if (!use_mha) {
    q_abs.resize(static_cast<size_t>(n * heads * ld));
    o_lat.resize(static_cast<size_t>(n * heads * c.kv_lora_rank));
    AbsorbQueries(pool, d, aw.kv_b_proj, q.data(), n, q_abs.data());
  }
  std::vector<float> sel_latent, sel_expanded;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<int32_t>& sel = (*selection)[t];
    const int64_t s_count = static_cast<int64_t>(sel.size());
    sel_latent.resize(static_cast<size_t>(s_count * ld));
    if (via_working_set) {
      TIERKV_RETURN_IF_ERROR(
          working_set->Gather(static_cast<uint16_t>(l),
                              std::as_writable_bytes(std::span(sel_latent))));
    } else {
      TIERKV_RETURN_IF_ERROR(
          cache->Gather(l, KvPart::kLatent, sel, sel_latent));
    }
    if (use_mha) {
      const float* qt = q.data() + t * heads * qk;
      float* out = attn.data() + t * heads * d.v;
      const int64_t ed = d.expanded_dim();
      sel_expanded.resize(static_cast<size_t>(s_count * ed));
      for (int64_t s = 0; s < s_count; ++s) {
        std::memcpy(sel_expanded.data() + s * ed,
                    expanded_all.data() + static_cast<int64_t>(sel[s]) * ed,
                    static_cast<size_t>(ed) * 4);
      }
      MhaAttention(pool, d, qt, sel_expanded.data(), sel_latent.data(), s_count,
                   out);
    } else {
      AbsorbedAttend(pool, d, q_abs.data() + t * heads * ld, sel_latent.data(),
                     s_count, o_lat.data() + t * heads * c.kv_lora_rank);
    }
  }
  if (!use_mha) {
    ProjectValues(pool, d, aw.kv_b_proj, o_lat.data(), n, attn.data());
  }
  std::vector<float> o(static_cast<size_t>(n * hidden));
  MatMul(pool, aw.o_proj, attn.data(), n, o.data());
  for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];

  // Feed-forward.
  RmsNormRows(x.data(), lw.post_attention_layernorm, n, hidden, hidden, eps,
              xn.data(), hidden);
  if (lw.moe) {
    MoeForward(pool, c, *lw.moe, xn.data(), n, o.data());
  } else {
    MlpForward(pool, *lw.dense_mlp, xn.data(), n, o.data());
  }
  for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  return Status::OK();
}

}  // namespace tierkv::executor
