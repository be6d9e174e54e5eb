// tierkv-run: runs the reference GLM-5 / DeepSeek-V3.2 DSA executor on a
// checkpoint, or writes a seeded random checkpoint of a preset shape.
//
//   tierkv-run --model DIR --prompt-ids 1,2,3 --max-new-tokens 8 --greedy
//   tierkv-run --model DIR --prompt-ids 1,2,3 --temperature 0.8 --seed 7
//              --logits-out logits.npy
//   tierkv-run --write-random-model DIR --preset tiny|glm5-small|glm5-shape
//   tierkv-run --model DIR --prompt-ids ... --tierkv [SOCKET]
//              [--namespace N --token-file F] [--tierkv-required]
//   tierkv-run serve-sessions --model DIR --tierkv [SOCKET] --sessions 3
//              --turns 3 [--no-check]
//   tierkv-run --model DIR --prompt-ids ... --record-topk trace.tk
//
// --record-topk writes every decode step's top-k selections, per full
// indexer layer, as a top-k trace (topk_trace.h), and prints its size and
// consecutive-step overlap per layer.
//
// With --tierkv the KV cache is a TierKvCache: the prompt's stored prefix
// is loaded from tierkvd instead of prefilled, and every full page is
// stored for later requests. Without a reachable daemon the run goes on
// without it (and says so), unless --tierkv-required. Prefix reuse needs
// one attention form for every chunking, so --tierkv runs the absorbed
// MQA form (FlashMLA's); compare against --attention mqa runs.
//
// Exit status: 0 success, 1 a model/IO error (message on stderr), 2 usage.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/checkpoint_writer.h"
#include "executor/config.h"
#include "executor/daemon_weights.h"
#include "executor/generator.h"
#include "executor/kernels.h"
#include "executor/model.h"
#include "executor/npy.h"
#include "executor/presets.h"
#include "executor/sessions.h"
#include "executor/tier_kv_cache.h"
#include "executor/topk_trace.h"
#include "executor/topk_trace_recorder.h"
#include "executor/weights.h"

namespace tierkv::executor {
namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "tierkv-run: error: %s\n", s.ToString().c_str());
  return 1;
}

Result<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX) {
      return Status::InvalidArgument(
          fmt::format("--prompt-ids: '{}' is not a token id", item));
    }
    ids.push_back(static_cast<int32_t>(v));
    pos = comma + 1;
  }
  return ids;
}

int WriteModel(const std::string& dir, const std::string& preset,
               const std::string& dtype_name, uint64_t seed, bool config_only) {
  auto config = PresetConfig(preset);
  if (!config.ok()) return Fail(config.status());
  auto dtype = ParseDType(dtype_name);
  if (!dtype.ok()) return Fail(dtype.status());
  CheckpointWriterOptions opts;
  opts.seed = seed;
  opts.dtype = *dtype;
  // glm5-shape is ~1.5 TB of weights: only its config is ever written.
  opts.config_only = config_only || preset == "glm5-shape";
  if (Status s = WriteRandomCheckpoint(dir, *config, opts); !s.ok()) {
    return Fail(s);
  }
  // Validate what was written by loading the config back.
  auto back = LoadModelConfig(dir);
  if (!back.ok()) return Fail(back.status());
  const auto tensors = ExpectedTensors(*back);
  std::vector<int64_t> full;
  for (int64_t l = 0; l < back->num_hidden_layers; ++l) {
    if (back->indexer_full[l]) full.push_back(l);
  }
  std::printf("wrote %s (preset %s, %s%s)\n", dir.c_str(), preset.c_str(),
              std::string(DTypeName(*dtype)).c_str(),
              opts.config_only ? ", config.json only" : "");
  std::printf("  layers %lld, hidden %lld, heads %lld, vocab %lld\n",
              static_cast<long long>(back->num_hidden_layers),
              static_cast<long long>(back->hidden_size),
              static_cast<long long>(back->num_attention_heads),
              static_cast<long long>(back->vocab_size));
  std::printf("  tensors %zu, parameters %llu\n", tensors.size(),
              static_cast<unsigned long long>(ParameterCount(*back)));
  std::printf("  full indexer layers (%zu): %s\n", full.size(),
              fmt::format("{}", fmt::join(full, ",")).c_str());
  return 0;
}

