// TopkTraceSynthesizer: synthetic DeepSeek Sparse Attention top-k traces
// (executor/topk_trace.h) with stated statistics, for the sparse working
// set benchmarks when no recorded trace of a real model is at hand.
// `tierkv-bench topk-trace` (topk_trace_bench.cc) writes one.
//
// The statistics and where their defaults come from:
// - Consecutive-step overlap |S_t ∩ S_{t-1}| / |S_t| per layer: the
//   TensorRT-LLM tech blog 21, "Temporal Correlation Meets Sparse
//   Attention" (DeepSeek-V3.2, a 68K-token prompt, 2,025 decode steps;
//   peers.md "Updates (2026-12)"): consecutive top-2048 sets overlap 35-50%
//   on layers 20-60 (average ~44%) and ~1.5% on layers 0-1, where random
//   sets would overlap ~2.9%. Layers 2-19 (and past 60) are not reported
//   there; we assume the middle value for them.
// - The layer shape: GLM-5.2 (78 layers, IndexShare index_topk_freq 4,
//   index_skip_topk_offset 3: 21 full indexer layers, index_topk 2048;
//   glm5-dsa.md §1, §4); only full layers have selections of their own.
// - Attention sinks: the first 4 tokens always selected, as StreamingLLM's
//   four initial "attention sink" tokens (Xiao et al., ICLR 2024). DSA
//   forces no sinks; this is a modelling choice.
// - A recent window: the last 64 tokens always selected. An assumption (one
//   64-token KV page, FlashMLA's page size); DSA forces no window and the
//   blog does not measure one. The newest token is always selected.
//
// The model: each full layer has a latent, heavy-tailed token importance,
// Zipf over a random permutation of positions (weight rank^-s), fixed for
// the whole trace. Step 0 selects the forced tokens (sinks, window) and
// draws the rest without replacement in proportion to importance. Step t
// keeps exactly round(overlap * k) ids of step t-1: the forced ones still
// visible, then others drawn by importance (important tokens stay, the
// rest churn), and draws its remaining ids by importance from the tokens
// step t-1 did not select. So important tokens come back again and again
// while unimportant ones churn. When the forced tokens alone retain more
// than the target (sinks + window - 1 ids: 67 of 2048 = 0.033 by default,
// above layers 0-1's 0.015) the overlap is that floor, and the report says
// so. The context grows by one token per step.
//
// Deterministic: a seed gives the same trace on every run (mt19937_64's
// raw output and integer arithmetic only, after the Zipf weights).
//
// Thread safety: a TopkTraceSynthesizer is not thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "executor/topk_trace.h"
#include "tierkv/status.h"

namespace tierkv::bench {

struct TopkSynthOptions {
  // Which layers run their own indexer ("full"); shared layers reuse the
  // last full layer's selection and get none in the trace. Default: GLM-5.2
  // (78 layers, index_topk_freq 4, index_skip_topk_offset 3: 21 full).
  std::vector<bool> indexer_full;
  // Ids per selection (index_topk). Default: 2048.
  int64_t k = 2048;
  // KV page size recorded in the header, tokens. Default: 64.
  int64_t page_tokens = 64;
  // Tokens visible at the first step (its position + 1). Default: 32768.
  int64_t context_tokens = 32768;
  // Decode steps; the context grows by one token per step. Default: 256.
  int64_t steps = 256;
  // The first N tokens, always selected. Default: 4.
  int64_t sink_tokens = 4;
  // The last W tokens (the newest included), always selected; 0 still
  // selects the newest token. Default: 64.
  int64_t recent_tokens = 64;
  // Target consecutive-step overlap of layers [0, edge_layers). Defaults:
  // 2 layers, 0.015 (the blog's layers 0-1).
  int64_t edge_layers = 2;
  double edge_overlap = 0.015;
  // Target overlap of every other layer. Default: 0.44 (the blog's mean).
  double overlap = 0.44;
  // When non-empty: the target of each full layer, in order (overrides the
  // two above). Default: empty.
  std::vector<double> overlap_per_full_layer;
  // Zipf exponent s of the token importance (weight rank^-s; 0 = uniform).
  // An assumption: no published per-token distribution. Default: 1.0.
  double importance_exponent = 1.0;
  // Largest |achieved - target| overlap that counts as met, per layer.
  // Default: 0.02.
  double overlap_tolerance = 0.02;
  // Default: 1.
  uint64_t seed = 1;
  // Header `source` text; empty = a description of these options.
  std::string source;

