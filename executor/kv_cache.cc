// KvCache geometry checks and the in-process implementation.
#include "executor/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace tierkv::executor {

Status KvCacheGeometry::Validate() const {
  if (num_layers <= 0 || latent_dim <= 0 || index_dim <= 0 ||
      page_tokens <= 0 || max_tokens <= 0) {
    return Status::InvalidArgument(
        "KvCacheGeometry: num_layers, latent_dim, index_dim, page_tokens and "
        "max_tokens must be > 0");
  }
  if (latent_nope_dim < 0 || latent_nope_dim > latent_dim ||
      (dtype == KvDtype::kFP8 && latent_nope_dim == 0)) {
    return Status::InvalidArgument(
        "KvCacheGeometry: latent_nope_dim must be in [0, latent_dim], and "
        "> 0 for fp8");
  }
  if (static_cast<int64_t>(has_index_keys.size()) != num_layers) {
    return Status::InvalidArgument(
        "KvCacheGeometry: has_index_keys needs one entry per layer");
  }
  return Status::OK();
}

KvCacheGeometry GeometryFor(const ModelConfig& config, int64_t max_tokens,
                            KvDtype dtype) {
  KvCacheGeometry g;
  g.dtype = dtype;
  g.latent_nope_dim = config.kv_lora_rank;
  g.num_layers = config.num_hidden_layers;
  g.latent_dim = config.latent_dim();
  g.index_dim = config.index_head_dim;
  g.has_index_keys = config.indexer_full;
  g.max_tokens = max_tokens;
  return g;
}

Status KvCache::CheckPart(int64_t layer, KvPart part) const {
  if (layer < 0 || layer >= geometry_.num_layers) {
    return Status::InvalidArgument(fmt::format(
        "KvCache: layer {} out of range [0, {})", layer, geometry_.num_layers));
  }
  if (part == KvPart::kIndexKey && !geometry_.has_index_keys[layer]) {
    return Status::InvalidArgument(fmt::format(
        "KvCache: layer {} is an IndexShare (shared) layer and has no "
        "indexer keys",
        layer));
  }
  return Status::OK();
}

InProcessKvCache::InProcessKvCache(KvCacheGeometry geometry)
    : KvCache(std::move(geometry)),
      stores_(static_cast<size_t>(this->geometry().num_layers * 2)) {}

Result<std::unique_ptr<InProcessKvCache>> InProcessKvCache::Create(
    KvCacheGeometry geometry) {
  TIERKV_RETURN_IF_ERROR(geometry.Validate());
  return std::unique_ptr<InProcessKvCache>(
      new InProcessKvCache(std::move(geometry)));
}

Result<int64_t> KvCache::CheckWrite(int64_t layer, KvPart part,
                                    int64_t first_token, size_t floats,
                                    int64_t num_tokens) const {
  TIERKV_RETURN_IF_ERROR(CheckPart(layer, part));
  const int64_t dim = geometry_.RowDim(part);
  if (floats % static_cast<size_t>(dim) != 0) {
    return Status::InvalidArgument(fmt::format(
        "KvCache::Write: {} floats is not a multiple of the row size {}",
        floats, dim));
  }
  const int64_t n = static_cast<int64_t>(floats) / dim;
  if (first_token < 0 || first_token > num_tokens) {
    return Status::InvalidArgument(fmt::format(
        "KvCache::Write: first token {} would leave a hole (layer {} has {} "
        "tokens)",
        first_token, layer, num_tokens));
  }
  if (first_token + n > geometry_.max_tokens) {
    return Status::ResourceExhausted(fmt::format(
        "KvCache::Write: tokens up to {} exceed the capacity of {} tokens",
        first_token + n, geometry_.max_tokens));
  }
  return n;
}

