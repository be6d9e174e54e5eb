// `tierkv-bench topk`: the sparse working set (include/tierkv/
// sparse_working_set.h) on DSA selection traces.
//
//   working set  each trace's steps replayed through a SparseWorkingSet of
//                slot_factors x k slots (2K/4K/6K for k = 2048): token hit
//                rate, misses and row bytes copied in per decode step, for
//                the lru and topk policies, beside Belady (MIN: on a miss
//                it evicts the resident token whose next selection is
//                farthest away, never one the step itself selected) on the
//                same steps, and a frequency oracle (evicts the token the
//                whole trace selects least: the bound of ranking by
//                selection counts). Traces: synthetic
//                (bench/topk_trace_synth.h, one per --zipf value) and recorded
//                (--trace FILE, from tierkv-run --record-topk).
//   decode       the executor (a preset with random weights) decoding a
//                prompt with every row read from its KV cache, then through
//                a working set of 2 x index_topk slots: decode tokens/s of
//                both (the same logits either way: tests/executor/
//                working_set_decode_test.cc).
//
// Misses and bytes count every layer: a miss of a full layer's selection
// is one row copied for it and for each IndexShare layer reading that
// selection (`--row-bytes` each: 656 B, FlashMLA's fp8 latent row of
// GLM-5, by default).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include "bench/registry.h"
#include "bench/topk_trace_synth.h"
#include "executor/generator.h"
#include "executor/model.h"
#include "executor/presets.h"
#include "executor/topk_trace.h"
#include "executor/weights.h"
#include "tierkv/sparse_working_set.h"