struct TierkvFlags {
  bool enabled = false;
  KvDtype kv_dtype = KvDtype::kF32;
  std::string socket;
  std::string namespace_name;
  std::string token_file;
  bool required = false;
};

Result<std::string> ReadToken(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    return Status::PermissionDenied(
        fmt::format("cannot read the namespace token file {}: {}", path,
                    std::strerror(errno)));
  }
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf), f);
  std::fclose(f);
  std::string token(buf, n);
  while (!token.empty() &&
         std::isspace(static_cast<unsigned char>(token.back())))
    token.pop_back();
  return token;
}

void AddTierkvFlags(CLI::App* app, TierkvFlags* tierkv, CLI::Option** socket) {
  tierkv->namespace_name = "default";
  *socket = app->add_option("--tierkv", tierkv->socket,
                            "use tierkvd at SOCKET (default "
                            "/run/tierkv/tierkv.sock) for the KV cache")
                ->expected(0, 1);
  app->add_option("--namespace", tierkv->namespace_name, "tierkv namespace")
      ->capture_default_str();
  app->add_option("--token-file", tierkv->token_file,
                  "file holding the namespace's token (default: "
                  "<socket dir>/<namespace>.token, as tierkvd writes it)");
  app->add_flag("--tierkv-required", tierkv->required,
                "fail instead of running without an unreachable tierkvd");
  app->add_option("--kv-dtype", tierkv->kv_dtype,
                  "KV cache row format: fp32 (exact, the default), bf16, or "
                  "fp8 (DeepSeek-V3.2 / FlashMLA: 656 B latent, 132 B "
                  "indexer key per token for GLM-5)")
      ->transform(CLI::CheckedTransformer(
                      std::map<std::string, KvDtype>{{"fp32", KvDtype::kF32},
                                                     {"bf16", KvDtype::kBF16},
                                                     {"fp8", KvDtype::kFP8}},
                      CLI::ignore_case)
                      .description(""))
      ->type_name("fp32|bf16|fp8");
}

// The token of namespace `ns` at the daemon listening on `socket_path`:
// from `token_file`, or else from <socket dir>/<ns>.token, where tierkvd
// writes the tokens it makes.
Result<std::string> NamespaceToken(const std::string& socket_path,
                                   const std::string& ns,
                                   const std::string& token_file) {
  return ReadToken(
      !token_file.empty()
          ? token_file
          : (std::filesystem::path(socket_path).parent_path() / (ns + ".token"))
                .string());
}

// How the run's TierKvCaches reach the daemon; an unreachable daemon is
// reported once per run.
Result<TierKvCacheOptions> CacheOptions(const Model& model,
                                        const TierkvFlags& tierkv) {
  TierKvCacheOptions o;
  if (!tierkv.socket.empty()) o.client.socket_path = tierkv.socket;
  o.namespace_name = tierkv.namespace_name;
  auto token =
      NamespaceToken(o.client.socket_path, o.namespace_name, tierkv.token_file);
  if (!token.ok()) return token.status();
  o.token = *token;
  o.salt = ModelIdentity(model);
  o.required = tierkv.required;
  auto told = std::make_shared<bool>(false);
  o.on_degraded = [told](const Status& why) {
    if (*told) return;
    *told = true;
    std::fprintf(stderr,
                 "tierkv-run: tierkv unavailable (%s); running without it\n",
                 why.ToString().c_str());
  };
  return o;
}

// The cache for one run: in process, or a TierKvCache.
Result<std::unique_ptr<KvCache>> MakeCache(const Model& model,
                                           int64_t max_tokens,
                                           const TierkvFlags& tierkv) {
  if (!tierkv.enabled) return model.NewCache(max_tokens, tierkv.kv_dtype);
  auto o = CacheOptions(model, tierkv);
  if (!o.ok()) return o.status();
  auto cache = TierKvCache::Create(
      GeometryFor(model.config(), max_tokens, tierkv.kv_dtype), *o);
  if (!cache.ok()) return cache.status();
  return std::unique_ptr<KvCache>(std::move(cache).value());
}

