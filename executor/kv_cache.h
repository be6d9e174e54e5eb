// KvCache: per-layer storage of the rows DSA attention reads.
//
// Two parts per layer (glm5-dsa.md §7):
//   kLatent    every layer, one row per token: the normalized kv latent
//              (kv_lora_rank) followed by the rotated k_pe (qk_rope_head_dim);
//              576 floats for GLM-5.
//   kIndexKey  full (non-IndexShare) layers only: the indexer key
//              (index_head_dim; 128 for GLM-5).
// Rows are fp32 and grouped in pages of `page_tokens` tokens (64, FlashMLA's
// page size), so a tiered implementation can move whole (layer, part, page)
// units. Token t lives in page t / page_tokens at row t % page_tokens.
//
// Asynchronous backends: the model calls Prefetch(l + 1, n) before it
// computes layer l, and WaitForLayer(l, n) after layer l's projections
// (which need no cached rows) and before it reads or writes layer l, so a
// daemon-backed cache can fetch the pages of a layer while the previous
// one and the layer's own projections compute. Reads (Gather, PageView) of
// tokens < n are valid only after WaitForLayer(layer, n) returned OK. The
// in-process cache has everything resident and completes both at once.
//
// Thread safety: not thread-safe for writes; concurrent const reads (Gather,
// PageView) are safe when no write is in flight.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "executor/config.h"
#include "executor/kv_format.h"
#include "tierkv/sparse_working_set.h"
#include "tierkv/status.h"

namespace tierkv::executor {

enum class KvPart : uint8_t { kLatent = 0, kIndexKey = 1 };

struct KvCacheGeometry {
  int64_t num_layers = 0;
  int64_t latent_dim = 0;            // kv_lora_rank + qk_rope_head_dim
  int64_t index_dim = 0;             // index_head_dim
  std::vector<bool> has_index_keys;  // per layer: full indexer layer
  // Tokens per page. Default: 64.
  int64_t page_tokens = 64;
  // Capacity in tokens; writes past it return ResourceExhausted.
  int64_t max_tokens = 0;
  // How rows are stored (kv_format.h); reads return the dequantized
  // values. Default: fp32 (exact).
  KvDtype dtype = KvDtype::kF32;
  // The leading latent values fp8 quantizes (kv_lora_rank; the RoPE part
  // after them stays bf16).
  int64_t latent_nope_dim = 0;

  int64_t RowDim(KvPart part) const {
    return part == KvPart::kLatent ? latent_dim : index_dim;
  }
  KvRowFormat Format(KvPart part) const {
    return part == KvPart::kLatent
               ? KvRowFormat::Latent(dtype, latent_dim, latent_nope_dim)
               : KvRowFormat::IndexKey(dtype, index_dim);
  }
  Status Validate() const;
};

// The geometry a model config implies.
KvCacheGeometry GeometryFor(const ModelConfig& config, int64_t max_tokens,
                            KvDtype dtype = KvDtype::kF32);

class KvCache {
 public:
  explicit KvCache(KvCacheGeometry geometry) : geometry_(std::move(geometry)) {}
  virtual ~KvCache() = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheGeometry& geometry() const { return geometry_; }

  // Hint: `layer` will soon read tokens [0, num_tokens) of its parts.
  // Must not block. Default: nothing to do.
  virtual void Prefetch(int64_t layer, int64_t num_tokens) {
    (void)layer;
    (void)num_tokens;
  }
  // Blocks until tokens [0, num_tokens) of `layer` are readable. Returns
  // the error of a failed fetch (e.g. IOError, Unavailable). Default: OK.
  virtual Status WaitForLayer(int64_t layer, int64_t num_tokens) {
    (void)layer;
    (void)num_tokens;
    return Status::OK();
  }

