// Generate: prefill a prompt, then decode token by token, timing both.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "executor/kv_cache.h"
#include "executor/model.h"
#include "executor/sampler.h"
#include "tierkv/status.h"

namespace tierkv::executor {

struct GenerateOptions {
  // Tokens to generate. Default: 16.
  int64_t max_new_tokens = 16;
  SamplerOptions sampler;
  // Keep the logits that produced each generated token. Default: false.
  bool keep_logits = false;
  // Decode through a sparse working set of these options
  // (Model::NewWorkingSet over the cache): each step's sparse attention
  // reads the selected rows from its slots. Default: none (rows are read
  // from the cache directly).
  std::optional<WorkingSetOptions> working_set;
  // With a working set: hand its selection counts to the cache
  // (KvCache::ReportSelections; TierKvCache sends them to tierkvd) every
  // this many decode steps, and at the end; 0 never. Default: 32.
  int64_t report_interval = 32;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated tokens
  // [tokens.size(), vocab] when keep_logits: row 0 = logits at the last
  // prompt position, row i = logits after feeding generated token i - 1.
  std::vector<float> logits;
  int64_t prompt_tokens = 0;
  // Prompt tokens whose rows came from the cache's store (not prefilled),
  // and attached ones that did not arrive and were recomputed.
  int64_t prefix_tokens = 0;
  int64_t prefix_tokens_recomputed = 0;
  int64_t decode_steps = 0;     // Forward calls after the prefill
  WorkingSetStats working_set;  // zeros without a working set
  // Where its slots were ("host", "emulated", "cuda"), and why "auto"
  // emulated a device ("" otherwise).
  std::string working_set_buffer;
  std::string working_set_fallback;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// REQUIRES: !prompt.empty(), `cache` empty and sized for prompt +
// max_new_tokens. A stored prefix of the prompt is reused through the
// cache's AttachPrefix / RecoverPrefix / CommitTokens (see KvCache).
// Returns Model::Forward's errors and the cache's.
Result<GenerateResult> Generate(Model& model, KvCache* cache,
                                std::span<const int32_t> prompt,
                                const GenerateOptions& options);

}  // namespace tierkv::executor
