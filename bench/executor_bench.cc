// tierkv-bench executor: decode throughput of the reference DSA executor
// (glm5-small by default) at several context lengths, with the bytes one
// decode step must read (weights touched, KV rows of the selected tokens,
// indexer keys scanned) over the step time, as a ratio to memcpy bandwidth
// measured in the same run.
//
// The KV cache of each context is filled synthetically (random rows written
// through KvCache::Write) instead of a real prefill, so 32K contexts fit in
// the benchmark's time budget; decode cost does not depend on the values.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "executor/model.h"
#include "executor/presets.h"
#include "executor/weights.h"

namespace tierkv::bench {
namespace {

using executor::KvCache;
using executor::KvPart;
using executor::Model;
using executor::ModelConfig;
using Clock = std::chrono::steady_clock;

struct ExecutorBenchOptions {
  std::string preset = "glm5-small";
  std::vector<int64_t> contexts = {1024, 8192, 32768};
  int steps = 8;    // decode steps timed per context
  int threads = 0;  // 0 = all cores
  uint64_t seed = 1;
  std::string json_path;
};

// Best-of-N single-threaded memcpy bandwidth over a buffer far larger than
// the caches, in bytes/s (bytes read; the write side is not counted).
double MeasureMemcpyBandwidth() {
  const size_t bytes = 256u << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / s);
    src[rep] = dst[bytes - 1 - rep];  // keep the copies observable
  }
  return best;
}

// Weight bytes (fp32) one decode token reads: every tensor except the
// routed experts and the embedding table, plus num_experts_per_tok experts
// per MoE layer and one embedding row.
uint64_t DecodeWeightBytes(const ModelConfig& c) {
  uint64_t bytes = 0;
  uint64_t expert_bytes = 0;
  for (const auto& t : executor::ExpectedTensors(c)) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    if (t.name.find(".mlp.experts.") != std::string::npos) {
      if (t.name.find(".mlp.experts.0.") != std::string::npos)
        expert_bytes += n * 4;
      continue;
    }
    if (t.name == "model.embed_tokens.weight") continue;
    bytes += n * 4;
  }
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    moe_layers += c.IsMoeLayer(l);
  // expert_bytes summed expert 0 of every MoE layer: per-layer size * layers.
  bytes += expert_bytes / std::max<int64_t>(moe_layers, 1) * moe_layers *
           static_cast<uint64_t>(c.num_experts_per_tok);
  bytes += static_cast<uint64_t>(c.hidden_size) * 4;
  return bytes;
}

Status FillCache(const ModelConfig& c, KvCache* cache, int64_t tokens,
                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t chunk = 1024;
  std::vector<float> rows;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (KvPart part : {KvPart::kLatent, KvPart::kIndexKey}) {
      if (part == KvPart::kIndexKey && !c.indexer_full[l]) continue;
      const int64_t dim = cache->geometry().RowDim(part);
      for (int64_t first = 0; first < tokens; first += chunk) {
        const int64_t n = std::min(chunk, tokens - first);
        rows.resize(static_cast<size_t>(n * dim));
        for (auto& v : rows) v = u(rng);
        TIERKV_RETURN_IF_ERROR(cache->Write(l, part, first, rows));
      }
    }
  }
  return Status::OK();
}