namespace tierkv::bench {
namespace {

using executor::TopkStep;
using executor::TopkTraceHeader;
using Clock = std::chrono::steady_clock;

struct TopkBenchOptions {
  std::vector<std::string> traces;  // recorded
  std::string shape = "glm5.2";
  int64_t context_tokens = 32768;
  int64_t steps = 256;
  std::vector<double> zipf = {1.0, 2.0};
  uint64_t seed = 1;
  std::vector<int> slot_factors = {1, 2, 3};
  uint32_t row_bytes = 656;
  uint32_t sink_tokens = 4;
  uint32_t recent_tokens = 64;
  double decay = WorkingSetOptions{}.decay;
  bool skip_decode = false;
  std::string decode_preset = "glm5-small";
  int64_t decode_prompt = 2048;
  int64_t decode_steps = 64;
  std::string json_path;
};

// A trace held in memory: the header and every step.
struct Trace {
  std::string name;
  TopkTraceHeader header;
  std::vector<TopkStep> steps;
};

Result<Trace> ReadTrace(const std::string& path) {
  auto reader = executor::TopkTraceReader::Open(path);
  if (!reader.ok()) return reader.status();
  Trace t{path, (*reader)->header(), {}};
  while (true) {
    TopkStep step;
    auto more = (*reader)->Next(&step);
    if (!more.ok()) return more.status();
    if (!*more) break;
    t.steps.push_back(std::move(step));
  }
  return t;
}

Result<Trace> SyntheticTrace(const TopkBenchOptions& o, double zipf) {
  TopkSynthOptions so;
  TIERKV_RETURN_IF_ERROR(ApplyTopkSynthShape(o.shape, &so));
  so.context_tokens = o.context_tokens;
  so.steps = o.steps;
  so.importance_exponent = zipf;
  so.seed = o.seed;
  auto synth = TopkTraceSynthesizer::Create(so);
  if (!synth.ok()) return synth.status();
  Trace t{fmt::format("synthetic {} zipf {}", o.shape, zipf),
          (*synth)->header(),
          {}};
  TopkStep step;
  while ((*synth)->Next(&step)) t.steps.push_back(step);
  return t;
}

// Layers reading each full layer's selection (itself included).
std::vector<int64_t> GroupSizes(const TopkTraceHeader& h) {
  std::vector<int64_t> sizes(h.full_layers.size(), 0);
  for (int64_t l = 0; l < h.num_layers; ++l) {
    sizes[static_cast<size_t>(h.FullIndex(h.selection_source[l]))]++;
  }
  return sizes;
}

struct Result3 {
  uint64_t selected = 0;
  uint64_t misses = 0;      // selections' misses (one decision per group)
  uint64_t row_copies = 0;  // misses x layers of the group
};

// Belady (MIN) over one full layer's selections with `slots` slots.
uint64_t BeladyMisses(const Trace& t, size_t full, uint32_t slots) {
  // The steps at which each token is selected, in order.
  std::vector<std::vector<int32_t>> uses;
  for (size_t s = 0; s < t.steps.size(); ++s) {
    for (int32_t id : t.steps[s].selections[full]) {
      if (static_cast<size_t>(id) >= uses.size()) uses.resize(id + 1);
      uses[id].push_back(static_cast<int32_t>(s));
    }
  }
  constexpr int32_t kNever = INT32_MAX;
  std::vector<size_t> next(uses.size(), 0);           // index into uses[id]
  std::vector<int32_t> resident_at(uses.size(), -1);  // next use key, -1 = out
  std::vector<int32_t> in_step(uses.size(), -1);
  // Max-heap of (next use, token); entries go stale when a token's next use
  // changes or it leaves (lazy deletion).
  std::priority_queue<std::pair<int32_t, int32_t>> heap;
  uint64_t resident = 0, misses = 0;
  std::vector<std::pair<int32_t, int32_t>> aside;
  for (size_t s = 0; s < t.steps.size(); ++s) {
    const auto& sel = t.steps[s].selections[full];
    std::vector<int32_t> missed;
    for (int32_t id : sel) {
      in_step[id] = static_cast<int32_t>(s);
      if (resident_at[id] < 0) missed.push_back(id);
    }
    misses += missed.size();
    for (size_t m = 0; m < missed.size(); ++m) {
      if (resident < slots) {
        ++resident;
        continue;
      }
      aside.clear();
      while (true) {
        auto [when, token] = heap.top();
        heap.pop();
        if (resident_at[token] != when) continue;  // stale
        if (in_step[token] == static_cast<int32_t>(s)) {
          aside.push_back({when, token});
          continue;
        }
        resident_at[token] = -1;  // evicted
        break;
      }
      for (const auto& e : aside) heap.push(e);
    }
    // Every selected token is resident now, until its next selection.
    for (int32_t id : sel) {
      size_t& n = next[id];
      while (n < uses[id].size() && uses[id][n] <= static_cast<int32_t>(s)) {
        ++n;
      }
      const int32_t when = n < uses[id].size() ? uses[id][n] : kNever;
      resident_at[id] = when;
      heap.push({when, id});
    }
  }
  return misses;
}

// A frequency oracle: on a miss, evicts the resident token the whole
// trace selects least often (counts known in advance). The bound of any
// policy that ranks tokens by how often they are selected.
uint64_t FrequencyOracleMisses(const Trace& t, size_t full, uint32_t slots) {
  std::vector<uint32_t> count;
  for (const TopkStep& step : t.steps) {
    for (int32_t id : step.selections[full]) {
      if (static_cast<size_t>(id) >= count.size()) count.resize(id + 1);
      count[id]++;
    }
  }
  std::vector<bool> resident(count.size(), false);
  std::set<std::pair<uint32_t, int32_t>> order;  // unselected residents
  uint64_t misses = 0, held = 0;
  for (const TopkStep& step : t.steps) {
    const auto& sel = step.selections[full];
    for (int32_t id : sel) {  // this step's tokens cannot go
      if (resident[id]) order.erase({count[id], id});
    }
    for (int32_t id : sel) {
      if (resident[id]) continue;
      ++misses;
      if (held < slots) {
        ++held;
      } else {
        resident[order.begin()->second] = false;
        order.erase(order.begin());
      }
      resident[id] = true;
    }
    for (int32_t id : sel) order.insert({count[id], id});
  }
  return misses;
}

Result<Result3> RunPolicy(const Trace& t, uint32_t slots,
                          WorkingSetPolicy policy, const TopkBenchOptions& o) {
  WorkingSetLayout layout;
  for (int64_t l = 0; l < t.header.num_layers; ++l) {
    layout.group_of_layer.push_back(
        static_cast<uint16_t>(t.header.selection_source[l]));
    layout.row_bytes.push_back(o.row_bytes);
  }
  // Row contents do not matter here; where they come from does not either.
  static const std::vector<std::byte> row(1 << 16);
  const uint32_t row_bytes = o.row_bytes;
  RowSource source = [row_bytes](uint16_t, int32_t) {
    return std::span<const std::byte>(row.data(), row_bytes);
  };
  WorkingSetOptions wo;
  wo.slots = slots;
  wo.policy = policy;
  wo.decay = o.decay;
  wo.sink_tokens = o.sink_tokens;
  wo.recent_tokens = o.recent_tokens;
  wo.page_tokens = static_cast<uint32_t>(t.header.page_tokens);
  auto ws = SparseWorkingSet::Create(layout, wo, std::move(source));
  if (!ws.ok()) return ws.status();
  const std::vector<int64_t> group = GroupSizes(t.header);
  Result3 r;
  std::vector<uint64_t> misses_of(group.size(), 0);
  for (const TopkStep& step : t.steps) {
    for (size_t f = 0; f < t.header.full_layers.size(); ++f) {
      const uint64_t before = (*ws)->stats().misses;
      TIERKV_RETURN_IF_ERROR(
          (*ws)->Select(static_cast<uint16_t>(t.header.full_layers[f]),
                        step.selections[f], step.context_tokens));
      misses_of[f] += (*ws)->stats().misses - before;
    }
  }
  r.selected = (*ws)->stats().selected;
  for (size_t f = 0; f < group.size(); ++f) {
    r.misses += misses_of[f];
    r.row_copies += misses_of[f] * static_cast<uint64_t>(group[f]);
  }
  return r;
}

Status WorkingSetTable(const std::vector<Trace>& traces,
                       const TopkBenchOptions& o, nlohmann::json* out) {
  fmt::print(
      "\n[working set] misses per decode step count one per full layer's "
      "selection; MB/step is rows copied in for every layer ({} B rows)\n",
      o.row_bytes);
  fmt::print("  {:<28} {:>6} {:>7} {:>9} {:>12} {:>9} {:>10}\n", "trace",
             "slots", "policy", "hit rate", "misses/step", "MB/step", "vs lru");
  for (const Trace& t : traces) {
    const auto group = GroupSizes(t.header);
    for (int factor : o.slot_factors) {
      const auto slots = static_cast<uint32_t>(factor * t.header.k);
      const double steps = static_cast<double>(t.steps.size());
      uint64_t lru_misses = 0;
      nlohmann::json row = {{"trace", t.name},
                            {"k", t.header.k},
                            {"slots", slots},
                            {"steps", t.steps.size()}};
      auto print = [&](const char* policy, const Result3& r) {
        const double saved =
            lru_misses ? 1.0 - static_cast<double>(r.misses) / lru_misses : 0;
        fmt::print("  {:<28} {:>6} {:>7} {:>8.1f}% {:>12.1f} {:>9.2f} {:>10}\n",
                   t.name, slots, policy,
                   100.0 * (1.0 - static_cast<double>(r.misses) / r.selected),
                   r.misses / steps, r.row_copies * o.row_bytes / steps / 1e6,
                   std::string(policy) == "lru"
                       ? std::string("")
                       : fmt::format("{:+.1f}%", -100 * saved));
        row[policy] = {
            {"hit_rate", 1.0 - static_cast<double>(r.misses) / r.selected},
            {"misses_per_step", r.misses / steps},
            {"bytes_per_step", r.row_copies * o.row_bytes / steps},
            {"misses_vs_lru", lru_misses ? -saved : 0.0}};
      };
      for (auto policy : {WorkingSetPolicy::kLru, WorkingSetPolicy::kTopk}) {
        auto r = RunPolicy(t, slots, policy, o);
        if (!r.ok()) return r.status();
        if (policy == WorkingSetPolicy::kLru) lru_misses = r->misses;
        print(WorkingSetPolicyName(policy), *r);
      }
      Result3 belady;
      for (size_t f = 0; f < t.header.full_layers.size(); ++f) {
        const uint64_t m = BeladyMisses(t, f, slots);
        belady.misses += m;
        belady.row_copies += m * static_cast<uint64_t>(group[f]);
        for (const TopkStep& step : t.steps) {
          belady.selected += step.selections[f].size();
        }
      }
      print("belady", belady);
      Result3 oracle;
      oracle.selected = belady.selected;
      for (size_t f = 0; f < t.header.full_layers.size(); ++f) {
        const uint64_t m = FrequencyOracleMisses(t, f, slots);
        oracle.misses += m;
        oracle.row_copies += m * static_cast<uint64_t>(group[f]);
      }
      print("freq-oracle", oracle);
      out->push_back(row);
    }
  }
  return Status::OK();
}

Status DecodeTable(const TopkBenchOptions& o, nlohmann::json* out) {
  auto config = executor::PresetConfig(o.decode_preset);
  if (!config.ok()) return config.status();
  auto model = executor::Model::Create(
      *config, executor::RandomWeights(*config, o.seed),
      {.attention_mode = executor::AttentionMode::kAbsorbedMqa});
  if (!model.ok()) return model.status();
  std::vector<int32_t> prompt(static_cast<size_t>(o.decode_prompt));
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % config->vocab_size);
  }
  fmt::print(
      "\n[decode] {} (random weights), prompt {} tokens, {} decode steps, "
      "{} threads\n",
      o.decode_preset, o.decode_prompt, o.decode_steps,
      (*model)->num_threads());
  fmt::print("  {:<26} {:>8} {:>11} {:>9} {:>8}\n", "rows read from", "slots",
             "decode tok/s", "hit rate", "logits");
  std::vector<float> reference;
  double base = 0;
  for (int run = 0; run < 3; ++run) {
    std::optional<WorkingSetOptions> ws;
    if (run > 0) {
      ws = WorkingSetOptions{
          .slots = static_cast<uint32_t>(2 * config->index_topk),
          .policy = run == 1 ? WorkingSetPolicy::kLru : WorkingSetPolicy::kTopk,
          .sink_tokens = o.sink_tokens,
          .recent_tokens = o.recent_tokens};
      ws->slots += o.sink_tokens + o.recent_tokens;
    }
    auto cache = (*model)->NewCache(o.decode_prompt + o.decode_steps + 1);
    if (!cache.ok()) return cache.status();
    executor::GenerateOptions g;
    g.max_new_tokens = o.decode_steps + 1;
    g.keep_logits = true;
    g.working_set = ws;
    auto r = executor::Generate(**model, cache->get(), prompt, g);
    if (!r.ok()) return r.status();
    const double tps = r->decode_steps / r->decode_seconds;
    if (run == 0) {
      reference = r->logits;
      base = tps;
    }
    const WorkingSetStats& s = r->working_set;
    const std::string name =
        run == 0
            ? "the KV cache (all rows)"
            : fmt::format("working set ({})", WorkingSetPolicyName(ws->policy));
    fmt::print(
        "  {:<26} {:>8} {:>11.1f} {:>8} {:>8}\n", name,
        ws ? std::to_string(ws->slots) : std::string("-"), tps,
        ws ? fmt::format("{:.1f}%",
                         100.0 * s.hits / std::max<uint64_t>(s.selected, 1))
           : std::string("-"),
        r->logits == reference ? "equal" : "DIFFER");
    out->push_back({{"rows_from", name},
                    {"slots", ws ? ws->slots : 0},
                    {"decode_tokens_per_second", tps},
                    {"vs_all_rows", tps / base},
                    {"hits", s.hits},
                    {"selected", s.selected},
                    {"logits_equal", r->logits == reference}});
    if (r->logits != reference) {
      return Status::Internal("decode through the working set changed logits");
    }
  }
  return Status::OK();
}