void PrintTierkvLine(const KvCache& cache, const GenerateResult& r) {
  const auto* tier = dynamic_cast<const TierKvCache*>(&cache);
  if (tier == nullptr) return;
  const TierKvCacheStats& s = tier->stats();
  std::printf(
      "tierkv: %lld of %lld prompt tokens loaded (pages: hbm %lld, host %lld, "
      "nvme %lld, peer %lld), %lld recomputed after a failed load, %lld pages "
      "stored, "
      "%.2f MB loaded, %.2f MB stored%s%s\n",
      static_cast<long long>(r.prefix_tokens),
      static_cast<long long>(r.prompt_tokens),
      static_cast<long long>(s.pages_from_hbm),
      static_cast<long long>(s.pages_from_host),
      static_cast<long long>(s.pages_from_nvme),
      static_cast<long long>(s.pages_from_peer),
      static_cast<long long>(r.prefix_tokens_recomputed),
      static_cast<long long>(s.pages_stored), s.bytes_loaded / 1e6,
      s.bytes_stored / 1e6,
      s.pages_store_failed > 0
          ? fmt::format(" ({} pages not stored)", s.pages_store_failed).c_str()
          : "",
      s.degraded ? " (degraded: daemon not used)" : "");
}

// What a recorded trace says about the run that made it.
std::string TraceSource(const std::string& dir, const ModelConfig& c,
                        size_t prompt_tokens, const GenerateOptions& gen,
                        const std::string& attention, bool tierkv) {
  return fmt::format(
      "tierkv-run --model {} ({}, {} layers, index_topk {}): prompt {} "
      "tokens, {} new tokens, {}, attention {}{}",
      dir, c.model_type, c.num_hidden_layers, c.index_topk, prompt_tokens,
      gen.max_new_tokens,
      gen.sampler.greedy
          ? std::string("greedy")
          : fmt::format("temperature {} seed {}", gen.sampler.temperature,
                        gen.sampler.seed),
      tierkv ? "mqa" : attention, tierkv ? ", tierkv" : "");
}

void PrintTraceSummary(const std::string& path) {
  auto s = SummarizeTopkTrace(path);
  if (!s.ok()) {
    std::fprintf(stderr, "tierkv-run: reading back %s: %s\n", path.c_str(),
                 s.status().ToString().c_str());
    return;
  }
  std::vector<std::string> overlap;
  for (size_t f = 0; f < s->mean_overlap.size(); ++f) {
    overlap.push_back(
        fmt::format("{}:{:.3f}", s->header.full_layers[f], s->mean_overlap[f]));
  }
  std::printf(
      "topk trace: %s: %lld decode steps x %zu full layers (k %lld), %llu "
      "bytes (%.2f bytes/id)\n"
      "  consecutive-step overlap per full layer: %s\n",
      path.c_str(), static_cast<long long>(s->steps),
      s->header.full_layers.size(), static_cast<long long>(s->header.k),
      static_cast<unsigned long long>(s->file_bytes),
      s->ids > 0 ? static_cast<double>(s->file_bytes) / s->ids : 0.0,
      fmt::format("{}", fmt::join(overlap, " ")).c_str());
}