  TopkSynthOptions();
  // Checks ranges. Returns InvalidArgument naming the field.
  Status Validate() const;
  // The target overlap of each full layer.
  std::vector<double> TargetOverlaps() const;
  std::string Describe() const;
};

// Sets indexer_full and k of a named shape: "glm5.2" (78 layers, 21 full,
// k 2048) or "glm5-small" (8 layers, full 0,1,2,6, k 256), taken from the
// executor's presets (glm5-shape, glm5-small). InvalidArgument otherwise.
Status ApplyTopkSynthShape(std::string_view shape, TopkSynthOptions* options);

// Generates the steps of one trace, in order.
class TopkTraceSynthesizer {
 public:
  // Returns InvalidArgument for options that do not Validate().
  static Result<std::unique_ptr<TopkTraceSynthesizer>> Create(
      const TopkSynthOptions& options);
  ~TopkTraceSynthesizer();
  TopkTraceSynthesizer(const TopkTraceSynthesizer&) = delete;
  TopkTraceSynthesizer& operator=(const TopkTraceSynthesizer&) = delete;

  const executor::TopkTraceHeader& header() const { return header_; }
  // Writes the next step to *step; false once options.steps were made.
  bool Next(executor::TopkStep* step);
  // Per full layer: the mean over steps t >= 1 of the overlap the
  // generator aimed at, round(target * k) clamped to what the forced
  // tokens and the pool of unselected tokens allow, divided by |S_t|. The
  // achieved overlap equals it; it differs from the target only where the
  // target is infeasible.
  std::vector<double> AchievableOverlap() const;
  // Per full layer: steps t >= 1 whose target could not be met exactly.
  std::vector<int64_t> ClampedSteps() const;

 private:
  struct Layer;  // per full layer state, defined in the .cc
  TopkTraceSynthesizer(TopkSynthOptions options,
                       executor::TopkTraceHeader header);
  void SelectStep(Layer& layer, std::vector<int32_t>* out);

  TopkSynthOptions options_;
  executor::TopkTraceHeader header_;
  std::vector<std::unique_ptr<Layer>> layers_;
  int64_t step_ = 0;
  int64_t context_ = 0;  // tokens visible at the current step
};

struct TopkSynthLayerReport {
  int32_t layer = 0;
  double target = 0;
  double achievable = 0;
  double achieved = 0;  // measured from the file
  // Steps whose target the forced tokens (or the pool) made infeasible.
  int64_t infeasible_steps = 0;
  int64_t distinct_ids = 0;
  // |achieved - target| <= tolerance, or, where the target is infeasible,
  // |achieved - achievable| <= tolerance.
  bool met = false;
};

struct TopkSynthReport {
  executor::TopkTraceSummary trace;  // read back from the file
  std::vector<TopkSynthLayerReport> layers;
  double mean_target = 0;
  double mean_achieved = 0;
  bool all_met = false;
  double seconds = 0;  // generating and writing
};

// Generates a trace into `path`, reads it back and measures its overlap
// with executor::SummarizeTopkTrace. Returns InvalidArgument for bad
// options and the writer's and reader's errors.
Result<TopkSynthReport> WriteSyntheticTopkTrace(
    const std::filesystem::path& path, const TopkSynthOptions& options);

}  // namespace tierkv::bench
