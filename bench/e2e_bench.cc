// `tierkv-bench e2e`: the reference executor on a real tierkvd, end to end.
//
//   ttft      a prompt of N tokens (16K, 32K) whose prefix (every page but
//             the last) is stored in tierkvd: time to first logits when the
//             prefix is loaded from host DRAM, from NVMe (the daemon
//             restarted, so its DRAM is empty and the O_DIRECT reads are
//             real), and when the whole prompt is prefilled (recompute);
//             reported as ratios to recompute. Every loaded run's logits
//             are checked equal to the recomputed run's.
//   overlap   the same prefix load + suffix prefill three ways: layer
//             ordered (WaitForLayer(l) before layer l computes, later
//             layers still loading: what TierKvCache does), load everything
//             then compute, and compute with every row already in process
//             (the load-all run's cache, truncated back to the prefix and
//             run again: no load, but caches warm from the run before).
//             Figures: hidden = 1 - (time the ordered run spent blocked
//             in WaitForLayer) / (that run's own Load time, from the
//             daemon's stamps in the load ticket: accepted to last layer),
//             the share of the load the computation ran over, median over
//             the ordered runs; hidden2 the same wait over the load-all
//             runs' load time (other runs: a disk that is fast in one and
//             slow in the other moves it); and saved = (load_then_compute
//             - ordered) / load_time, the wall-clock gain, which is lower
//             when the daemon's copy slows the computation it overlaps
//             (same cores, same memory). Both runs start from the same
//             state (a fresh cache, the prefix in tierkvd). Run per --overlap-
//             threads: with every core computing, the daemon's copies
//             compete with the kernels for the CPU (2 cores here); with one
//             kernel thread the daemon has a core, as a GPU's copy engine
//             runs beside its SMs.
//   sessions  S sessions x T turns sharing a system prompt through a daemon
//             whose DRAM is smaller than the working set (RunSessions):
//             share of prompt tokens served per tier vs prefilled, per turn
//             and per session count; --plot FILE.png draws it (Debian's
//             matplotlib, bench/plot_e2e.py).
//
// The model is a preset with random weights generated in memory, run in
// absorbed-MQA form (as tierkv-run --tierkv). Timings are wall clock on
// this machine, medians of --iterations; the daemon shares the CPU with
// the executor, as a sidecar does.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "bench/registry.h"
#include "bench/sample_stats.h"
#include "executor/kernels.h"
#include "executor/kv_format.h"
#include "executor/model.h"
#include "executor/presets.h"
#include "executor/sessions.h"
#include "executor/tier_kv_cache.h"
#include "executor/weights.h"
#include "tests/testing/daemon_process.h"

#ifndef TIERKV_SOURCE_DIR
#define TIERKV_SOURCE_DIR "."
#endif

namespace tierkv::bench {
namespace {

using executor::KvCache;
using executor::KvDtype;
using executor::Model;
using executor::TierKvCache;
using executor::TierKvCacheOptions;
using Clock = std::chrono::steady_clock;

struct E2eOptions {
  std::string preset = "glm5-small";
  std::vector<int64_t> prompt_tokens = {16384};
  int iterations = 5;
  int threads = 0;                            // recompute and sessions
  std::vector<int> overlap_threads = {0, 1};  // 0 = all cores
  uint64_t seed = 1;
  std::string kv_dtype = "fp32";
  std::string nvme_dir = "/var/tmp";
  bool skip_ttft = false;
  bool skip_sessions = false;
  std::vector<int> sessions = {1, 2, 4};
  int turns = 4;
  int64_t system_tokens = 512;
  int64_t user_tokens = 64;
  int64_t reply_tokens = 16;
  std::string sessions_host_bytes = "16MiB";
  std::string json_path;
  std::string plot_path;
};

constexpr char kNamespace[] = "bench";
constexpr char kToken[] = "bench-token";

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Deterministic token ids (an LCG), never the same prompt for two seeds.
std::vector<int32_t> PromptIds(int64_t n, uint64_t seed, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (auto& id : ids) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  return ids;
}

// Bytes of one page over every layer and part of `layout`.
uint64_t PageBytes(const LayoutSpec& layout) {
  uint64_t bytes = 0;
  for (uint32_t l = 0; l < layout.num_layers(); ++l) {
    for (size_t p = 0; p < layout.layers[l].parts.size(); ++p) {
      bytes += layout.SegmentBytes(static_cast<uint16_t>(l),
                                   static_cast<uint8_t>(p));
    }
  }
  return bytes;
}

std::string DaemonConfig(const std::string& host_bytes,
                         const std::string& nvme_path, uint64_t nvme_bytes,
                         const std::string& policy) {
  return fmt::format(
      "[[namespace]]\nname = \"{}\"\ntoken = \"{}\"\nhost_bytes = \"{}\"\n"
      "write_policy = \"{}\"\n[nvme]\npath = \"{}\"\ncapacity_bytes = {}\n",
      kNamespace, kToken, host_bytes, policy, nvme_path, nvme_bytes);
}

class E2eBench {
 public:
  explicit E2eBench(const E2eOptions& o) : o_(o) {}