int RunModel(const std::string& dir, const std::string& prompt_text,
             const GenerateOptions& gen, const std::string& logits_out,
             int threads, const std::string& attention,
             const TierkvFlags& tierkv, const std::string& record_topk) {
  auto prompt = ParseIds(prompt_text);
  if (!prompt.ok()) return Fail(prompt.status());
  // Created once the model and its cache exist; declared first because the
  // model's observer borrows it.
  std::unique_ptr<TopkTraceRecorder> recorder;
  ModelOptions mo;
  if (!record_topk.empty()) {
    mo.observer = [&recorder](int64_t layer, int64_t position,
                              std::span<const float>,
                              std::span<const int32_t> selected) {
      if (recorder) recorder->OnSelection(layer, position, selected);
    };
  }
  mo.num_threads = threads;
  if (attention == "mqa") mo.attention_mode = AttentionMode::kAbsorbedMqa;
  if (attention == "mha") mo.attention_mode = AttentionMode::kMha;
  if (tierkv.enabled && attention != "mqa") {
    if (attention == "mha") {
      std::fprintf(stderr,
                   "tierkv-run: error: --tierkv needs --attention mqa or "
                   "auto\n");
      return 2;
    }
    mo.attention_mode = AttentionMode::kAbsorbedMqa;  // see the file comment
  }
  auto model = Model::Load(dir, mo);
  if (!model.ok()) return Fail(model.status());
  const int64_t max_tokens =
      static_cast<int64_t>(prompt->size()) + gen.max_new_tokens;
  auto cache = MakeCache(**model, max_tokens, tierkv);
  if (!cache.ok()) return Fail(cache.status());
  const int64_t prompt_tokens = static_cast<int64_t>(prompt->size());
  if (!record_topk.empty()) {
    auto r = TopkTraceRecorder::Create(
        record_topk, (*model)->config(), (*cache)->geometry().page_tokens,
        /*first_decode_position=*/prompt_tokens,
        TraceSource(dir, (*model)->config(), prompt->size(), gen, attention,
                    tierkv.enabled));
    if (!r.ok()) return Fail(r.status());
    recorder = std::move(r).value();
  }
  GenerateOptions opts = gen;
  opts.keep_logits = !logits_out.empty();
  auto r = Generate(**model, cache->get(), *prompt, opts);
  if (!r.ok()) return Fail(r.status());
  std::printf("generated: %s\n",
              fmt::format("{}", fmt::join(r->tokens, ",")).c_str());
  const double prefill_tps =
      r->prefill_seconds > 0 ? r->prompt_tokens / r->prefill_seconds : 0.0;
  const double decode_tps =
      r->decode_seconds > 0 ? r->decode_steps / r->decode_seconds : 0.0;
  std::printf("prefill: %lld tokens in %.3f s = %.1f tokens/s\n",
              static_cast<long long>(r->prompt_tokens), r->prefill_seconds,
              prefill_tps);
  std::printf(
      "decode: %lld tokens in %.3f s = %.1f tokens/s (threads %d, kernels "
      "%s)\n",
      static_cast<long long>(r->decode_steps), r->decode_seconds, decode_tps,
      (*model)->num_threads(), KernelIsa());
  PrintTierkvLine(**cache, *r);
  if (gen.working_set) {
    const WorkingSetStats& w = r->working_set;
    const std::string memory = r->working_set_buffer == "host"
                                   ? "host memory"
                                   : r->working_set_buffer + " device memory";
    if (!r->working_set_fallback.empty()) {
      std::printf("working set: %s\n", r->working_set_fallback.c_str());
    }
    std::printf(
        "working set (%s, %u slots in %s): %llu of %llu selected rows were "
        "resident (%.1f%%), %llu misses, %.2f MB copied in (%llu device "
        "gathers), %llu evictions\n",
        WorkingSetPolicyName(gen.working_set->policy), gen.working_set->slots,
        memory.c_str(), static_cast<unsigned long long>(w.hits),
        static_cast<unsigned long long>(w.selected),
        w.selected ? 100.0 * static_cast<double>(w.hits) / w.selected : 0.0,
        static_cast<unsigned long long>(w.misses), w.bytes_in / 1e6,
        static_cast<unsigned long long>(w.gathers),
        static_cast<unsigned long long>(w.evictions));
  }
  if (recorder) {
    if (Status s = recorder->Finish(prompt_tokens + r->decode_steps); !s.ok()) {
      return Fail(s);
    }
    PrintTraceSummary(record_topk);
  }
  if (!logits_out.empty()) {
    const int64_t vocab = (*model)->config().vocab_size;
    const int64_t rows = static_cast<int64_t>(r->tokens.size());
    if (Status s = WriteNpy(logits_out, r->logits, {rows, vocab}); !s.ok()) {
      return Fail(s);
    }
    std::printf("logits: %s float32 [%lld, %lld]\n", logits_out.c_str(),
                static_cast<long long>(rows), static_cast<long long>(vocab));
  }
  return 0;
}

// Teacher switching through tierkvd (issue 28): every --model is stored in
// the daemon's weights namespace once, then the models run in --sequence
// order, each loaded from the daemon (DRAM, or NVMe through DRAM) into
// this process right before it runs, as a multi-teacher distillation step
// switches teachers. Each run's logits are compared with the same model
// loaded from its files.
struct SwitchOptions {
  std::vector<std::string> models;
  std::vector<int> sequence;
  std::string weights_namespace = "weights";
  std::string weights_token_file;
  std::string logits_dir;
  bool check = true;
};