int RunTopkBench(const TopkBenchOptions& o) {
  std::vector<Trace> traces;
  for (double z : o.zipf) {
    auto t = SyntheticTrace(o, z);
    if (!t.ok()) {
      fmt::print(stderr, "topk bench: {}\n", t.status().ToString());
      return 1;
    }
    traces.push_back(std::move(t).value());
  }
  for (const std::string& path : o.traces) {
    auto t = ReadTrace(path);
    if (!t.ok()) {
      fmt::print(stderr, "topk bench: {}\n", t.status().ToString());
      return 1;
    }
    traces.push_back(std::move(t).value());
  }
  for (const Trace& t : traces) {
    fmt::print("trace {}: {} layers ({} full), k {}, {} steps, context {}\n",
               t.name, t.header.num_layers, t.header.full_layers.size(),
               t.header.k, t.steps.size(),
               t.steps.empty() ? 0 : t.steps.front().context_tokens);
  }
  nlohmann::json ws = nlohmann::json::array(), decode = nlohmann::json::array();
  if (Status s = WorkingSetTable(traces, o, &ws); !s.ok()) {
    fmt::print(stderr, "topk bench: {}\n", s.ToString());
    return 1;
  }
  if (!o.skip_decode) {
    if (Status s = DecodeTable(o, &decode); !s.ok()) {
      fmt::print(stderr, "topk bench: {}\n", s.ToString());
      return 1;
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << nlohmann::json{{"bench", "topk"},
                        {"row_bytes", o.row_bytes},
                        {"decay", o.decay},
                        {"working_set", ws},
                        {"decode", decode}}
             .dump(2)
      << "\n";
    if (!f) {
      fmt::print(stderr, "topk bench: cannot write {}\n", o.json_path);
      return 1;
    }
  }
  return 0;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto o = std::make_shared<TopkBenchOptions>();
  auto* sub = app.add_subcommand(
      "topk",
      "the sparse working set on DSA selection traces: lru vs topk vs "
      "Belady misses and bytes per step; decode tokens/s with it");
  sub->add_option("--trace", o->traces,
                  "a recorded trace (tierkv-run --record-topk); repeatable");
  sub->add_option("--shape", o->shape, "synthetic traces: glm5.2 | glm5-small")
      ->capture_default_str();
  sub->add_option("--context", o->context_tokens,
                  "synthetic: tokens at the first step")
      ->capture_default_str();
  sub->add_option("--steps", o->steps, "synthetic: decode steps")
      ->capture_default_str();
  sub->add_option("--zipf", o->zipf,
                  "synthetic: importance exponents, one trace each (none: "
                  "--zipf with no value is not allowed; use --no-synthetic)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_flag_callback(
      "--no-synthetic", [o] { o->zipf.clear(); }, "only the --trace files");
  sub->add_option("--seed", o->seed, "synthetic traces and weights")
      ->capture_default_str();
  sub->add_option("--slot-factors", o->slot_factors,
                  "working-set slots as multiples of k")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--row-bytes", o->row_bytes,
                  "bytes of one latent row (656: GLM-5 fp8)")
      ->capture_default_str();
  sub->add_option("--decay", o->decay, "topk: score factor per step")
      ->capture_default_str();
  sub->add_option("--sinks", o->sink_tokens, "topk: protected first tokens")
      ->capture_default_str();
  sub->add_option("--recent", o->recent_tokens, "topk: protected last tokens")
      ->capture_default_str();
  sub->add_flag("--skip-decode", o->skip_decode, "no executor decode run");
  sub->add_option("--decode-preset", o->decode_preset, "executor preset")
      ->capture_default_str();
  sub->add_option("--decode-prompt", o->decode_prompt, "prompt tokens")
      ->capture_default_str();
  sub->add_option("--decode-steps", o->decode_steps, "decode steps")
      ->capture_default_str();
  sub->add_option("--json", o->json_path, "write the figures as JSON");
  sub->callback([o] { SetExitCode(RunTopkBench(*o)); });
});

}  // namespace
}  // namespace tierkv::bench