  int Run();

 private:
  TierKvCacheOptions CacheOptions() const {
    TierKvCacheOptions c;
    c.client.socket_path = daemon_.socket_path();
    c.client.timeout = std::chrono::seconds(120);
    c.namespace_name = kNamespace;
    c.token = kToken;
    c.salt = salt_;
    c.required = true;
    return c;
  }
  Result<std::unique_ptr<TierKvCache>> NewTierCache(int64_t tokens) const {
    return TierKvCache::Create(
        executor::GeometryFor(model_->config(), tokens, dtype_),
        CacheOptions());
  }
  Status StartDaemon(const std::string& config) {
    spec_ = {.config_toml = config, .extra_args = {"--io-threads", "2"}};
    return daemon_.Start(spec_);
  }
  Status RunTtft(int64_t n, nlohmann::json* out);
  Status RunSessions(nlohmann::json* out);
  void Plot(const nlohmann::json& sessions);

  // One loaded-prefix request: AttachPrefix, then either the model's own
  // per-layer waits (ordered) or every layer waited for first; then (not
  // ordered) the same suffix again on the same cache, every row in process.
  struct LoadedRun {
    double seconds = 0;       // to the first logits
    double load_seconds = 0;  // AttachPrefix until every layer is in
    double in_process_seconds = 0;
    double waited_seconds = 0;  // blocked in WaitForLayer
    // The Load as the daemon timed it, in this run: accepted until its
    // first layer and until its last were in place.
    double daemon_first_layer_seconds = 0;
    double daemon_load_seconds = 0;
    int64_t loaded_tokens = 0;
    int64_t pages_host = 0, pages_nvme = 0;
    bool logits_equal = false;
  };
  Result<LoadedRun> Loaded(Model& model, const std::vector<int32_t>& prompt,
                           bool ordered, const std::vector<float>& want);
  // Waits until the daemon has persisted every dirty segment (write-through
  // of what was just stored), so no IO of the set-up overlaps a timing.
  Status WaitForPersisted();
  Result<Model*> ModelWithThreads(int threads);