int SwitchModels(const SwitchOptions& o, const std::string& prompt_text,
                 const GenerateOptions& gen, int threads,
                 const TierkvFlags& tierkv) {
  auto prompt = ParseIds(prompt_text);
  if (!prompt.ok()) return Fail(prompt.status());
  DaemonWeightsOptions dwo;
  if (!tierkv.socket.empty()) dwo.client.socket_path = tierkv.socket;
  dwo.namespace_name = o.weights_namespace;
  auto token = NamespaceToken(dwo.client.socket_path, dwo.namespace_name,
                              o.weights_token_file);
  if (!token.ok()) return Fail(token.status());
  dwo.token = *token;
  auto daemon = DaemonWeights::Connect(dwo);
  if (!daemon.ok()) return Fail(daemon.status());

  ModelOptions mo;
  mo.num_threads = threads;
  std::vector<ModelConfig> configs;
  std::vector<WeightsManifest> manifests;
  for (size_t i = 0; i < o.models.size(); ++i) {
    auto config = LoadModelConfig(o.models[i]);
    if (!config.ok()) return Fail(config.status());
    configs.push_back(*config);
    const std::string name =
        fmt::format("tierkv-run.{}",
                    std::filesystem::path(o.models[i]).filename().string());
    const auto t0 = std::chrono::steady_clock::now();
    auto m = (*daemon)->Import(name, o.models[i]);
    if (!m.ok()) return Fail(m.status());
    std::printf(
        "stored model %zu (%s) as %s version %s: %.2f MB in %.3f s\n", i,
        o.models[i].c_str(), name.c_str(), WeightsVersionOf(*m).ToHex().c_str(),
        m->image_bytes / 1e6,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count());
    manifests.push_back(std::move(m).value());
  }
  std::vector<std::optional<std::vector<float>>> from_files(o.models.size());
  int identical = 0, checked = 0;
  for (size_t step = 0; step < o.sequence.size(); ++step) {
    const size_t i = static_cast<size_t>(o.sequence[step]);
    WeightsLoadReport report;
    auto model = (*daemon)->LoadModel(manifests[i], configs[i], mo, &report);
    if (!model.ok()) return Fail(model.status());
    auto cache = (*model)->NewCache(static_cast<int64_t>(prompt->size()) +
                                    gen.max_new_tokens);
    if (!cache.ok()) return Fail(cache.status());
    GenerateOptions g = gen;
    g.keep_logits = true;
    auto r = Generate(**model, cache->get(), *prompt, g);
    if (!r.ok()) return Fail(r.status());
    std::string verdict = "-";
    if (o.check) {
      if (!from_files[i]) {
        auto ref_model = Model::Load(o.models[i], mo);
        if (!ref_model.ok()) return Fail(ref_model.status());
        auto ref_cache = (*ref_model)
                             ->NewCache(static_cast<int64_t>(prompt->size()) +
                                        gen.max_new_tokens);
        if (!ref_cache.ok()) return Fail(ref_cache.status());
        auto ref = Generate(**ref_model, ref_cache->get(), *prompt, g);
        if (!ref.ok()) return Fail(ref.status());
        from_files[i] = std::move(ref->logits);
      }
      ++checked;
      const bool same = from_files[i]->size() == r->logits.size() &&
                        std::memcmp(from_files[i]->data(), r->logits.data(),
                                    r->logits.size() * sizeof(float)) == 0;
      identical += same;
      verdict = same ? "logits identical to the files'" : "MISMATCH";
    }
    std::printf(
        "step %zu: model %zu from tierkvd (%u chunks in DRAM, %u on NVMe "
        "only): %.2f MB in %.3f s (%.2f GB/s), converted in %.3f s; "
        "generated %s; %s\n",
        step, i, report.chunks_in_dram, report.chunks_on_nvme,
        report.bytes / 1e6, report.load_seconds,
        report.load_seconds > 0 ? report.bytes / report.load_seconds / 1e9 : 0,
        report.convert_seconds,
        fmt::format("{}", fmt::join(r->tokens, ",")).c_str(), verdict.c_str());
    if (!o.logits_dir.empty()) {
      const int64_t vocab = configs[i].vocab_size;
      const std::string path = fmt::format("{}/step{}.npy", o.logits_dir, step);
      if (Status s = WriteNpy(path, r->logits,
                              {static_cast<int64_t>(r->tokens.size()), vocab});
          !s.ok()) {
        return Fail(s);
      }
    }
  }
  if (checked > 0) {
    std::printf("logits identical to loading from files: %d of %d steps%s\n",
                identical, checked,
                identical == checked ? "" : "  <-- MISMATCH");
  }
  return identical == checked ? 0 : 1;
}

