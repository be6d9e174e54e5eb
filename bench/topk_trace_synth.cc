// TopkTraceSynthesizer (see topk_trace_synth.h for the model and the
// sources of its defaults).
#include "bench/topk_trace_synth.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "executor/config.h"
#include "executor/presets.h"

namespace tierkv::bench {
namespace {

using executor::TopkStep;
using executor::TopkTraceHeader;

// GLM-5.2's IndexShare (glm5-dsa.md §4).
constexpr int64_t kGlm52Layers = 78;
constexpr int64_t kGlm52IndexTopkFreq = 4;
constexpr int64_t kGlm52IndexSkipTopkOffset = 3;
// Positions the generator keeps state for (16 B each per full layer).
constexpr int64_t kMaxTokens = int64_t{1} << 22;
// Fixed-point scale of the importance weights: rank 1 weighs 2^40, and
// 2^22 positions sum below 2^63.
constexpr double kWeightScale = 1099511627776.0;  // 2^40

// A Fenwick (binary indexed) tree of non-negative integer weights: prefix
// sums and sampling in proportion to weight, O(log n) each. Unsigned
// wrap-around makes subtracting exact.
class WeightTree {
 public:
  void Assign(const std::vector<uint64_t>& weights) {
    n_ = weights.size();
    tree_.assign(n_ + 1, 0);
    for (size_t i = 1; i <= n_; ++i) {
      tree_[i] += weights[i - 1];
      const size_t parent = i + (i & (~i + 1));
      if (parent <= n_) tree_[parent] += tree_[i];
    }
    top_ = 1;
    while (top_ * 2 <= n_) top_ *= 2;
  }
  void Add(size_t i, uint64_t delta) {
    for (++i; i <= n_; i += i & (~i + 1)) tree_[i] += delta;
  }
  void Remove(size_t i, uint64_t weight) { Add(i, ~weight + 1); }
  uint64_t Total() const {
    uint64_t sum = 0;
    for (size_t i = n_; i > 0; i -= i & (~i + 1)) sum += tree_[i];
    return sum;
  }
  // The index i with prefix(i) <= r < prefix(i + 1). REQUIRES: r < Total().
  size_t Find(uint64_t r) const {
    size_t pos = 0;
    for (size_t step = top_; step > 0; step >>= 1) {
      if (pos + step <= n_ && tree_[pos + step] <= r) {
        pos += step;
        r -= tree_[pos];
      }
    }
    return pos;
  }