  const E2eOptions& o_;
  KvDtype dtype_ = KvDtype::kF32;
  std::unique_ptr<Model> model_;                      // --threads
  std::vector<std::unique_ptr<Model>> other_models_;  // same weights
  std::string salt_;
  testing::DaemonSpec spec_;
  testing::DaemonProcess daemon_;
};

Result<E2eBench::LoadedRun> E2eBench::Loaded(Model& model,
                                             const std::vector<int32_t>& prompt,
                                             bool ordered,
                                             const std::vector<float>& want) {
  auto cache = NewTierCache(static_cast<int64_t>(prompt.size()));
  if (!cache.ok()) return cache.status();
  KvCache* kv = cache->get();
  LoadedRun r;
  const auto t0 = Clock::now();
  auto start = kv->AttachPrefix(prompt);
  if (!start.ok()) return start.status();
  if (!ordered) {
    for (int64_t l = 0; l < model.config().num_hidden_layers; ++l) {
      TIERKV_RETURN_IF_ERROR(kv->WaitForLayer(l, *start));
    }
    r.load_seconds = Seconds(t0, Clock::now());
  }
  const auto suffix = std::span(prompt).subspan(static_cast<size_t>(*start));
  auto logits = model.Forward(suffix, kv);
  r.seconds = Seconds(t0, Clock::now());
  if (!logits.ok()) return logits.status();
  r.loaded_tokens = *start;
  r.pages_host = (*cache)->stats().pages_from_host;
  r.pages_nvme = (*cache)->stats().pages_from_nvme;
  r.waited_seconds = (*cache)->stats().layer_wait_seconds;
  r.daemon_first_layer_seconds = (*cache)->stats().load_first_layer_seconds;
  r.daemon_load_seconds = (*cache)->stats().load_seconds;
  r.logits_equal = *logits == want;
  if (!ordered) {
    TIERKV_RETURN_IF_ERROR(kv->Truncate(*start));
    const auto t1 = Clock::now();
    auto again = model.Forward(suffix, kv);
    r.in_process_seconds = Seconds(t1, Clock::now());
    if (!again.ok()) return again.status();
    r.logits_equal = r.logits_equal && *again == want;
  }
  return r;
}

Status E2eBench::WaitForPersisted() {
  auto client = daemon_.Connect(kNamespace, kToken);
  if (!client.ok()) return client.status();
  const auto deadline = Clock::now() + std::chrono::minutes(5);
  while (true) {
    auto stats = (*client)->StatsJson();
    if (!stats.ok()) return stats.status();
    const auto j = nlohmann::json::parse(*stats);
    if (j["host"]["dirty_segments"].get<uint64_t>() == 0) return Status::OK();
    if (Clock::now() > deadline) {
      return Status::Internal("tierkvd did not persist within 5 minutes");
    }
    // A benchmark's set-up, not a test: polling the daemon's own counter
    // is the simplest wait there is.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Result<Model*> E2eBench::ModelWithThreads(int threads) {
  const int want = threads > 0
                       ? threads
                       : static_cast<int>(std::thread::hardware_concurrency());
  if (model_->num_threads() == want) return model_.get();
  for (auto& m : other_models_) {
    if (m->num_threads() == want) return m.get();
  }
  executor::ModelOptions mo;
  mo.num_threads = want;
  mo.attention_mode = executor::AttentionMode::kAbsorbedMqa;
  auto m = Model::Create(
      model_->config(), executor::RandomWeights(model_->config(), o_.seed), mo);
  if (!m.ok()) return m.status();
  other_models_.push_back(std::move(m).value());
  return other_models_.back().get();
}

Status E2eBench::RunTtft(int64_t n, nlohmann::json* out) {
  const executor::ModelConfig& c = model_->config();
  const int64_t page = executor::GeometryFor(c, n, dtype_).page_tokens;
  if (n < 2 * page) {
    return Status::InvalidArgument(
        fmt::format("--prompt-tokens {} is under two pages", n));
  }
  const std::vector<int32_t> prompt = PromptIds(n, o_.seed, c.vocab_size);
  const int64_t prefix = (n - 1) / page * page;  // all but the last page
  // DRAM holds the whole prefix with room to spare; write_through puts it
  // on NVMe as it is stored, so a restart finds it there.
  const executor::KvCacheGeometry g = executor::GeometryFor(c, n, dtype_);
  const uint64_t prefix_bytes = PageBytes(TierKvCache::LayoutFor(g)) *
                                static_cast<uint64_t>(prefix / page);
  const uint64_t host = (prefix_bytes * 3 / 2 >> 20) + 64;
  const std::string nvme_path =
      fmt::format("{}/tierkv-e2e-bench-{}.data", o_.nvme_dir, ::getpid());
  std::filesystem::remove(nvme_path);
  std::filesystem::remove_all(nvme_path + ".catalog");
  TIERKV_RETURN_IF_ERROR(StartDaemon(
      DaemonConfig(fmt::format("{}MiB", host), nvme_path,
                   ((prefix_bytes * 2 >> 20) + 256) << 20, "write_through")));

  // Recompute: the whole prompt prefilled by a request that finds nothing.
  fmt::print(
      "\n[ttft] prompt {} tokens, prefix {} tokens ({} pages, {:.0f} MB"
      " of KV), kv-dtype {}\n",
      n, prefix, prefix / page, prefix_bytes / 1e6,
      executor::KvDtypeName(dtype_));
  auto cold = NewTierCache(n);
  if (!cold.ok()) return cold.status();
  auto t0 = Clock::now();
  auto want = model_->Forward(prompt, cold->get());
  const double recompute_s = Seconds(t0, Clock::now());
  if (!want.ok()) return want.status();
  fmt::print("  recompute (prefill {} tokens): {:.2f} s\n", n, recompute_s);
  // Store the prefix: those pages are what the next requests find.
  TIERKV_RETURN_IF_ERROR((*cold)->CommitTokens(
      std::span(prompt).first(static_cast<size_t>(prefix))));
  cold->reset();  // waits for the Store
  TIERKV_RETURN_IF_ERROR(WaitForPersisted());

  bool all_equal = true;
  // `iterations` x (ordered run, load-all run + in-process rerun); from
  // NVMe, each run starts on a restarted daemon (SIGTERM: nothing dirty to
  // write; the fresh one has empty DRAM and reads the catalog).
  auto measure = [&](Model& model, bool restart,
                     std::vector<LoadedRun>* ordered,
                     std::vector<LoadedRun>* all) -> Status {
    for (int i = 0; i < 2 * o_.iterations; ++i) {
      if (restart) {
        if (daemon_.Stop() != 0) {
          return Status::Internal("tierkvd did not stop cleanly:\n" +
                                  daemon_.log());
        }
        TIERKV_RETURN_IF_ERROR(daemon_.Start(spec_));
      }
      auto r = Loaded(model, prompt, /*ordered=*/i % 2 == 0, *want);
      if (!r.ok()) return r.status();
      if (r->loaded_tokens != prefix) {
        return Status::Internal(
            fmt::format("loaded {} tokens, expected the {}-token prefix",
                        r->loaded_tokens, prefix));
      }
      all_equal = all_equal && r->logits_equal;
      (i % 2 == 0 ? ordered : all)->push_back(*r);
    }
    return Status::OK();
  };
  auto med = [](const std::vector<LoadedRun>& v, double LoadedRun::*field) {
    std::vector<double> s;
    for (const auto& r : v) s.push_back(r.*field);
    return Median(s);
  };
  fmt::print(
      "  {:<4} {:>7} {:>7} {:>10} {:>7} {:>8} {:>8} {:>6} {:>7} {:>7} {:>9} "
      "{:>6} {:>8} {:>8} {:>6}\n",
      "from", "threads", "ttft s", "vs recomp.", "load s", "layer0 s",
      "waited s", "hidden", "l-all s", "hidden2", "load+comp", "saved",
      "in-proc.", "pages", "logits");
  nlohmann::json rows = nlohmann::json::array();
  for (const char* tier : {"host", "nvme"}) {
    for (int threads : o_.overlap_threads) {
      auto model = ModelWithThreads(threads);
      if (!model.ok()) return model.status();
      std::vector<LoadedRun> ordered, all;
      TIERKV_RETURN_IF_ERROR(
          measure(**model, std::string_view(tier) == "nvme", &ordered, &all));
      const double ttft = med(ordered, &LoadedRun::seconds);
      const double load = med(all, &LoadedRun::load_seconds);
      const double serial = med(all, &LoadedRun::seconds);
      const double inproc = med(all, &LoadedRun::in_process_seconds);
      const double waited = med(ordered, &LoadedRun::waited_seconds);
      // Per ordered run, its wait over its own Load (the daemon's times):
      // both from one run, so a fast or slow disk moves them together.
      std::vector<double> hidden_runs;
      for (const LoadedRun& r : ordered) {
        hidden_runs.push_back(r.daemon_load_seconds > 0
                                  ? 1.0 -
                                        r.waited_seconds / r.daemon_load_seconds
                                  : 0.0);
      }
      const double hidden = Median(hidden_runs);
      const double run_load = med(ordered, &LoadedRun::daemon_load_seconds);
      const double layer0 =
          med(ordered, &LoadedRun::daemon_first_layer_seconds);
      // Against the load-all runs' load (other runs, other disk moments).
      const double hidden2 = load > 0 ? 1.0 - waited / load : 0.0;
      const double saved = load > 0 ? (serial - ttft) / load : 0.0;
      bool equal = true;
      for (const auto& r : ordered) equal = equal && r.logits_equal;
      for (const auto& r : all) equal = equal && r.logits_equal;
      const LoadedRun& any = ordered.front();
      fmt::print(
          "  {:<4} {:>7} {:>7.3f} {:>9.1f}x {:>7.3f} {:>8.3f} {:>8.3f} "
          "{:>5.0f}% {:>7.3f} {:>6.0f}% {:>9.3f} {:>5.0f}% {:>8.3f} {:>8} "
          "{:>6}\n",
          tier, (*model)->num_threads(), ttft, recompute_s / ttft, run_load,
          layer0, waited, 100 * hidden, load, 100 * hidden2, serial,
          100 * saved, inproc,
          fmt::format("{}h/{}n", any.pages_host, any.pages_nvme),
          equal ? "equal" : "DIFFER");
      rows.push_back({{"tier", tier},
                      {"threads", (*model)->num_threads()},
                      {"ttft_seconds", ttft},
                      {"speedup_vs_recompute", recompute_s / ttft},
                      {"load_seconds", run_load},
                      {"first_layer_seconds", layer0},
                      {"load_all_load_seconds", load},
                      {"load_hidden_fraction_vs_load_all", hidden2},
                      {"load_then_compute_seconds", serial},
                      {"in_process_seconds", inproc},
                      {"waited_seconds", waited},
                      {"load_hidden_fraction", hidden},
                      {"load_saved_fraction", saved},
                      {"pages_from_host", any.pages_host},
                      {"pages_from_nvme", any.pages_nvme},
                      {"logits_equal_to_recompute", equal}});
    }
  }
  daemon_.Stop();
  std::filesystem::remove(nvme_path);
  std::filesystem::remove_all(nvme_path + ".catalog");
  *out = {{"prompt_tokens", n},
          {"prefix_tokens", prefix},
          {"prefix_kv_bytes", prefix_bytes},
          {"recompute_seconds", recompute_s},
          {"recompute_threads", model_->num_threads()},
          {"runs", rows}};
  if (!all_equal) {
    return Status::Internal(
        "a loaded prefix gave logits that differ from "
        "the recomputed prompt's");
  }
  return Status::OK();
}

Status E2eBench::RunSessions(nlohmann::json* out) {
  *out = nlohmann::json::array();
  fmt::print(
      "\n[sessions] system prompt {} tokens, user {} and reply {} per "
      "turn, {} turns; tierkvd host {} + NVMe (write_back)\n",
      o_.system_tokens, o_.user_tokens, o_.reply_tokens, o_.turns,
      o_.sessions_host_bytes);
  fmt::print("  {:>8} {:>4} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9}\n",
             "sessions", "turn", "prompt", "host", "nvme", "prefilled",
             "host %", "nvme %", "prefill %");
  for (int sessions : o_.sessions) {
    const std::string nvme_path =
        fmt::format("{}/tierkv-e2e-sessions-{}.data", o_.nvme_dir, ::getpid());
    std::filesystem::remove(nvme_path);
    std::filesystem::remove_all(nvme_path + ".catalog");
    TIERKV_RETURN_IF_ERROR(StartDaemon(DaemonConfig(
        o_.sessions_host_bytes, nvme_path, 1024ull << 20, "write_back")));
    executor::SessionsOptions so;
    so.sessions = sessions;
    so.turns = o_.turns;
    so.system_tokens = o_.system_tokens;
    so.user_tokens = o_.user_tokens;
    so.reply_tokens = o_.reply_tokens;
    so.seed = o_.seed;
    so.check = false;  // the tests check logits; this measures
    so.kv_dtype = dtype_;
    auto reports = executor::RunSessions(*model_, CacheOptions(), so);
    daemon_.Stop();
    std::filesystem::remove(nvme_path);
    std::filesystem::remove_all(nvme_path + ".catalog");
    if (!reports.ok()) return reports.status();
    const int64_t page =
        executor::GeometryFor(model_->config(), 1, dtype_).page_tokens;
    for (int turn = 0; turn < o_.turns; ++turn) {
      int64_t prompt = 0, host = 0, nvme = 0, hbm = 0, prefilled = 0;
      double ttft = 0;
      for (const auto& r : *reports) {
        if (r.turn != turn) continue;
        prompt += r.prompt_tokens;
        prefilled += r.prefilled_tokens;
        host += r.pages_host * page;
        nvme += r.pages_nvme * page;
        hbm += r.pages_hbm * page;
        ttft += r.ttft_seconds / sessions;
      }
      const double p = static_cast<double>(std::max<int64_t>(prompt, 1));
      fmt::print(
          "  {:>8} {:>4} {:>8} {:>8} {:>8} {:>9} {:>7.1f}% {:>7.1f}% "
          "{:>8.1f}%\n",
          sessions, turn, prompt, host, nvme, prefilled, 100 * host / p,
          100 * nvme / p, 100 * prefilled / p);
      out->push_back({{"sessions", sessions},
                      {"turn", turn},
                      {"prompt_tokens", prompt},
                      {"tokens_from_hbm", hbm},
                      {"tokens_from_host", host},
                      {"tokens_from_nvme", nvme},
                      {"tokens_prefilled", prefilled},
                      {"mean_ttft_seconds", ttft}});
    }
  }
  return Status::OK();
}

void E2eBench::Plot(const nlohmann::json& sessions) {
  const std::string data = o_.plot_path + ".json";
  {
    std::ofstream f(data);
    f << sessions.dump() << "\n";
  }
  const std::string cmd =
      fmt::format("/usr/bin/python3 '{}/bench/plot_e2e.py' '{}' '{}'",
                  TIERKV_SOURCE_DIR, data, o_.plot_path);
  const int rc = std::system(cmd.c_str());
  std::filesystem::remove(data);
  if (rc != 0) {
    fmt::print(stderr,
               "e2e bench: the plot failed ({}); Debian's python3-matplotlib "
               "draws it (scripts/install-deps.sh installs it)\n",
               cmd);
  } else {
    fmt::print("plot: {}\n", o_.plot_path);
  }
}

int E2eBench::Run() {
  // Minutes-long phases: show each line as it is printed, even into a file.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto config = executor::PresetConfig(o_.preset);
  if (!config.ok()) {
    fmt::print(stderr, "e2e bench: {}\n", config.status().ToString());
    return 2;
  }
  auto dtype = executor::ParseKvDtype(o_.kv_dtype);
  if (!dtype.ok()) {
    fmt::print(stderr, "e2e bench: {}\n", dtype.status().ToString());
    return 2;
  }
  dtype_ = *dtype;
  int64_t max_tokens = 0;
  for (int64_t n : o_.prompt_tokens) max_tokens = std::max(max_tokens, n);
  if (max_tokens > config->max_position_embeddings) {
    fmt::print(stderr, "e2e bench: {} tokens exceed the preset's {}\n",
               max_tokens, config->max_position_embeddings);
    return 2;
  }
  const auto t_build = Clock::now();
  executor::ModelOptions mo;
  mo.num_threads = o_.threads;
  mo.attention_mode = executor::AttentionMode::kAbsorbedMqa;
  auto model =
      Model::Create(*config, executor::RandomWeights(*config, o_.seed), mo);
  if (!model.ok()) {
    fmt::print(stderr, "e2e bench: {}\n", model.status().ToString());
    return 1;
  }
  model_ = std::move(model).value();
  salt_ = executor::ModelIdentity(*model_);
  fmt::print(
      "e2e bench: preset {} ({} layers, {} full indexer layers, index_topk "
      "{}), random weights (seed {}), built in {:.1f} s; {} threads, kernels "
      "{}, absorbed MQA\n",
      o_.preset, config->num_hidden_layers, config->NumFullIndexerLayers(),
      config->index_topk, o_.seed, Seconds(t_build, Clock::now()),
      model_->num_threads(), executor::KernelIsa());

  nlohmann::json ttft = nlohmann::json::array();
  nlohmann::json sessions = nlohmann::json::array();
  int rc = 0;
  if (!o_.skip_ttft) {
    for (int64_t n : o_.prompt_tokens) {
      nlohmann::json one;
      if (Status s = RunTtft(n, &one); !s.ok()) {
        fmt::print(stderr, "e2e bench: {}\n", s.ToString());
        rc = 1;
      }
      if (!one.is_null()) ttft.push_back(one);
    }
  }
  if (!o_.skip_sessions) {
    if (Status s = RunSessions(&sessions); !s.ok()) {
      fmt::print(stderr, "e2e bench: {}\n", s.ToString());
      rc = 1;
    }
    if (!o_.plot_path.empty() && !sessions.empty()) Plot(sessions);
  }
  if (!o_.json_path.empty()) {
    nlohmann::json j = {{"bench", "e2e"},
                        {"preset", o_.preset},
                        {"kv_dtype", o_.kv_dtype},
                        {"threads", model_->num_threads()},
                        {"kernels", executor::KernelIsa()},
                        {"iterations", o_.iterations},
                        {"ttft", ttft},
                        {"sessions", sessions}};
    std::ofstream out(o_.json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      fmt::print(stderr, "e2e bench: cannot write {}\n", o_.json_path);
      return 1;
    }
  }
  return rc;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto o = std::make_shared<E2eOptions>();
  auto* sub = app.add_subcommand(
      "e2e",
      "the executor on tierkvd: TTFT with a stored prefix (host, NVMe) vs "
      "recompute, layer-overlapped loads, multi-turn sessions per tier");
  sub->add_option("--preset", o->preset, "model preset")->capture_default_str();
  sub->add_option("--prompt-tokens", o->prompt_tokens,
                  "prompt lengths for the TTFT and overlap runs")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--iterations", o->iterations, "runs per loaded figure")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--threads", o->threads,
                  "kernel threads for recompute and sessions (0 = all)")
      ->capture_default_str();
  sub->add_option("--overlap-threads", o->overlap_threads,
                  "kernel threads for the loaded runs, each (0 = all)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "weights and token ids")
      ->capture_default_str();
  sub->add_option("--kv-dtype", o->kv_dtype, "fp32 | bf16 | fp8")
      ->capture_default_str();
  sub->add_option("--nvme-dir", o->nvme_dir, "where the NVMe tier file goes")
      ->capture_default_str();
  sub->add_flag("--skip-ttft", o->skip_ttft, "no TTFT / overlap runs");
  sub->add_flag("--skip-sessions", o->skip_sessions, "no session runs");
  sub->add_option("--sessions", o->sessions, "session counts")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--turns", o->turns, "turns per session")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--system-tokens", o->system_tokens, "shared system prompt")
      ->capture_default_str();
  sub->add_option("--user-tokens", o->user_tokens, "user tokens per turn")
      ->capture_default_str();
  sub->add_option("--reply-tokens", o->reply_tokens, "reply tokens per turn")
      ->capture_default_str();
  sub->add_option("--sessions-host-bytes", o->sessions_host_bytes,
                  "tierkvd DRAM for the session runs")
      ->capture_default_str();
  sub->add_option("--json", o->json_path, "write the figures as JSON");
  sub->add_option("--plot", o->plot_path,
                  "draw the session shares into this PNG");
  sub->callback([o] { SetExitCode(E2eBench(*o).Run()); });
});

}  // namespace
}  // namespace tierkv::bench
