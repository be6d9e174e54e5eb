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
  auto start = cache->AttachPrefix(prompt);
  if (!start.ok()) return start.status();
  const int64_t attached = *start;
  auto logits =
      model.Forward(prompt.subspan(static_cast<size_t>(*start)), cache);
  if (!logits.ok()) {
    start = cache->RecoverPrefix(logits.status());
    if (!start.ok()) return start.status();
    logits = model.Forward(prompt.subspan(static_cast<size_t>(*start)), cache);
    if (!logits.ok()) return logits.status();
  }
  r.prefix_tokens = *start;
  r.prefix_tokens_recomputed = attached - *start;
  std::vector<int32_t> sequence(prompt.begin(), prompt.end());
  TIERKV_RETURN_IF_ERROR(cache->CommitTokens(sequence));
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<float> current = std::move(logits).value();
  std::unique_ptr<SparseWorkingSet> working_set;
  if (options.working_set) {
    auto ws = model.NewWorkingSet(cache, *options.working_set);
    if (!ws.ok()) return ws.status();
    working_set = std::move(ws).value();
  }
  auto report = [&]() -> Status {
    if (!working_set || options.report_interval <= 0) return Status::OK();
    const auto counts = working_set->TakeSelectionCounts();
    return cache->ReportSelections(counts);
  };
  auto t1 = Clock::now();
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int32_t token = sampler.Sample(current);
    r.tokens.push_back(token);
    if (options.keep_logits) {
      r.logits.insert(r.logits.end(), current.begin(), current.end());
    }
    if (i + 1 == options.max_new_tokens) break;
    auto next = model.Forward(std::span<const int32_t>(&token, 1), cache,
                              /*all_logits=*/false, working_set.get());
    if (!next.ok()) return next.status();
    current = std::move(next).value();
    sequence.push_back(token);
    if (sequence.size() % static_cast<size_t>(cache->geometry().page_tokens) ==
        0) {
      TIERKV_RETURN_IF_ERROR(cache->CommitTokens(sequence));
    }
    ++r.decode_steps;
    if (options.report_interval > 0 &&
        r.decode_steps % options.report_interval == 0) {
      TIERKV_RETURN_IF_ERROR(report());
    }
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  TIERKV_RETURN_IF_ERROR(report());
  if (working_set) {
    r.working_set = working_set->stats();
    r.working_set_buffer = working_set->buffer_backend();
    r.working_set_fallback = working_set->buffer_fallback();
  }
  return r;
}

}  // namespace tierkv::executor