int ServeSessions(const std::string& dir, const SessionsOptions& options,
                  int threads, const TierkvFlags& tierkv) {
  ModelOptions mo;
  mo.num_threads = threads;
  mo.attention_mode = AttentionMode::kAbsorbedMqa;  // see the file comment
  auto model = Model::Load(dir, mo);
  if (!model.ok()) return Fail(model.status());
  auto cache_options = CacheOptions(**model, tierkv);
  if (!cache_options.ok()) return Fail(cache_options.status());
  std::printf(
      "serve-sessions: %d sessions x %d turns, system prompt %lld tokens, "
      "%lld user + %lld reply tokens per turn, KV %s, threads %d\n\n",
      options.sessions, options.turns,
      static_cast<long long>(options.system_tokens),
      static_cast<long long>(options.user_tokens),
      static_cast<long long>(options.reply_tokens),
      std::string(KvDtypeName(options.kv_dtype)).c_str(),
      (*model)->num_threads());
  std::printf(
      "session turn  prompt  loaded  prefilled  pages hbm/host/nvme  "
      "recomputed  TTFT ms  decode tok/s   MB in  MB out  logits\n");
  int64_t prompt_total = 0, loaded_total = 0, host_pages = 0, nvme_pages = 0;
  int checked = 0, identical = 0;
  auto reports =
      RunSessions(**model, *cache_options, options, [&](const TurnReport& t) {
        std::printf(
            "%7d %4d %7lld %7lld %10lld  %6lld/%4lld/%4lld  %10lld %8.1f "
            "%13.1f %7.2f %7.2f  %s\n",
            t.session, t.turn, static_cast<long long>(t.prompt_tokens),
            static_cast<long long>(t.loaded_tokens),
            static_cast<long long>(t.prefilled_tokens),
            static_cast<long long>(t.pages_hbm),
            static_cast<long long>(t.pages_host),
            static_cast<long long>(t.pages_nvme),
            static_cast<long long>(t.recomputed_tokens), t.ttft_seconds * 1e3,
            t.decode_tokens_per_second, t.bytes_loaded / 1e6,
            t.bytes_stored / 1e6,
            !t.checked           ? "-"
            : t.logits_identical ? "identical"
                                 : "MISMATCH");
        std::fflush(stdout);
        prompt_total += t.prompt_tokens;
        loaded_total += t.loaded_tokens;
        host_pages += t.pages_host;
        nvme_pages += t.pages_nvme;
        checked += t.checked;
        identical += t.checked && t.logits_identical;
      });
  if (!reports.ok()) return Fail(reports.status());
  std::printf(
      "\nprompt tokens: %lld, served by tierkv: %lld (%.0f%%; pages from "
      "host %lld, from nvme %lld), prefilled: %lld\n",
      static_cast<long long>(prompt_total),
      static_cast<long long>(loaded_total),
      prompt_total ? 100.0 * loaded_total / prompt_total : 0.0,
      static_cast<long long>(host_pages), static_cast<long long>(nvme_pages),
      static_cast<long long>(prompt_total - loaded_total));
  if (checked > 0) {
    std::printf("logits identical to a run without tierkv: %d of %d turns%s\n",
                identical, checked,
                identical == checked ? "" : "  <-- MISMATCH");
  }
  return identical == checked ? 0 : 1;
}

}  // namespace
}  // namespace tierkv::executor

