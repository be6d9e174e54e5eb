// Multi-turn sessions through a TierKvCache (see sessions.h).
#include "executor/sessions.h"

#include "executor/generator.h"

namespace tierkv::executor {

namespace {

// Deterministic token ids for (seed, stream): a small LCG, as the tests'.
std::vector<int32_t> TokenIds(uint64_t seed, uint64_t stream, int64_t n,
                              int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t s =
      seed * 0x9E3779B97F4A7C15ull + stream * 0xBF58476D1CE4E5B9ull + 1;
  for (auto& id : ids) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  return ids;
}

}  // namespace

Result<std::vector<TurnReport>> RunSessions(
    Model& model, const TierKvCacheOptions& cache_options,
    const SessionsOptions& options,
    const std::function<void(const TurnReport&)>& on_turn) {
  if (options.sessions <= 0 || options.turns <= 0 ||
      options.system_tokens < 0 || options.user_tokens <= 0 ||
      options.reply_tokens <= 0) {
    return Status::InvalidArgument(
        "serve-sessions: sessions, turns, user and reply tokens must be > 0 "
        "and the system prompt >= 0 tokens");
  }
  const int64_t vocab = model.config().vocab_size;
  const std::vector<int32_t> system =
      TokenIds(options.seed, 0, options.system_tokens, vocab);
  std::vector<std::vector<int32_t>> history(
      static_cast<size_t>(options.sessions), system);
  std::vector<TurnReport> reports;
  GenerateOptions gen;
  gen.max_new_tokens = options.reply_tokens;
  gen.keep_logits = options.check;
  for (int turn = 0; turn < options.turns; ++turn) {
    for (int s = 0; s < options.sessions; ++s) {
      std::vector<int32_t>& prompt = history[static_cast<size_t>(s)];
      const std::vector<int32_t> user =
          TokenIds(options.seed, 1 + static_cast<uint64_t>(s) * 1000 + turn,
                   options.user_tokens, vocab);
      prompt.insert(prompt.end(), user.begin(), user.end());
      const int64_t max_tokens =
          static_cast<int64_t>(prompt.size()) + options.reply_tokens;

      auto cache = TierKvCache::Create(
          GeometryFor(model.config(), max_tokens, options.kv_dtype),
          cache_options);
      if (!cache.ok()) return cache.status();
      auto r = Generate(model, cache->get(), prompt, gen);
      if (!r.ok()) return r.status();
      const TierKvCacheStats st = (*cache)->stats();
      TurnReport report;
      report.session = s;
      report.turn = turn;
      report.prompt_tokens = r->prompt_tokens;
      report.loaded_tokens = r->prefix_tokens;
      report.prefilled_tokens = r->prompt_tokens - r->prefix_tokens;
      report.recomputed_tokens = r->prefix_tokens_recomputed;
      report.pages_hbm = st.pages_from_hbm;
      report.pages_host = st.pages_from_host;
      report.pages_nvme = st.pages_from_nvme;
      report.ttft_seconds = r->prefill_seconds;
      report.decode_tokens_per_second =
          r->decode_seconds > 0 ? r->decode_steps / r->decode_seconds : 0;
      report.degraded = st.degraded;
      cache->reset();  // waits for its stores: the next turn may load them
      report.bytes_loaded = st.bytes_loaded;
      report.bytes_stored = st.bytes_stored;

      if (options.check) {
        auto local = model.NewCache(max_tokens, options.kv_dtype);
        if (!local.ok()) return local.status();
        auto reference = Generate(model, local->get(), prompt, gen);
        if (!reference.ok()) return reference.status();
        report.checked = true;
        report.logits_identical =
            reference->logits == r->logits && reference->tokens == r->tokens;
      }
      // The reply joins the history; its last token was never fed, so it
      // is the first token of the next turn's new part.
      prompt.insert(prompt.end(), r->tokens.begin(), r->tokens.end());
      if (on_turn) on_turn(report);
      reports.push_back(report);
    }
  }
  return reports;
}

}  // namespace tierkv::executor