  // Prefix reuse, for caches backed by a store (TierKvCache); the
  // defaults are those of a cache without one. The caller (Generate):
  //   start = AttachPrefix(prompt); Forward(prompt[start:]);
  //   on failure: start = RecoverPrefix(error), then Forward(prompt[start:]);
  //   CommitTokens(every token whose rows are written) after each Forward.
  //
  // Called on an empty cache before a prompt's prefill: makes the stored
  // leading pages of `prompt` the cache's first rows and returns their
  // token count, a multiple of page_tokens below prompt.size() (the last
  // token is always computed: its logits are the output). Their rows may
  // arrive later: WaitForLayer covers them. Default: 0.
  virtual Result<int64_t> AttachPrefix(std::span<const int32_t> prompt) {
    (void)prompt;
    return int64_t{0};
  }
  // After a Forward failed: when the failure was an attached page that did
  // not arrive, keeps the leading pages that arrived in every layer and
  // returns their token count (the caller computes the rest); any other
  // error is returned as is. Default: the error.
  virtual Result<int64_t> RecoverPrefix(const Status& forward_error) {
    return forward_error;
  }
  // `tokens` are the ids of rows [0, tokens.size()): full pages among them
  // may be saved. Default: nothing to do.
  virtual Status CommitTokens(std::span<const int32_t> tokens) {
    (void)tokens;
    return Status::OK();
  }
  // How often sparse attention selected tokens of each page per full layer
  // (SparseWorkingSet counts), for a store that ranks pages by it
  // (TierKvCache tells tierkvd). Pages not saved are skipped. Default:
  // nothing to do.
  virtual Status ReportSelections(std::span<const SelectionCount> counts) {
    (void)counts;
    return Status::OK();
  }

  // Stores rows for tokens [first_token, first_token + n), n =
  // rows.size() / RowDim(part). REQUIRES: first_token <= num_tokens(layer,
  // part) (no holes). Returns InvalidArgument for a bad layer/part/size,
  // ResourceExhausted past max_tokens.
  virtual Status Write(int64_t layer, KvPart part, int64_t first_token,
                       std::span<const float> rows) = 0;
  // Copies the rows of `token_ids` (any order, repeats allowed) into `out`
  // ([ids, RowDim]). Returns InvalidArgument if a token was never written.
  virtual Status Gather(int64_t layer, KvPart part,
                        std::span<const int32_t> token_ids,
                        std::span<float> out) const = 0;
  // Borrowed view of page `page` ([page_tokens, RowDim], rows past
  // num_tokens undefined). Valid until the next Write or Truncate.
  virtual Result<std::span<const float>> PageView(int64_t layer, KvPart part,
                                                  int64_t page) const = 0;
  // Tokens written so far for (layer, part).
  virtual int64_t num_tokens(int64_t layer, KvPart part) const = 0;
  // Forgets tokens >= num_tokens in every layer (e.g. to re-run a suffix).
  virtual Status Truncate(int64_t num_tokens) = 0;

 protected:
  // Checks layer/part arguments against the geometry.
  Status CheckPart(int64_t layer, KvPart part) const;
  // Checks a Write of `floats` values at `first_token` to a part holding
  // `num_tokens` rows (the errors Write documents); the number of rows.
  Result<int64_t> CheckWrite(int64_t layer, KvPart part, int64_t first_token,
                             size_t floats, int64_t num_tokens) const;

 private:
  KvCacheGeometry geometry_;
};

// All rows resident in process memory; pages allocated on first write.
class InProcessKvCache final : public KvCache {
 public:
  // Returns InvalidArgument for an invalid geometry.
  static Result<std::unique_ptr<InProcessKvCache>> Create(
      KvCacheGeometry geometry);

  Status Write(int64_t layer, KvPart part, int64_t first_token,
               std::span<const float> rows) override;
  Status Gather(int64_t layer, KvPart part, std::span<const int32_t> token_ids,
                std::span<float> out) const override;
  Result<std::span<const float>> PageView(int64_t layer, KvPart part,
                                          int64_t page) const override;
  int64_t num_tokens(int64_t layer, KvPart part) const override;
  Status Truncate(int64_t num_tokens) override;

  // Bytes of row storage allocated.
  uint64_t allocated_bytes() const;

 private:
  explicit InProcessKvCache(KvCacheGeometry geometry);
  struct PartStore {
    std::vector<std::unique_ptr<float[]>> pages;
    int64_t num_tokens = 0;
  };
  PartStore& store(int64_t layer, KvPart part) {
    return stores_[static_cast<size_t>(layer * 2 + static_cast<int>(part))];
  }
  const PartStore& store(int64_t layer, KvPart part) const {
    return stores_[static_cast<size_t>(layer * 2 + static_cast<int>(part))];
  }
  std::vector<PartStore> stores_;  // [layer][part]
};

}  // namespace tierkv::executor