int main(int argc, char** argv) {
  using namespace tierkv::executor;
  CLI::App app{"tierkv-run: reference GLM-5 / DeepSeek-V3.2 DSA executor"};
  std::string model_dir, prompt = "1", logits_out, write_dir, preset = "tiny",
                         dtype = "BF16", attention = "auto", record_topk;
  int64_t max_new = 16;
  bool greedy = false, config_only = false;
  uint32_t working_set_slots = 0;
  std::string working_set_policy = "topk";
  std::string working_set_memory = "host";
  int64_t report_interval = GenerateOptions{}.report_interval;
  double temperature = 0;
  uint64_t seed = 0;
  int threads = 0;
  app.add_option("--model", model_dir,
                 "checkpoint directory (config.json + safetensors)");
  app.add_option("--prompt-ids", prompt, "comma-separated prompt token ids")
      ->capture_default_str();
  app.add_option("--max-new-tokens", max_new, "tokens to generate")
      ->capture_default_str();
  app.add_flag("--greedy", greedy, "argmax decoding (the default)");
  app.add_option("--temperature", temperature,
                 "sample with this temperature (> 0)");
  app.add_option("--seed", seed,
                 "seed for sampling and for --write-random-model")
      ->capture_default_str();
  app.add_option("--logits-out", logits_out,
                 "write float32 [generated, vocab] logits as .npy");
  app.add_option("--threads", threads, "kernel threads (0 = all cores)")
      ->capture_default_str();
  app.add_option(
         "--record-topk", record_topk,
         "write the top-k selections of every decode step (not the prompt's) "
         "to FILE, one per full indexer layer, as a top-k trace "
         "(executor/topk_trace.h); steps with <= index_topk visible tokens, "
         "which the model does not score, are recorded as every visible "
         "token")
      ->type_name("FILE");
  app.add_option("--working-set", working_set_slots,
                 "decode's sparse attention reads its selected rows through "
                 "a working set of this many token slots per IndexShare "
                 "group (>= index_topk; 0: read the KV cache directly)")
      ->capture_default_str();
  app.add_option("--working-set-policy", working_set_policy,
                 "lru | topk (tokens that keep coming back stay)")
      ->check(CLI::IsMember({"lru", "topk"}))
      ->capture_default_str();
  app.add_option("--working-set-memory", working_set_memory,
                 "host | device: where the working set's slots are (device: "
                 "HBM through the CUDA backend, or a device emulated in host "
                 "memory when there is no GPU; misses go in by the row "
                 "gather)")
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str();
  app.add_option("--report-interval", report_interval,
                 "with --working-set and --tierkv: send the selection counts "
                 "to tierkvd every N decode steps (0: never)")
      ->capture_default_str();
  app.add_option("--attention", attention, "auto | mqa | mha")
      ->check(CLI::IsMember({"auto", "mqa", "mha"}))
      ->capture_default_str();
  app.add_option("--write-random-model", write_dir,
                 "write a seeded random checkpoint to DIR and exit");
  app.add_option(
         "--preset", preset,
         "shape for --write-random-model: tiny | glm5-small | glm5-shape")
      ->capture_default_str();
  app.add_option("--dtype", dtype,
                 "checkpoint dtype: BF16 | F16 | F32 | F8_E4M3")
      ->capture_default_str();
  app.add_flag("--config-only", config_only,
               "write config.json only (always on for glm5-shape)");
  TierkvFlags tierkv;
  CLI::Option* tierkv_opt = nullptr;
  AddTierkvFlags(&app, &tierkv, &tierkv_opt);

  auto* serve = app.add_subcommand(
      "serve-sessions",
      "multi-turn sessions sharing a system prompt, through tierkvd");
  std::string serve_model;
  SessionsOptions sessions;
  bool no_check = false;
  int serve_threads = 0;
  TierkvFlags serve_tierkv;
  CLI::Option* serve_tierkv_opt = nullptr;
  serve->add_option("--model", serve_model, "checkpoint directory")->required();
  serve->add_option("--sessions", sessions.sessions)->capture_default_str();
  serve->add_option("--turns", sessions.turns)->capture_default_str();
  serve->add_option("--system-tokens", sessions.system_tokens)
      ->capture_default_str();
  serve->add_option("--user-tokens", sessions.user_tokens)
      ->capture_default_str();
  serve->add_option("--reply-tokens", sessions.reply_tokens)
      ->capture_default_str();
  serve->add_option("--seed", sessions.seed, "seed of the token ids")
      ->capture_default_str();
  serve->add_flag("--no-check", no_check,
                  "skip the comparison with runs without tierkv");
  serve->add_option("--threads", serve_threads, "kernel threads (0 = all)")
      ->capture_default_str();
  AddTierkvFlags(serve, &serve_tierkv, &serve_tierkv_opt);

  auto* switcher = app.add_subcommand(
      "switch-models",
      "store checkpoints in tierkvd's weights namespace and run them in "
      "turn, each loaded from the daemon (teacher switching), checking "
      "logits against the files");
  SwitchOptions switching;
  std::string switch_prompt = "1";
  int64_t switch_max_new = 8;
  int switch_threads = 0;
  TierkvFlags switch_tierkv;
  CLI::Option* switch_tierkv_opt = nullptr;
  switcher
      ->add_option("--model", switching.models,
                   "checkpoint directory; repeat for each model")
      ->required();
  switcher
      ->add_option("--sequence", switching.sequence,
                   "models to run in turn, by position in --model (default: "
                   "0, 1, ..., 0)")
      ->delimiter(',');
  switcher
      ->add_option("--weights-namespace", switching.weights_namespace,
                   "tierkvd namespace with weights = true")
      ->capture_default_str();
  switcher->add_option("--weights-token-file", switching.weights_token_file,
                       "its token (default: <socket dir>/<namespace>.token)");
  switcher->add_option("--logits-dir", switching.logits_dir,
                       "write each step's logits as DIR/step<N>.npy");
  switcher->add_option("--prompt-ids", switch_prompt)->capture_default_str();
  switcher->add_option("--max-new-tokens", switch_max_new)
      ->capture_default_str();
  switcher->add_option("--threads", switch_threads, "kernel threads (0 = all)")
      ->capture_default_str();
  bool switch_no_check = false;
  switcher->add_flag("--no-check", switch_no_check,
                     "skip loading each model from its files to compare");
  AddTierkvFlags(switcher, &switch_tierkv, &switch_tierkv_opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  tierkv.enabled = tierkv_opt->count() > 0 || tierkv.required;
  if (serve->parsed()) {
    // The point of serve-sessions: --tierkv is implied.
    sessions.check = !no_check;
    sessions.kv_dtype = serve_tierkv.kv_dtype;
    serve_tierkv.enabled = true;
    return ServeSessions(serve_model, sessions, serve_threads, serve_tierkv);
  }
  if (switcher->parsed()) {
    switching.check = !switch_no_check;
    if (switching.sequence.empty()) {
      for (size_t i = 0; i < switching.models.size(); ++i) {
        switching.sequence.push_back(static_cast<int>(i));
      }
      switching.sequence.push_back(0);
    }
    for (int i : switching.sequence) {
      if (i < 0 || static_cast<size_t>(i) >= switching.models.size()) {
        std::fprintf(stderr,
                     "tierkv-run: error: --sequence names model %d of %zu\n", i,
                     switching.models.size());
        return 2;
      }
    }
    GenerateOptions g;
    g.max_new_tokens = switch_max_new;
    return SwitchModels(switching, switch_prompt, g, switch_threads,
                        switch_tierkv);
  }
  if (!write_dir.empty()) {
    return WriteModel(write_dir, preset, dtype, seed, config_only);
  }
  if (model_dir.empty()) {
    std::fprintf(stderr,
                 "tierkv-run: error: --model DIR or "
                 "--write-random-model DIR is required\n");
    return 2;
  }
  if (greedy && temperature > 0) {
    std::fprintf(
        stderr,
        "tierkv-run: error: --greedy and --temperature exclude each other\n");
    return 2;
  }
  if (temperature < 0 || max_new < 0) {
    std::fprintf(stderr,
                 "tierkv-run: error: --temperature and "
                 "--max-new-tokens must be >= 0\n");
    return 2;
  }
  GenerateOptions gen;
  gen.max_new_tokens = max_new;
  gen.sampler.greedy = !(temperature > 0);
  gen.sampler.temperature = temperature > 0 ? temperature : 1.0;
  gen.sampler.seed = seed;
  if (working_set_slots > 0) {
    gen.working_set = tierkv::WorkingSetOptions{
        .slots = working_set_slots,
        .policy = *tierkv::ParseWorkingSetPolicy(working_set_policy),
        .memory = working_set_memory == "device"
                      ? tierkv::WorkingSetMemory::kDevice
                      : tierkv::WorkingSetMemory::kHost};
  }
  gen.report_interval = report_interval;
  return RunModel(model_dir, prompt, gen, logits_out, threads, attention,
                  tierkv, record_topk);
}