int RunExecutorBench(const ExecutorBenchOptions& o) {
  auto config = executor::PresetConfig(o.preset);
  if (!config.ok()) {
    fmt::print(stderr, "executor bench: {}\n", config.status().ToString());
    return 1;
  }
  const double memcpy_bps = MeasureMemcpyBandwidth();
  fmt::print(
      "executor bench: preset {} ({} layers, hidden {}, index_topk {}, "
      "{} full indexer layers), weights generated in memory (seed {})\n",
      o.preset, config->num_hidden_layers, config->hidden_size,
      config->index_topk, config->NumFullIndexerLayers(), o.seed);
  const auto t_build = Clock::now();
  executor::ModelOptions mo;
  mo.num_threads = o.threads;
  auto model =
      Model::Create(*config, executor::RandomWeights(*config, o.seed), mo);
  if (!model.ok()) {
    fmt::print(stderr, "executor bench: {}\n", model.status().ToString());
    return 1;
  }
  fmt::print(
      "model built in {:.1f} s; threads {}; memcpy {:.2f} GB/s "
      "(1 thread, same run)\n",
      std::chrono::duration<double>(Clock::now() - t_build).count(),
      (*model)->num_threads(), memcpy_bps / 1e9);
  fmt::print(
      "KV cache: filled synthetically with random rows through "
      "KvCache::Write (no real prefill)\n\n");
  fmt::print("{:>8} {:>10} {:>9} {:>10} {:>9} {:>11} {:>10} {:>9} {:>8}\n",
             "context", "tokens/s", "step ms", "weights MB", "kv MB",
             "idx scan MB", "total MB", "GB/s", "/memcpy");
  const uint64_t weight_bytes = DecodeWeightBytes(*config);
  nlohmann::json results = nlohmann::json::array();
  for (int64_t ctx : o.contexts) {
    auto cache = (*model)->NewCache(ctx + o.steps + 1);
    if (!cache.ok()) return 1;
    if (Status s = FillCache(*config, cache->get(), ctx, o.seed); !s.ok()) {
      fmt::print(stderr, "executor bench: {}\n", s.ToString());
      return 1;
    }
    std::vector<double> step_s;
    int32_t token = 1;
    double kv_bytes_sum = 0, idx_bytes_sum = 0;
    for (int step = 0; step < o.steps; ++step) {
      const int64_t visible = ctx + step + 1;
      kv_bytes_sum += static_cast<double>(
          std::min(config->index_topk, visible) * config->latent_dim() * 4 *
          config->num_hidden_layers);
      idx_bytes_sum += static_cast<double>(visible * config->index_head_dim *
                                           4 * config->NumFullIndexerLayers());
      const auto t0 = Clock::now();
      auto logits =
          (*model)->Forward(std::span<const int32_t>(&token, 1), cache->get());
      step_s.push_back(
          std::chrono::duration<double>(Clock::now() - t0).count());
      if (!logits.ok()) {
        fmt::print(stderr, "executor bench: {}\n", logits.status().ToString());
        return 1;
      }
      token = static_cast<int32_t>(
          std::max_element(logits->begin(), logits->end()) - logits->begin());
    }
    const double median = Median(step_s);
    const double kv_bytes = kv_bytes_sum / o.steps;
    const double idx_bytes = idx_bytes_sum / o.steps;
    const double total =
        static_cast<double>(weight_bytes) + kv_bytes + idx_bytes;
    const double gbps = total / median / 1e9;
    const double ratio = total / median / memcpy_bps;
    fmt::print(
        "{:>8} {:>10.2f} {:>9.1f} {:>10.1f} {:>9.2f} {:>11.2f} {:>10.1f} "
        "{:>9.2f} {:>8.3f}\n",
        ctx, 1.0 / median, median * 1e3, weight_bytes / 1e6, kv_bytes / 1e6,
        idx_bytes / 1e6, total / 1e6, gbps, ratio);
    results.push_back({{"context", ctx},
                       {"decode_tokens_per_s", 1.0 / median},
                       {"step_seconds_median", median},
                       {"weight_bytes", weight_bytes},
                       {"kv_row_bytes", kv_bytes},
                       {"indexer_scan_bytes", idx_bytes},
                       {"total_bytes", total},
                       {"effective_bytes_per_s", total / median},
                       {"ratio_to_memcpy", ratio}});
  }
  fmt::print(
      "\nweights and KV rows are fixed once context > index_topk; only "
      "the indexer key scan grows with context.\n");
  if (!o.json_path.empty()) {
    nlohmann::json j = {
        {"bench", "executor"},
        {"preset", o.preset},
        {"threads", (*model)->num_threads()},
        {"decode_steps_per_context", o.steps},
        {"memcpy_bytes_per_s", memcpy_bps},
        {"kv_fill", "synthetic random rows written through KvCache::Write"},
        {"results", results}};
    std::ofstream out(o.json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      fmt::print(stderr, "executor bench: cannot write {}\n", o.json_path);
      return 1;
    }
  }
  return 0;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto opts = std::make_shared<ExecutorBenchOptions>();
  auto* sub = app.add_subcommand(
      "executor", "decode tokens/s of the DSA executor vs context length");
  sub->add_option("--preset", opts->preset, "model preset")
      ->capture_default_str();
  sub->add_option("--contexts", opts->contexts, "context lengths")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--steps", opts->steps, "decode steps timed per context")
      ->capture_default_str();
  sub->add_option("--threads", opts->threads, "kernel threads (0 = all)")
      ->capture_default_str();
  sub->add_option("--seed", opts->seed, "weight seed")->capture_default_str();
  sub->add_option("--json", opts->json_path, "write the figures as JSON");
  sub->callback([opts] { SetExitCode(RunExecutorBench(*opts)); });
});

}  // namespace
}  // namespace tierkv::bench