Status InProcessKvCache::Write(int64_t layer, KvPart part, int64_t first_token,
                               std::span<const float> rows) {
  TIERKV_RETURN_IF_ERROR(CheckPart(layer, part));
  PartStore& s = store(layer, part);
  auto rows_n = CheckWrite(layer, part, first_token, rows.size(), s.num_tokens);
  if (!rows_n.ok()) return rows_n.status();
  const int64_t n = *rows_n;
  const KvCacheGeometry& g = geometry();
  const int64_t dim = g.RowDim(part);
  const size_t page_floats = static_cast<size_t>(g.page_tokens * dim);
  const KvRowFormat format = g.Format(part);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = first_token + i;
    const size_t page = static_cast<size_t>(t / g.page_tokens);
    if (page >= s.pages.size()) s.pages.resize(page + 1);
    if (!s.pages[page]) s.pages[page] = std::make_unique<float[]>(page_floats);
    float* row = s.pages[page].get() + (t % g.page_tokens) * dim;
    std::memcpy(row, rows.data() + i * dim, static_cast<size_t>(dim) * 4);
    format.RoundTrip({row, static_cast<size_t>(dim)});  // stored as `dtype`
  }
  s.num_tokens = std::max(s.num_tokens, first_token + n);
  return Status::OK();
}

Status InProcessKvCache::Gather(int64_t layer, KvPart part,
                                std::span<const int32_t> token_ids,
                                std::span<float> out) const {
  TIERKV_RETURN_IF_ERROR(CheckPart(layer, part));
  const KvCacheGeometry& g = geometry();
  const int64_t dim = g.RowDim(part);
  if (out.size() != token_ids.size() * static_cast<size_t>(dim)) {
    return Status::InvalidArgument("KvCache::Gather: output size mismatch");
  }
  const PartStore& s = store(layer, part);
  for (size_t i = 0; i < token_ids.size(); ++i) {
    const int64_t t = token_ids[i];
    if (t < 0 || t >= s.num_tokens) {
      return Status::InvalidArgument(fmt::format(
          "KvCache::Gather: token {} not written in layer {} ({} tokens)", t,
          layer, s.num_tokens));
    }
    std::memcpy(out.data() + i * dim,
                s.pages[t / g.page_tokens].get() + (t % g.page_tokens) * dim,
                static_cast<size_t>(dim) * 4);
  }
  return Status::OK();
}

Result<std::span<const float>> InProcessKvCache::PageView(int64_t layer,
                                                          KvPart part,
                                                          int64_t page) const {
  TIERKV_RETURN_IF_ERROR(CheckPart(layer, part));
  const KvCacheGeometry& g = geometry();
  const PartStore& s = store(layer, part);
  if (page < 0 || page >= static_cast<int64_t>(s.pages.size()) ||
      !s.pages[page]) {
    return Status::InvalidArgument(
        fmt::format("KvCache::PageView: page {} of layer {} was never written",
                    page, layer));
  }
  return std::span<const float>(
      s.pages[page].get(), static_cast<size_t>(g.page_tokens * g.RowDim(part)));
}

int64_t InProcessKvCache::num_tokens(int64_t layer, KvPart part) const {
  if (!CheckPart(layer, part).ok()) return 0;
  return store(layer, part).num_tokens;
}

Status InProcessKvCache::Truncate(int64_t num_tokens) {
  if (num_tokens < 0) {
    return Status::InvalidArgument("KvCache::Truncate: negative length");
  }
  for (auto& s : stores_) s.num_tokens = std::min(s.num_tokens, num_tokens);
  return Status::OK();
}

uint64_t InProcessKvCache::allocated_bytes() const {
  uint64_t bytes = 0;
  for (int64_t l = 0; l < geometry().num_layers; ++l) {
    for (KvPart p : {KvPart::kLatent, KvPart::kIndexKey}) {
      const PartStore& s = store(l, p);
      for (const auto& pg : s.pages) {
        if (pg)
          bytes += static_cast<uint64_t>(geometry().page_tokens *
                                         geometry().RowDim(p)) *
                   4;
      }
    }
  }
  return bytes;
}

}  // namespace tierkv::executor
