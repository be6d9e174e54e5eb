// Model: the GLM-5 / DeepSeek-V3.2 decoder with DeepSeek Sparse Attention,
// run on fp32 CPU kernels (glm5-dsa.md §7).
//
// Per layer: RMSNorm → MLA (low-rank q and kv, interleaved RoPE) whose
// attention is restricted to the lightning indexer's top-k tokens (full
// layers run the indexer; IndexShare "shared" layers reuse the last full
// layer's selection and have no indexer weights or keys) → residual →
// RMSNorm → dense SwiGLU MLP (first_k_dense_replace layers) or MoE →
// residual. Then the final norm and the LM head.
//
// Forward() appends a chunk of tokens after the rows already in the
// KvCache: a prompt (prefill) or one token (decode). Attention runs in
// absorbed MQA form, except chunks of more than one token ending within
// `dense_mha_max_tokens`, which use the MHA form (there the selection is
// every causal token, i.e. dense attention). Both forms can be forced.
//
// Thread safety: a Model is immutable after creation except for its thread
// pool; call Forward() from one thread at a time. Results are identical
// for any num_threads (see thread_pool.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "executor/config.h"
#include "executor/kv_cache.h"
#include "executor/rope.h"
#include "executor/thread_pool.h"
#include "executor/weights.h"
#include "tierkv/sparse_working_set.h"
#include "tierkv/status.h"

namespace tierkv::executor {

enum class AttentionMode : uint8_t {
  kAuto,         // MHA for short multi-token chunks, else absorbed MQA
  kAbsorbedMqa,  // always absorbed (FlashMLA sparse form)
  kMha,          // always per-head expanded K/V
};

// Test and tracing hook, called on full indexer layers for each token whose
// selection was scored (position + 1 > index_topk, or always_score_indexer):
// the indexer scores
// of tokens [0, position] and the selected ids (ascending).
using SelectionObserver = std::function<void(
    int64_t layer, int64_t position, std::span<const float> scores,
    std::span<const int32_t> selected)>;

struct ModelOptions {
  // Threads used by kernels, counting the caller; 0 = all hardware threads.
  // Default: 0.
  int num_threads = 0;
  // kAuto uses MHA for a chunk of > 1 tokens whose end position is <= this;
  // -1 means index_topk (where DSA selects every causal token). Default: -1.
  int64_t dense_mha_max_tokens = -1;
  // Default: kAuto.
  AttentionMode attention_mode = AttentionMode::kAuto;
  // Run the indexer scoring and top-k even when top-k would select every
  // causal token (position + 1 <= index_topk). For tests of the sparse
  // path; costs a key scan. Default: false.
  bool always_score_indexer = false;
  // Optional; default none.
  SelectionObserver observer;
};

class Model {
 public:
  // Loads <dir>/config.json and its safetensors. Returns the loader's
  // error (naming the file, key or tensor) on failure.
  static Result<std::unique_ptr<Model>> Load(const std::filesystem::path& dir,
                                             const ModelOptions& options);
  // Takes ownership of already-built weights (e.g. RandomWeights()).
  static Result<std::unique_ptr<Model>> Create(ModelConfig config,
                                               ModelWeights weights,
                                               const ModelOptions& options);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  int num_threads() const { return pool_.num_threads(); }

  // A fresh in-process cache for up to `max_tokens` tokens, rows stored as
  // `dtype`.
  Result<std::unique_ptr<KvCache>> NewCache(
      int64_t max_tokens, KvDtype dtype = KvDtype::kF32) const;

  // Runs `tokens` at positions [p, p + n) where p = the number of tokens in
  // `cache` (layer 0), writing their KV rows. Returns the logits
  // ([vocab]) of the last token, or of every token ([n, vocab]) when
  // `all_logits`. Returns InvalidArgument for an empty chunk or a token id
  // outside the vocabulary, and the cache's errors.
  //
  // `working_set` (from NewWorkingSet on the same cache): a decode step
  // (one token, absorbed MQA) then reads its sparse attention rows through
  // it: each full layer hands its selection to the working set, and every
  // layer gathers its selected latent rows from the working set's slots
  // (which copy misses from the cache). Same rows, same order: the same
  // logits, bit for bit. Other chunks ignore it.
  Result<std::vector<float>> Forward(std::span<const int32_t> tokens,
                                     KvCache* cache, bool all_logits = false,
                                     SparseWorkingSet* working_set = nullptr);

  // A working set over `cache`'s latent rows as attention reads them (fp32,
  // decoded), one group per full indexer layer with the IndexShare layers
  // after it. `cache` is borrowed and must outlive it; rows Written later
  // are visible to it. InvalidArgument as SparseWorkingSet::Create, or
  // when options.slots is below index_topk (a selection must fit).
  Result<std::unique_ptr<SparseWorkingSet>> NewWorkingSet(
      KvCache* cache, const WorkingSetOptions& options) const;

 private:
  Model(ModelConfig config, ModelWeights weights, const ModelOptions& options);
  Status Layer(int64_t layer, int64_t start, int64_t n, bool use_mha,
               KvCache* cache, SparseWorkingSet* working_set,
               std::vector<std::vector<int32_t>>* selection,
               std::vector<float>* x);

  ModelConfig config_;
  ModelWeights weights_;
  ModelOptions options_;
  Rope rope_;
  ThreadPool pool_;
};

}  // namespace tierkv::executor
