// Prefill + decode loop (see generator.h).
#include "executor/generator.h"

#include <chrono>

namespace tierkv::executor {

Result<GenerateResult> Generate(Model& model, KvCache* cache,
                                std::span<const int32_t> prompt,
                                const GenerateOptions& options) {
  using Clock = std::chrono::steady_clock;
  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  if (options.max_new_tokens <= 0) return r;
  Sampler sampler(options.sampler);
  auto t0 = Clock::now();
  auto logits = model.Forward(prompt, cache);
  if (!logits.ok()) return logits.status();
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<float> current = std::move(logits).value();
  auto t1 = Clock::now();
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int32_t token = sampler.Sample(current);
    r.tokens.push_back(token);
    if (options.keep_logits) {
      r.logits.insert(r.logits.end(), current.begin(), current.end());
    }
    if (i + 1 == options.max_new_tokens) break;
    auto next = model.Forward(std::span<const int32_t>(&token, 1), cache);
    if (!next.ok()) return next.status();
    current = std::move(next).value();
    ++r.decode_steps;
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return r;
}

}  // namespace tierkv::executor