 private:
  size_t n_ = 0;
  size_t top_ = 0;
  std::vector<uint64_t> tree_;  // 1-based
};

// A uniform integer in [0, n) from raw mt19937_64 output (Lemire's method
// with rejection; no std distribution, whose output varies by library).
uint64_t Below(std::mt19937_64& rng, uint64_t n) {
  unsigned __int128 m = static_cast<unsigned __int128>(rng()) * n;
  auto low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (~n + 1) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(rng()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

TopkSynthOptions::TopkSynthOptions()
    : indexer_full(executor::IndexShareFullLayers(
          kGlm52Layers, kGlm52IndexTopkFreq, kGlm52IndexSkipTopkOffset)) {}

Status TopkSynthOptions::Validate() const {
  auto bad = [](std::string_view field, const std::string& why) {
    return Status::InvalidArgument(
        fmt::format("topk-trace: {} {}", field, why));
  };
  if (indexer_full.empty() || !indexer_full[0]) {
    return bad("layers", "must be >= 1 with layer 0 full");
  }
  if (k < 1 || k > executor::kTopkTraceMaxK) {
    return bad("k",
               fmt::format("{} outside [1, {}]", k, executor::kTopkTraceMaxK));
  }
  if (page_tokens < 1) return bad("page_tokens", "must be >= 1");
  if (context_tokens < 1 || steps < 0 ||
      context_tokens + std::max<int64_t>(steps, 1) - 1 > kMaxTokens) {
    return bad("context_tokens/steps",
               fmt::format("need context >= 1, steps >= 0 and context + "
                           "steps - 1 <= {}",
                           kMaxTokens));
  }
  if (sink_tokens < 0 || recent_tokens < 0 ||
      sink_tokens + std::max<int64_t>(recent_tokens, 1) > k) {
    return bad("sink_tokens/recent_tokens",
               fmt::format("must be >= 0 and together (the window at least "
                           "1, the newest token) <= k = {}",
                           k));
  }
  if (edge_layers < 0) return bad("edge_layers", "must be >= 0");
  auto in_unit = [](double v) { return v >= 0.0 && v <= 1.0; };
  if (!in_unit(edge_overlap) || !in_unit(overlap)) {
    return bad("overlap", "must be in [0, 1]");
  }
  const auto full = static_cast<size_t>(
      std::count(indexer_full.begin(), indexer_full.end(), true));
  if (!overlap_per_full_layer.empty()) {
    if (overlap_per_full_layer.size() != full) {
      return bad("overlap_per_full_layer",
                 fmt::format("has {} values for {} full layers",
                             overlap_per_full_layer.size(), full));
    }
    for (double v : overlap_per_full_layer) {
      if (!in_unit(v)) return bad("overlap_per_full_layer", "must be in [0,1]");
    }
  }
  if (!(importance_exponent >= 0.0 && importance_exponent <= 8.0)) {
    return bad("importance_exponent", "must be in [0, 8]");
  }
  if (!(overlap_tolerance >= 0.0)) {
    return bad("overlap_tolerance", "must be >= 0");
  }
  return Status::OK();
}

std::vector<double> TopkSynthOptions::TargetOverlaps() const {
  if (!overlap_per_full_layer.empty()) return overlap_per_full_layer;
  std::vector<double> targets;
  for (size_t l = 0; l < indexer_full.size(); ++l) {
    if (!indexer_full[l]) continue;
    targets.push_back(static_cast<int64_t>(l) < edge_layers ? edge_overlap
                                                            : overlap);
  }
  return targets;
}

std::string TopkSynthOptions::Describe() const {
  const auto full = std::count(indexer_full.begin(), indexer_full.end(), true);
  const std::string profile =
      overlap_per_full_layer.empty()
          ? fmt::format("overlap {} (layers < {}: {})", overlap, edge_layers,
                        edge_overlap)
          : fmt::format("overlap per full layer {}",
                        fmt::join(overlap_per_full_layer, ","));
  std::string s = fmt::format(
      "tierkv-bench topk-trace: {} layers ({} full), k {}, context {} + {} "
      "steps, sinks {}, recent {}, {}, zipf {}, seed {}",
      indexer_full.size(), full, k, context_tokens, steps, sink_tokens,
      recent_tokens, profile, importance_exponent, seed);
  if (s.size() > executor::kTopkTraceMaxSourceBytes) {
    s.resize(executor::kTopkTraceMaxSourceBytes);
  }
  return s;
}

Status ApplyTopkSynthShape(std::string_view shape, TopkSynthOptions* options) {
  std::string_view preset;
  if (shape == "glm5.2") preset = "glm5-shape";
  if (shape == "glm5-small") preset = "glm5-small";
  if (preset.empty()) {
    return Status::InvalidArgument(fmt::format(
        "topk-trace: unknown shape '{}'; known: glm5.2, glm5-small", shape));
  }
  auto config = executor::PresetConfig(preset);
  if (!config.ok()) return config.status();
  options->indexer_full = config->indexer_full;
  options->k = config->index_topk;
  return Status::OK();
}

// ---------------------------------------------------------------- generator

struct TopkTraceSynthesizer::Layer {
  double target = 0;
  std::mt19937_64 rng;
  std::vector<uint64_t> weight;  // importance of each position
  // The weights of the visible tokens the previous step did not select.
  WeightTree pool;
  std::vector<int32_t> previous;  // S_{t-1}, ascending
  std::vector<uint8_t> in_previous;
  double achievable_sum = 0;
  int64_t pairs = 0;
  int64_t clamped = 0;  // steps whose target was infeasible
};

TopkTraceSynthesizer::TopkTraceSynthesizer(TopkSynthOptions options,
                                           TopkTraceHeader header)
    : options_(std::move(options)), header_(std::move(header)) {}

TopkTraceSynthesizer::~TopkTraceSynthesizer() = default;

Result<std::unique_ptr<TopkTraceSynthesizer>> TopkTraceSynthesizer::Create(
    const TopkSynthOptions& options) {
  TIERKV_RETURN_IF_ERROR(options.Validate());
  auto header = executor::TopkTraceHeaderFor(
      options.indexer_full, options.page_tokens, options.k,
      options.source.empty() ? options.Describe() : options.source);
  if (!header.ok()) return header.status();
  std::unique_ptr<TopkTraceSynthesizer> s(
      new TopkTraceSynthesizer(options, std::move(header).value()));
  const int64_t max_tokens =
      options.context_tokens + std::max<int64_t>(options.steps, 1) - 1;
  const std::vector<double> targets = options.TargetOverlaps();
  // The Zipf weight of each importance rank (rank 1 = most important).
  std::vector<uint64_t> by_rank(static_cast<size_t>(max_tokens));
  for (int64_t r = 0; r < max_tokens; ++r) {
    const double w = kWeightScale * std::pow(static_cast<double>(r + 1),
                                             -options.importance_exponent);
    by_rank[r] = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(w)));
  }
  std::vector<int32_t> rank(static_cast<size_t>(max_tokens));
  for (size_t f = 0; f < targets.size(); ++f) {
    auto layer = std::make_unique<Layer>();
    layer->target = targets[f];
    layer->rng.seed(SplitMix64(options.seed ^ SplitMix64(f + 1)));
    // A random permutation of ranks over positions (Fisher-Yates).
    for (int64_t p = 0; p < max_tokens; ++p) rank[p] = static_cast<int32_t>(p);
    for (int64_t p = max_tokens - 1; p > 0; --p) {
      std::swap(rank[p], rank[Below(layer->rng, static_cast<uint64_t>(p) + 1)]);
    }
    layer->weight.resize(static_cast<size_t>(max_tokens));
    std::vector<uint64_t> visible(static_cast<size_t>(max_tokens), 0);
    for (int64_t p = 0; p < max_tokens; ++p) {
      layer->weight[p] = by_rank[rank[p]];
      if (p < options.context_tokens) visible[p] = layer->weight[p];
    }
    layer->pool.Assign(visible);
    layer->in_previous.assign(static_cast<size_t>(max_tokens), 0);
    s->layers_.push_back(std::move(layer));
  }
  s->context_ = options.context_tokens;
  return s;
}

bool TopkTraceSynthesizer::Next(TopkStep* step) {
  if (step_ >= options_.steps) return false;
  if (step_ > 0) {
    ++context_;  // the token decoded by the previous step
    for (auto& layer : layers_) {
      layer->pool.Add(static_cast<size_t>(context_ - 1),
                      layer->weight[context_ - 1]);
    }
  }
  step->context_tokens = context_;
  step->selections.resize(layers_.size());
  for (size_t f = 0; f < layers_.size(); ++f) {
    SelectStep(*layers_[f], &step->selections[f]);
  }
  ++step_;
  return true;
}

void TopkTraceSynthesizer::SelectStep(Layer& layer, std::vector<int32_t>* out) {
  const int64_t v = context_;
  const int64_t kt = std::min(options_.k, v);
  // Forced: sinks [0, sink_end) and the window [window_begin, v).
  const int64_t sink_end = std::min(options_.sink_tokens, v);
  const int64_t window_begin =
      std::max(sink_end, v - std::max<int64_t>(options_.recent_tokens, 1));
  auto forced = [&](int64_t id) { return id < sink_end || id >= window_begin; };
  std::vector<int32_t> must_add, candidates;
  std::vector<int32_t>& selected = *out;
  selected.clear();
  auto take_forced = [&](int64_t id) {
    (layer.in_previous[id] ? selected : must_add)
        .push_back(static_cast<int32_t>(id));
  };
  for (int64_t id = 0; id < sink_end; ++id) take_forced(id);
  for (int64_t id = window_begin; id < v; ++id) take_forced(id);
  for (int32_t id : layer.previous) {
    if (!forced(id)) candidates.push_back(id);
  }
  const auto prev = static_cast<int64_t>(layer.previous.size());
  const auto must_keep = static_cast<int64_t>(selected.size());
  const auto adds = static_cast<int64_t>(must_add.size());
  // Keep exactly `keep` ids of the previous step: the target, clamped to
  // what the forced ids and the pool of unselected tokens allow.
  const int64_t lo = std::max(must_keep, kt - (v - prev));
  const int64_t hi = std::min(prev, kt - adds);
  const int64_t wanted = std::llround(layer.target * static_cast<double>(kt));
  const int64_t keep = std::clamp<int64_t>(wanted, lo, hi);
  if (step_ > 0) {
    layer.achievable_sum += static_cast<double>(keep) / static_cast<double>(kt);
    ++layer.pairs;
    layer.clamped += keep != wanted;
  }
  // Keep `keep - must_keep` candidates, drawn in proportion to importance.
  std::vector<uint64_t> candidate_weight(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    candidate_weight[i] = layer.weight[candidates[i]];
  }
  WeightTree kept_tree;
  kept_tree.Assign(candidate_weight);
  std::vector<uint8_t> kept(candidates.size(), 0);
  uint64_t kept_total = kept_tree.Total();
  for (int64_t n = must_keep; n < keep; ++n) {
    const size_t i = kept_tree.Find(Below(layer.rng, kept_total));
    kept[i] = 1;
    kept_tree.Remove(i, candidate_weight[i]);
    kept_total -= candidate_weight[i];
    selected.push_back(candidates[i]);
  }
  // The forced new ids, then draws from the tokens the previous step did
  // not select, in proportion to importance.
  for (int32_t id : must_add) {
    layer.pool.Remove(static_cast<size_t>(id), layer.weight[id]);
    selected.push_back(id);
  }
  uint64_t pool_total = layer.pool.Total();
  for (int64_t n = keep + adds; n < kt; ++n) {
    const auto id =
        static_cast<int32_t>(layer.pool.Find(Below(layer.rng, pool_total)));
    layer.pool.Remove(static_cast<size_t>(id), layer.weight[id]);
    pool_total -= layer.weight[id];
    selected.push_back(id);
  }
  // Dropped ids return to the pool (after the draws: this step must not
  // pick them again, or the overlap would exceed `keep`).
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (kept[i]) continue;
    const int32_t id = candidates[i];
    layer.pool.Add(static_cast<size_t>(id), layer.weight[id]);
    layer.in_previous[id] = 0;
  }
  for (int32_t id : selected) layer.in_previous[id] = 1;
  std::sort(selected.begin(), selected.end());
  layer.previous = selected;
}

std::vector<double> TopkTraceSynthesizer::AchievableOverlap() const {
  std::vector<double> out;
  for (const auto& layer : layers_) {
    out.push_back(layer->pairs > 0 ? layer->achievable_sum /
                                         static_cast<double>(layer->pairs)
                                   : 0.0);
  }
  return out;
}

std::vector<int64_t> TopkTraceSynthesizer::ClampedSteps() const {
  std::vector<int64_t> out;
  for (const auto& layer : layers_) out.push_back(layer->clamped);
  return out;
}

// ---------------------------------------------------------------- file

Result<TopkSynthReport> WriteSyntheticTopkTrace(
    const std::filesystem::path& path, const TopkSynthOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto synth = TopkTraceSynthesizer::Create(options);
  if (!synth.ok()) return synth.status();
  auto writer = executor::TopkTraceWriter::Create(path, (*synth)->header());
  if (!writer.ok()) return writer.status();
  TopkStep step;
  while ((*synth)->Next(&step)) {
    TIERKV_RETURN_IF_ERROR((*writer)->Append(step));
  }
  TIERKV_RETURN_IF_ERROR((*writer)->Finish());
  TopkSynthReport report;
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  auto summary = executor::SummarizeTopkTrace(path);
  if (!summary.ok()) return summary.status();
  report.trace = std::move(summary).value();
  const std::vector<double> targets = options.TargetOverlaps();
  const std::vector<double> achievable = (*synth)->AchievableOverlap();
  const std::vector<int64_t> clamped = (*synth)->ClampedSteps();
  report.all_met = true;
  for (size_t f = 0; f < targets.size(); ++f) {
    TopkSynthLayerReport l;
    l.layer = report.trace.header.full_layers[f];
    l.target = targets[f];
    l.achievable = achievable[f];
    l.achieved = report.trace.mean_overlap[f];
    l.infeasible_steps = clamped[f];
    l.distinct_ids = report.trace.distinct_ids[f];
    const double tol = options.overlap_tolerance;
    l.met =
        std::fabs(l.achieved - l.target) <= tol ||
        (l.infeasible_steps > 0 && std::fabs(l.achieved - l.achievable) <= tol);
    report.all_met = report.all_met && l.met;
    report.mean_target += l.target / static_cast<double>(targets.size());
    report.mean_achieved += l.achieved / static_cast<double>(targets.size());
    report.layers.push_back(l);
  }
  return report;
}

}  // namespace tierkv::bench
