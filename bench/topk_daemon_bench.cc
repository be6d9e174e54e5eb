// `tierkv-bench topk-daemon`: the daemon's `topk` eviction policy under a
// decode-heavy workload, against `lru` (issue "Top-k-aware caching": with
// a host tier of 1/4 of the working set, >= 90% of selected pages' reads
// served from DRAM where LRU serves fewer).
//
// Workload: a DSA top-k selection trace (synthetic, topk_trace_synth.h, per
// --skews Zipf exponent of the token importance; or --trace FILE) replayed
// against a real tierkvd per policy. The namespace's layout is the
// executor's (TierKvCache::LayoutFor): a "kv" part per layer and an
// "index_k" part on full (indexer) layers. Every page of the context (the
// last step's) is stored once with Put under write_through to an NVMe tier
// (a file in the daemon's temp dir), so evicted pages stay readable; the
// host tier holds --host-fraction (1/4) of the context's bytes, both parts
// (see below for the working set).
// Then for each decode step and full layer f, the distinct pages of f's
// selected tokens are read: `Match` (--probe match: the engine learns each
// page's tier; the daemon touches the page and queues the promotion of its
// NVMe-only segments, as it does for a prefix lookup), then one `Get` of
// the kv segments of f's IndexShare group (the layers that attend over f's
// selection); a read from NVMe promotes into DRAM. Every --report-every
// steps the selection counts per (page, full layer) since the last report
// (SparseWorkingSet's counts: selected tokens of the page) go to the
// daemon with Client::ReportTopk, the same for every policy (lru ignores
// them).
//
// A "selected-page read" is one (step, full layer, page). It is served
// from DRAM when, just before it, every kv segment of the group it reads
// was in DRAM: the bench lists the tier's segments (Client::List, which
// neither uses nor moves anything) before each Match. Also reported: the
// share by Match's answer (every segment of the page, all layers and
// parts, in DRAM: stricter), the daemon's own Get counters (segments from
// DRAM vs NVMe), promotions and NVMe reads.
//
// Working set: the pages the trace selects at least once (printed as a
// share of the context; where it is 100% the two coincide). The host tier
// is --host-fraction of the context's bytes, or with --host-basis
// working-set of the working set's. Bounds printed beside (static, what
// holding a fixed set can serve): the share of reads that go to the pages
// read most often, as many as the host bytes hold (1/4 of the pages by
// default), and the same at the granularity the tier evicts: (page, group)
// units chosen by reads per byte until they fill the host bytes.
//
// --layouts: the synthesizer draws token importance over a random
// permutation of positions, so every page holds some important tokens and
// page-level reads are nearly flat ("scattered"); "clustered" relabels the
// prompt's tokens so that tokens selected about as often share pages
// (ClusterPages: same selections, overlap and per-token counts).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bench/registry.h"
#include "bench/topk_trace_synth.h"
#include "executor/kv_cache.h"
#include "executor/kv_format.h"
#include "executor/presets.h"
#include "executor/tier_kv_cache.h"
#include "executor/topk_trace.h"
#include "tests/testing/daemon_process.h"
#include "tierkv/client.h"
#include "tierkv/page_hash.h"

namespace tierkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kNamespace[] = "topk-daemon";
constexpr char kToken[] = "topk-daemon-token";
// The most segments one List returns (the protocol's batch limit): more
// than a host tier of this bench holds.
constexpr uint32_t kMaxListed = uint32_t{1} << 16;

struct TopkDaemonOptions {
  std::string trace_path;            // empty: synthetic traces
  std::string shape = "glm5-small";  // glm5-small | glm5.2
  int64_t context = 16384;
  int64_t steps = 256;
  std::vector<double> skews = {1.0, 2.0};
  // scattered: token positions as the trace has them; clustered: the same
  // selections with the prompt's tokens relabeled so that tokens selected
  // about as often share pages (ClusterPages).
  std::vector<std::string> layouts = {"scattered", "clustered"};
  double overlap = 0.44;  // middle layers' consecutive-step overlap
  uint64_t seed = 1;
  std::vector<std::string> policies = {"lru", "topk"};
  std::string kv_dtype = "fp8";
  // The host tier: this share of the context's KV bytes (every page, both
  // parts), or (host_basis "working-set") of the selected pages' bytes.
  double host_fraction = 0.25;
  std::string host_basis = "context";
  int64_t report_every = 16;
  double warmup_fraction = 0.1;
  std::string probe = "match";  // match | list
  // What the Match asks the daemon to prefetch: none | group | all.
  std::string prefetch = "none";
  uint32_t shards = 8;
  std::string json_path;
};

// One trace in memory.
struct Trace {
  std::string label;
  double skew = -1;  // the synthetic importance exponent; -1 for a file
  std::string layout = "scattered";
  executor::TopkTraceHeader header;
  std::vector<executor::TopkStep> steps;
};

// What the replay reads, derived from a trace and the layout.
struct Workload {
  LayoutSpec layout;
  uint32_t pages = 0;
  std::vector<PageHash> hashes;
  std::vector<uint16_t> full_layers;
  // Per full layer (index into full_layers): the layers of its group.
  std::vector<std::vector<uint16_t>> groups;
  // [step][full index] -> (page, selected tokens in it), pages ascending.
  std::vector<std::vector<std::vector<std::pair<uint32_t, uint32_t>>>> reads;
  uint32_t selected_pages = 0;  // selected at least once: the working set
  uint64_t page_bytes = 0;      // every segment of one page
  uint64_t total_bytes = 0;     // every page
  int64_t warmup_steps = 0;     // reads of later steps count as "warm"
  int64_t first_context = 0;    // tokens at the first and last step
  int64_t last_context = 0;
};

// The trace's own figures, independent of the policy.
struct TraceFigures {
  double selected_fraction = 0;  // pages selected at least once / pages
  uint64_t reads = 0, warm_reads = 0;
  double page_bound = 0, warm_page_bound = 0;
  double group_bound = 0, warm_group_bound = 0;
};

struct PolicyFigures {
  std::string policy;
  uint64_t reads = 0, warm_reads = 0;
  uint64_t group_host = 0, warm_group_host = 0;  // every kv segment in DRAM
  uint64_t page_host = 0, warm_page_host = 0;    // by the probe's page tier
  uint64_t segments = 0, segments_host = 0;      // kv segments read
  uint64_t get_failures = 0;                     // Get items not OK
  // index_k bytes in DRAM summed over the probes (one per read batch).
  double index_key_bytes = 0;
  uint64_t probes = 0;
  std::string first_failure;
  // The daemon's counters over the replay.
  double get_host = 0, get_nvme = 0;  // Get segments by source tier
  double promoted_segments = 0, promoted_bytes = 0;
  double nvme_read_bytes = 0;
  double evictions = 0;
  uint64_t reports = 0;       // ReportTopk calls
  double engine_seconds = 0;  // Match + Get + ReportTopk
  double wall_seconds = 0;    // the replay, probes included
  double Share(uint64_t num, uint64_t den) const {
    return den > 0 ? 100.0 * static_cast<double>(num) / den : 0;
  }
};

Result<std::string> PresetOfShape(const std::string& shape) {
  if (shape == "glm5-small") return std::string("glm5-small");
  if (shape == "glm5.2") return std::string("glm5-shape");
  return Status::InvalidArgument(fmt::format(
      "topk-daemon: unknown shape '{}' (glm5-small, glm5.2)", shape));
}

Result<Trace> SynthesizeTrace(const TopkDaemonOptions& o, double skew) {
  TopkSynthOptions s;
  TIERKV_RETURN_IF_ERROR(ApplyTopkSynthShape(o.shape, &s));
  s.context_tokens = o.context;
  s.steps = o.steps;
  s.overlap = o.overlap;
  s.importance_exponent = skew;
  s.seed = o.seed;
  auto synth = TopkTraceSynthesizer::Create(s);
  if (!synth.ok()) return synth.status();
  Trace t;
  t.label = fmt::format("zipf {:.2f}", skew);
  t.skew = skew;
  t.header = (*synth)->header();
  executor::TopkStep step;
  while ((*synth)->Next(&step)) t.steps.push_back(step);
  return t;
}

Result<Trace> ReadTrace(const std::string& path) {
  auto reader = executor::TopkTraceReader::Open(path);
  if (!reader.ok()) return reader.status();
  Trace t;
  t.label = path;
  t.header = (*reader)->header();
  executor::TopkStep step;
  while (true) {
    auto more = (*reader)->Next(&step);
    if (!more.ok()) return more.status();
    if (!*more) break;
    t.steps.push_back(step);
  }
  if (t.steps.empty()) {
    return Status::InvalidArgument(fmt::format("{}: no steps", path));
  }
  return t;
}

// The same selections with the prompt's tokens relabeled so that tokens
// selected about as often share pages: the tokens of the full pages
// between the first page (attention sinks) and the first step's recent
// window are ranked by how often any full layer selects them over the whole
// trace, cut into pages in rank order, and those pages are shuffled
// (seeded) over the same page slots. A bijection of positions that leaves
// the sinks' page, the window and every later token in place: each step's
// selection sizes, consecutive-step overlap and per-token counts are
// unchanged; only how a token's importance maps to pages changes. The
// synthesizer draws importance over a random permutation of positions, so
// every page holds some important tokens and page-level reads are nearly
// flat; real attention concentrates on passages (Quest, InfLLM: page- and
// block-level criticality), which this layout models at its extreme.
void ClusterPages(Trace* t, int64_t recent_tokens, uint64_t seed) {
  const int64_t page = t->header.page_tokens;
  const int64_t first = t->steps.front().context_tokens;
  const int64_t begin = page;  // after the sinks' page
  const int64_t end = std::max(begin, (first - recent_tokens) / page * page);
  if (end - begin < 2 * page) return;
  std::vector<uint64_t> count(static_cast<size_t>(end - begin));
  for (const executor::TopkStep& step : t->steps) {
    for (const auto& selection : step.selections) {
      for (int32_t id : selection) {
        if (id >= begin && id < end) count[id - begin]++;
      }
    }
  }
  std::vector<int32_t> ranked(count.size());
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](int32_t a, int32_t b) { return count[a] > count[b]; });
  std::vector<int64_t> slots(static_cast<size_t>((end - begin) / page));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937_64(seed));
  std::vector<int32_t> to(count.size());  // old offset -> new position
  for (size_t r = 0; r < ranked.size(); ++r) {
    to[ranked[r]] = static_cast<int32_t>(begin + slots[r / page] * page +
                                         static_cast<int64_t>(r) % page);
  }
  for (executor::TopkStep& step : t->steps) {
    for (auto& selection : step.selections) {
      for (int32_t& id : selection) {
        if (id >= begin && id < end) id = to[id - begin];
      }
      std::sort(selection.begin(), selection.end());
    }
  }
  t->layout = "clustered";
}

Result<Workload> BuildWorkload(const TopkDaemonOptions& o, const Trace& t) {
  auto preset = PresetOfShape(o.shape);
  if (!preset.ok()) return preset.status();
  auto config = executor::PresetConfig(*preset);
  if (!config.ok()) return config.status();
  auto dtype = executor::ParseKvDtype(o.kv_dtype);
  if (!dtype.ok()) return dtype.status();
  const executor::TopkTraceHeader& h = t.header;
  if (h.num_layers != config->num_hidden_layers || h.page_tokens <= 0 ||
      h.page_tokens > 65536) {
    return Status::InvalidArgument(fmt::format(
        "topk-daemon: the trace has {} layers and {}-token pages; shape {} "
        "has {} layers",
        h.num_layers, h.page_tokens, o.shape, config->num_hidden_layers));
  }
  for (int64_t l = 0; l < h.num_layers; ++l) {
    if ((h.FullIndex(l) >= 0) != config->indexer_full[l]) {
      return Status::InvalidArgument(fmt::format(
          "topk-daemon: the trace's full layers {} differ from shape {}'s",
          fmt::join(h.full_layers, ","), o.shape));
    }
  }
  Workload w;
  w.first_context = t.steps.front().context_tokens;
  w.last_context = w.first_context;
  for (const auto& s : t.steps) {
    w.last_context = std::max(w.last_context, s.context_tokens);
  }
  executor::KvCacheGeometry g =
      executor::GeometryFor(*config, w.last_context, *dtype);
  g.page_tokens = h.page_tokens;
  w.layout = executor::TierKvCache::LayoutFor(g);
  w.pages = static_cast<uint32_t>((w.last_context + h.page_tokens - 1) /
                                  h.page_tokens);
  std::vector<uint32_t> tokens(size_t{w.pages} * h.page_tokens);
  std::iota(tokens.begin(), tokens.end(), 0u);
  w.hashes = PageHashChain(RootPageHash(kNamespace), tokens,
                           static_cast<uint32_t>(h.page_tokens));
  for (uint16_t l = 0; l < w.layout.num_layers(); ++l) {
    for (uint8_t p = 0; p < w.layout.layers[l].parts.size(); ++p) {
      w.page_bytes += w.layout.SegmentBytes(l, p);
    }
  }
  w.total_bytes = w.page_bytes * w.pages;
  for (int32_t f : h.full_layers) {
    w.full_layers.push_back(static_cast<uint16_t>(f));
    std::vector<uint16_t> group;
    for (int64_t l = 0; l < h.num_layers; ++l) {
      if (h.selection_source[l] == f) group.push_back(static_cast<uint16_t>(l));
    }
    w.groups.push_back(std::move(group));
  }
  w.warmup_steps = static_cast<int64_t>(
      std::ceil(o.warmup_fraction * static_cast<double>(t.steps.size())));
  w.reads.resize(t.steps.size());
  for (size_t s = 0; s < t.steps.size(); ++s) {
    w.reads[s].resize(h.full_layers.size());
    for (size_t j = 0; j < h.full_layers.size(); ++j) {
      auto& out = w.reads[s][j];
      for (int32_t id : t.steps[s].selections[j]) {  // ascending
        const auto page = static_cast<uint32_t>(id / h.page_tokens);
        if (out.empty() || out.back().first != page) out.push_back({page, 0});
        out.back().second++;
      }
    }
  }
  std::vector<bool> selected(w.pages);
  for (const auto& step : w.reads) {
    for (const auto& layer : step) {
      for (const auto& [page, tokens] : layer) selected[page] = true;
    }
  }
  w.selected_pages =
      static_cast<uint32_t>(std::count(selected.begin(), selected.end(), true));
  return w;
}

// The share of `reads` that the best static set of units of total size at
// most `capacity` covers, choosing by reads per byte (greedy: exact when
// every unit has the same size).
double StaticBound(const std::vector<uint64_t>& reads,
                   const std::vector<uint64_t>& bytes, uint64_t capacity) {
  std::vector<size_t> order(reads.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    // reads[a] / bytes[a] > reads[b] / bytes[b], without division.
    return static_cast<double>(reads[a]) * bytes[b] >
           static_cast<double>(reads[b]) * bytes[a];
  });
  uint64_t total = 0, covered = 0, used = 0;
  for (uint64_t r : reads) total += r;
  for (size_t u : order) {
    if (used + bytes[u] > capacity) continue;
    used += bytes[u];
    covered += reads[u];
  }
  return total > 0 ? 100.0 * static_cast<double>(covered) / total : 0;
}

TraceFigures MeasureTrace(const Workload& w, uint64_t host_bytes) {
  TraceFigures f;
  const size_t groups = w.groups.size();
  // Per page, and per (page, group) unit; all steps and after warm-up.
  std::vector<uint64_t> page_reads(w.pages), warm_page_reads(w.pages);
  std::vector<uint64_t> unit_reads(size_t{w.pages} * groups);
  std::vector<uint64_t> warm_unit_reads(unit_reads.size());
  for (size_t s = 0; s < w.reads.size(); ++s) {
    const bool warm = static_cast<int64_t>(s) >= w.warmup_steps;
    for (size_t j = 0; j < groups; ++j) {
      for (const auto& [page, tokens] : w.reads[s][j]) {
        page_reads[page]++;
        unit_reads[size_t{page} * groups + j]++;
        f.reads++;
        if (!warm) continue;
        warm_page_reads[page]++;
        warm_unit_reads[size_t{page} * groups + j]++;
        f.warm_reads++;
      }
    }
  }
  f.selected_fraction = 100.0 * w.selected_pages / w.pages;
  // A page holds w.page_bytes; 1/4 of the pages is 1/4 of the bytes.
  const std::vector<uint64_t> page_bytes(w.pages, w.page_bytes);
  const uint64_t page_capacity = w.page_bytes * (host_bytes / w.page_bytes);
  f.page_bound = StaticBound(page_reads, page_bytes, page_capacity);
  f.warm_page_bound = StaticBound(warm_page_reads, page_bytes, page_capacity);
  // A unit is the kv segments of one group of one page (what a read needs).
  std::vector<uint64_t> unit_bytes(unit_reads.size());
  for (uint32_t p = 0; p < w.pages; ++p) {
    for (size_t j = 0; j < groups; ++j) {
      uint64_t bytes = 0;
      for (uint16_t l : w.groups[j]) bytes += w.layout.SegmentBytes(l, 0);
      unit_bytes[size_t{p} * groups + j] = bytes;
    }
  }
  f.group_bound = StaticBound(unit_reads, unit_bytes, host_bytes);
  f.warm_group_bound = StaticBound(warm_unit_reads, unit_bytes, host_bytes);
  return f;
}

std::string DaemonConfig(const TopkDaemonOptions& o, const Workload& w,
                         const std::string& policy, uint64_t host_bytes) {
  // NVMe: every page once, with room for the allocator.
  const uint64_t nvme_bytes = ((w.total_bytes * 2 >> 20) + 256) << 20;
  return fmt::format(
      "[[namespace]]\nname = \"{}\"\ntoken = \"{}\"\nhost_bytes = {}\n"
      "shards = {}\nwrite_policy = \"write_through\"\n"
      "eviction_policy = \"{}\"\n"
      "[nvme]\npath = \"{{DIR}}/nvme.data\"\ncapacity_bytes = {}\n",
      kNamespace, kToken, host_bytes, o.shards, policy, nvme_bytes);
}

Result<nlohmann::json> DaemonStats(Client& c) {
  auto text = c.StatsJson();
  if (!text.ok()) return text.status();
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded()) return Status::Internal("stats: not JSON");
  return j;
}

double Number(const nlohmann::json& j,
              std::initializer_list<const char*> path) {
  const nlohmann::json* at = &j;
  for (const char* key : path) {
    if (!at->is_object() || !at->contains(key)) return 0;
    at = &(*at)[key];
  }
  return at->is_number() ? at->get<double>() : 0;
}

// Stores every segment of every page (write_through), retrying what meets
// write-back backpressure, then waits until all of it is on NVMe.
Status StoreContext(Client& c, const Workload& w) {
  uint64_t largest = 0;
  for (uint16_t l = 0; l < w.layout.num_layers(); ++l) {
    for (uint8_t p = 0; p < w.layout.layers[l].parts.size(); ++p) {
      largest = std::max(largest, w.layout.SegmentBytes(l, p));
    }
  }
  const std::vector<std::byte> data(largest, std::byte{0x6b});
  uint64_t segments = 0;
  for (uint32_t page = 0; page < w.pages; ++page) {
    std::vector<SegmentWrite> writes;
    for (uint16_t l = 0; l < w.layout.num_layers(); ++l) {
      for (uint8_t p = 0; p < w.layout.layers[l].parts.size(); ++p) {
        writes.push_back({SegmentKey{w.hashes[page], l, p},
                          std::span(data).first(w.layout.SegmentBytes(l, p))});
      }
    }
    segments += writes.size();
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!writes.empty()) {
      std::vector<SegmentWrite> retry;
      const auto results = c.Put(writes);
      for (size_t i = 0; i < writes.size(); ++i) {
        if (results[i].ok()) continue;
        if (results[i].status.code() != StatusCode::kBusy ||
            Clock::now() > deadline) {
          return Status::Internal(fmt::format("put of page {}: {}", page,
                                              results[i].status.ToString()));
        }
        retry.push_back(writes[i]);
      }
      writes = std::move(retry);
      if (!writes.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  }
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (true) {
    auto j = DaemonStats(c);
    if (!j.ok()) return j.status();
    if (Number(*j, {"host", "dirty_segments"}) == 0 &&
        Number(*j, {"nvme", "segments"}) >= static_cast<double>(segments)) {
      break;
    }
    if (Clock::now() > deadline) {
      return Status::Internal("write-through did not finish in 120 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::OK();
}

// Every segment now in DRAM. InvalidArgument when the tier holds more than
// one List returns.
Result<std::unordered_set<SegmentKey>> HostSegments(Client& c) {
  auto listed = c.List(kMaxListed);
  if (!listed.ok()) return listed.status();
  if (listed->size() >= kMaxListed) {
    return Status::InvalidArgument(fmt::format(
        "topk-daemon: DRAM holds {} segments or more, more than one List "
        "shows; use a shorter context",
        kMaxListed));
  }
  std::unordered_set<SegmentKey> out;
  out.reserve(listed->size() * 2);
  for (const Client::ListedSegment& s : *listed) out.insert(s.key);
  return out;
}

Result<PolicyFigures> RunPolicy(const TopkDaemonOptions& o, const Workload& w,
                                const std::string& policy,
                                uint64_t host_bytes) {
  testing::DaemonProcess daemon;
  TIERKV_RETURN_IF_ERROR(
      daemon.Start({.config_toml = DaemonConfig(o, w, policy, host_bytes)}));
  auto client = daemon.Connect(kNamespace, kToken);
  if (!client.ok()) return client.status();
  Client& c = **client;
  TIERKV_RETURN_IF_ERROR(c.RegisterLayout(w.layout));
  TIERKV_RETURN_IF_ERROR(StoreContext(c, w));
  auto before = DaemonStats(c);
  if (!before.ok()) return before.status();

  PolicyFigures r;
  r.policy = policy;
  const bool probe_match = o.probe == "match";
  std::vector<std::byte> scratch;
  std::unordered_map<uint64_t, uint32_t> counts;  // page << 16 | full index
  double engine = 0;
  auto timed = [&engine](auto&& call) {
    const auto t0 = Clock::now();
    auto result = call();
    engine += std::chrono::duration<double>(Clock::now() - t0).count();
    return result;
  };
  const auto wall_start = Clock::now();
  for (size_t s = 0; s < w.reads.size(); ++s) {
    const bool warm = static_cast<int64_t>(s) >= w.warmup_steps;
    for (size_t j = 0; j < w.groups.size(); ++j) {
      const auto& pages = w.reads[s][j];
      if (pages.empty()) continue;
      const std::vector<uint16_t>& group = w.groups[j];
      // What DRAM holds just before the read (observation only).
      auto host = HostSegments(c);
      if (!host.ok()) return host.status();
      for (const SegmentKey& key : *host) {
        if (w.layout.layers[key.layer].parts[key.part].name == "index_k") {
          r.index_key_bytes += w.layout.SegmentBytes(key.layer, key.part);
        }
      }
      r.probes++;
      std::vector<Tier> tiers;
      if (probe_match) {
        std::vector<PageHash> hashes;
        for (const auto& [page, tokens] : pages) {
          hashes.push_back(w.hashes[page]);
        }
        // A sparse reader's Get follows at once and promotes what it reads
        // (--prefetch none); group / all: what Match prefetches instead.
        MatchOptions match_options{.prefetch = o.prefetch != "none"};
        if (o.prefetch == "group") {
          match_options.prefetch_layers = {group.front(),
                                           static_cast<uint16_t>(group.size())};
        }
        auto m = timed([&] { return c.Match(hashes, match_options); });
        if (!m.ok()) return m.status();
        tiers = std::move(m->tiers);
      }
      for (size_t i = 0; i < pages.size(); ++i) {
        const uint32_t page = pages[i].first;
        uint32_t in_host = 0;
        for (uint16_t l : group) {
          in_host += host->contains(SegmentKey{w.hashes[page], l, 0});
        }
        bool whole_page = true;
        if (probe_match) {
          whole_page = tiers[i] == Tier::kHost;
        } else {
          for (uint16_t l = 0; whole_page && l < w.layout.num_layers(); ++l) {
            for (uint8_t p = 0; p < w.layout.layers[l].parts.size(); ++p) {
              whole_page = whole_page &&
                           host->contains(SegmentKey{w.hashes[page], l, p});
            }
          }
        }
        const bool group_host = in_host == group.size();
        r.reads++;
        r.group_host += group_host;
        r.page_host += whole_page;
        r.segments += group.size();
        r.segments_host += in_host;
        if (warm) {
          r.warm_reads++;
          r.warm_group_host += group_host;
          r.warm_page_host += whole_page;
        }
        counts[uint64_t{page} << 16 | j] += pages[i].second;
      }
      // One Get of the group's kv segments of every selected page.
      uint64_t bytes = 0;
      for (uint16_t l : group) bytes += w.layout.SegmentBytes(l, 0);
      bytes *= pages.size();
      if (scratch.size() < bytes) scratch.resize(bytes);
      std::vector<SegmentRead> reads;
      uint64_t offset = 0;
      for (uint16_t l : group) {
        const uint64_t seg = w.layout.SegmentBytes(l, 0);
        for (const auto& [page, tokens] : pages) {
          reads.push_back({SegmentKey{w.hashes[page], l, 0},
                           std::span(scratch).subspan(offset, seg)});
          offset += seg;
        }
      }
      const auto got = timed([&] { return c.Get(reads); });
      for (const Status& st : got) {
        if (st.ok()) continue;
        if (r.get_failures++ == 0) r.first_failure = st.ToString();
      }
    }
    if (o.report_every > 0 && (s + 1) % o.report_every == 0 &&
        !counts.empty()) {
      std::vector<SelectionReport> reports;
      reports.reserve(counts.size());
      for (const auto& [key, count] : counts) {
        reports.push_back(
            {w.hashes[key >> 16], w.full_layers[key & 0xffff], count});
      }
      counts.clear();
      const Status st = timed([&] { return c.ReportTopk(reports); });
      if (!st.ok()) return st;
      r.reports++;
    }
  }
  r.wall_seconds =
      std::chrono::duration<double>(Clock::now() - wall_start).count();
  r.engine_seconds = engine;
  auto after = DaemonStats(c);
  if (!after.ok()) return after.status();
  auto delta = [&](std::initializer_list<const char*> path) {
    return Number(*after, path) - Number(*before, path);
  };
  r.get_host = delta({"get_segments", "hit"});
  r.get_nvme = delta({"get_segments", "hit_nvme"});
  r.promoted_segments = delta({"transfers", "promoted", "segments"});
  r.promoted_bytes = delta({"transfers", "promoted", "bytes"});
  r.nvme_read_bytes = delta({"nvme", "read_bytes"});
  r.evictions = delta({"host", "evictions"});
  return r;
}

nlohmann::json PolicyJson(const PolicyFigures& r, size_t steps) {
  return {{"policy", r.policy},
          {"reads", r.reads},
          {"warm_reads", r.warm_reads},
          {"dram_share_group", r.Share(r.group_host, r.reads)},
          {"dram_share_group_warm", r.Share(r.warm_group_host, r.warm_reads)},
          {"dram_share_page", r.Share(r.page_host, r.reads)},
          {"dram_share_page_warm", r.Share(r.warm_page_host, r.warm_reads)},
          {"dram_share_segments", r.Share(r.segments_host, r.segments)},
          {"get_segments_host", r.get_host},
          {"get_segments_nvme", r.get_nvme},
          {"get_failures", r.get_failures},
          {"first_failure", r.first_failure},
          {"promoted_segments", r.promoted_segments},
          {"promoted_bytes", r.promoted_bytes},
          {"nvme_read_bytes", r.nvme_read_bytes},
          {"evictions", r.evictions},
          {"reports", r.reports},
          {"index_k_dram_bytes_mean",
           r.probes > 0 ? r.index_key_bytes / r.probes : 0.0},
          {"engine_seconds", r.engine_seconds},
          {"wall_seconds", r.wall_seconds},
          {"steps_per_second",
           r.engine_seconds > 0 ? steps / r.engine_seconds : 0}};
}

int Run(const TopkDaemonOptions& o) {
  if (!(o.host_fraction > 0 && o.host_fraction <= 1) || o.report_every < 0 ||
      !(o.warmup_fraction >= 0 && o.warmup_fraction < 1) || o.steps < 1) {
    fmt::print(stderr,
               "topk-daemon: --host-fraction must be in (0, 1], "
               "--warmup-fraction in [0, 1), --steps >= 1\n");
    return 2;
  }
  std::vector<Trace> traces;
  if (!o.trace_path.empty()) {
    auto t = ReadTrace(o.trace_path);
    if (!t.ok()) {
      fmt::print(stderr, "topk-daemon: {}\n", t.status().ToString());
      return 2;
    }
    traces.push_back(std::move(t).value());
  } else {
    for (double skew : o.skews) {
      auto t = SynthesizeTrace(o, skew);
      if (!t.ok()) {
        fmt::print(stderr, "topk-daemon: {}\n", t.status().ToString());
        return 2;
      }
      traces.push_back(std::move(t).value());
    }
  }
  std::vector<Trace> laid_out;
  for (const Trace& base : traces) {
    for (const std::string& layout : o.layouts) {
      Trace t = base;
      if (layout == "clustered") {
        ClusterPages(&t, TopkSynthOptions().recent_tokens, o.seed);
      }
      t.label = fmt::format("{}, {}", base.label, t.layout);
      laid_out.push_back(std::move(t));
    }
  }
  nlohmann::json out = nlohmann::json::array();
  bool failed = false;
  for (const Trace& t : laid_out) {
    auto w = BuildWorkload(o, t);
    if (!w.ok()) {
      fmt::print(stderr, "topk-daemon: {}\n", w.status().ToString());
      return 2;
    }
    const uint64_t basis_bytes =
        o.host_basis == "context" ? w->total_bytes
                                  : uint64_t{w->selected_pages} * w->page_bytes;
    const uint64_t host_bytes =
        static_cast<uint64_t>(o.host_fraction *
                              static_cast<double>(basis_bytes)) &
        ~uint64_t{4095};
    const TraceFigures f = MeasureTrace(*w, host_bytes);
    const double host_pages =
        static_cast<double>(host_bytes) / static_cast<double>(w->page_bytes);
    std::vector<std::string> group_text;
    for (size_t j = 0; j < w->groups.size(); ++j) {
      group_text.push_back(
          fmt::format("{}:{}", w->full_layers[j], w->groups[j].size()));
    }
    fmt::print(
        "topk-daemon [{}]: shape {} ({} layers; full layer:group size {}), "
        "k {}, {} KV (segments: kv {} B, index_k {} B); context {} -> {} "
        "tokens = {} pages, {:.1f} MB; {} steps (warm-up {}); write_through "
        "to NVMe; ReportTopk every {} steps; probe {}, prefetch {}\n",
        t.label, o.shape, w->layout.num_layers(), fmt::join(group_text, " "),
        t.header.k, o.kv_dtype, w->layout.SegmentBytes(0, 0),
        w->layout.SegmentBytes(0, 1), w->first_context, w->last_context,
        w->pages, w->total_bytes / 1e6, t.steps.size(), w->warmup_steps,
        o.report_every, o.probe, o.prefetch);
    fmt::print(
        "  trace: selects {} pages = {:.1f}% of the context at least once "
        "(the working set{}); {} selected-page reads\n"
        "  host tier {:.1f} MB = {:.1f} pages = {:.1f}% of the context, "
        "{:.1f}% of the working set\n"
        "  bound (static): the {} pages read most serve {:.1f}% of the reads "
        "({:.1f}% after warm-up); (page, group) units by reads per byte "
        "within the host bytes {:.1f}% ({:.1f}%)\n",
        w->selected_pages, f.selected_fraction,
        f.selected_fraction >= 100 ? " = the whole context" : "", f.reads,
        host_bytes / 1e6, host_pages, 100.0 * host_pages / w->pages,
        w->selected_pages > 0 ? 100.0 * host_pages / w->selected_pages : 0.0,
        static_cast<uint64_t>(host_pages), f.page_bound, f.warm_page_bound,
        f.group_bound, f.warm_group_bound);
    fmt::print(
        "  {:<7} {:>7} {:>7} | {:>7} {:>7} | {:>6} | {:>9} {:>9} "
        "{:>8} {:>9} {:>9} {:>7} {:>6} {:>7} {:>5}\n",
        "policy", "DRAM %", "warm %", "page %", "warm %", "seg %", "get host",
        "get nvme", "promoted", "prom. MB", "NVMe rd MB", "evicted", "idx %",
        "steps/s", "fails");
    nlohmann::json runs = nlohmann::json::array();
    for (const std::string& policy : o.policies) {
      auto r = RunPolicy(o, *w, policy, host_bytes);
      if (!r.ok()) {
        fmt::print(stderr, "topk-daemon: {} ({}): {}\n", policy, t.label,
                   r.status().ToString());
        return 1;
      }
      failed = failed || r->get_failures > 0;
      fmt::print(
          "  {:<7} {:>7.1f} {:>7.1f} | {:>7.1f} {:>7.1f} | {:>6.1f} | "
          "{:>9.0f} {:>9.0f} {:>8.0f} {:>9.1f} {:>10.1f} {:>7.0f} {:>6.1f} "
          "{:>7.1f} {:>5}\n",
          policy, r->Share(r->group_host, r->reads),
          r->Share(r->warm_group_host, r->warm_reads),
          r->Share(r->page_host, r->reads),
          r->Share(r->warm_page_host, r->warm_reads),
          r->Share(r->segments_host, r->segments), r->get_host, r->get_nvme,
          r->promoted_segments, r->promoted_bytes / 1e6,
          r->nvme_read_bytes / 1e6, r->evictions,
          r->probes > 0 ? 100.0 * r->index_key_bytes / r->probes /
                              static_cast<double>(host_bytes)
                        : 0.0,
          r->engine_seconds > 0 ? t.steps.size() / r->engine_seconds : 0.0,
          r->get_failures);
      if (r->get_failures > 0) {
        fmt::print("          {} Get items failed; the first: {}\n",
                   r->get_failures, r->first_failure);
      }
      runs.push_back(PolicyJson(*r, t.steps.size()));
    }
    out.push_back({{"trace", t.label},
                   {"importance_exponent", t.skew},
                   {"layout", t.layout},
                   {"shape", o.shape},
                   {"kv_dtype", o.kv_dtype},
                   {"k", t.header.k},
                   {"steps", t.steps.size()},
                   {"warmup_steps", w->warmup_steps},
                   {"context_tokens", {w->first_context, w->last_context}},
                   {"pages", w->pages},
                   {"context_bytes", w->total_bytes},
                   {"host_bytes", host_bytes},
                   {"host_basis", o.host_basis},
                   {"selected_pages", w->selected_pages},
                   {"report_every", o.report_every},
                   {"probe", o.probe},
                   {"prefetch", o.prefetch},
                   {"selected_fraction", f.selected_fraction},
                   {"reads", f.reads},
                   {"bound_pages", f.page_bound},
                   {"bound_pages_warm", f.warm_page_bound},
                   {"bound_groups", f.group_bound},
                   {"bound_groups_warm", f.warm_group_bound},
                   {"policies", runs}});
  }
  fmt::print(
      "  DRAM % = selected-page reads (step, full layer, page) whose group's "
      "kv segments were all in DRAM just before the read (Client::List), "
      "all steps / after warm-up; page % = every segment of the page, all "
      "layers and parts, in DRAM (Match's answer; with --probe list from the "
      "List, where index_k segments, never read, do not come back); seg % = "
      "kv "
      "segments read that were in DRAM; get host/nvme, promoted (segments, "
      "MB), NVMe rd MB, evicted = the daemon's counters over the replay; "
      "idx % = index_k bytes in DRAM (mean over the probes) / host bytes; "
      "steps/s = steps over the time in Match + Get + ReportTopk; fails = "
      "Get items not OK\n");
  if (!o.json_path.empty()) std::ofstream(o.json_path) << out.dump(2) << "\n";
  return failed ? 1 : 0;
}

const bool kRegistered = RegisterBench([](CLI::App& app) {
  auto o = std::make_shared<TopkDaemonOptions>();
  auto* sub = app.add_subcommand(
      "topk-daemon",
      "tierkvd's topk eviction policy vs lru under a decode-heavy sparse "
      "attention workload (host tier = 1/4 of the context)");
  sub->add_option("--trace", o->trace_path,
                  "a top-k trace (executor/topk_trace.h) instead of "
                  "synthetic ones; --skews then does not apply")
      ->type_name("FILE");
  sub->add_option("--shape", o->shape,
                  "model shape: layers, full layers, k and row sizes")
      ->check(CLI::IsMember({"glm5-small", "glm5.2"}))
      ->capture_default_str();
  sub->add_option("--context", o->context,
                  "synthetic: tokens at the first step")
      ->capture_default_str();
  sub->add_option("--steps", o->steps, "synthetic: decode steps")
      ->capture_default_str();
  sub->add_option("--skews", o->skews,
                  "synthetic: Zipf exponents of the token importance")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--layouts", o->layouts,
                  "scattered: token positions as the trace has them; "
                  "clustered: the prompt relabeled so that tokens selected "
                  "about as often share pages")
      ->delimiter(',')
      ->check(CLI::IsMember({"scattered", "clustered"}))
      ->capture_default_str();
  sub->add_option("--overlap", o->overlap,
                  "synthetic: consecutive-step overlap of the middle layers")
      ->capture_default_str();
  sub->add_option("--seed", o->seed)->capture_default_str();
  sub->add_option("--policies", o->policies, "lru, 2q, s3fifo, topk")
      ->delimiter(',')
      ->check(CLI::IsMember({"lru", "2q", "s3fifo", "topk"}))
      ->capture_default_str();
  sub->add_option("--kv-dtype", o->kv_dtype, "fp8 | bf16 | fp32")
      ->check(CLI::IsMember({"fp8", "bf16", "fp32"}))
      ->capture_default_str();
  sub->add_option("--host-fraction", o->host_fraction,
                  "host tier bytes as a share of the context's KV bytes")
      ->capture_default_str();
  sub->add_option("--host-basis", o->host_basis,
                  "context: --host-fraction of the context's KV bytes; "
                  "working-set: of the bytes of the pages the trace selects")
      ->check(CLI::IsMember({"context", "working-set"}))
      ->capture_default_str();
  sub->add_option("--report-every", o->report_every,
                  "steps between ReportTopk calls (0: none)")
      ->capture_default_str();
  sub->add_option("--warmup-fraction", o->warmup_fraction,
                  "leading share of the steps left out of the warm figures")
      ->capture_default_str();
  sub->add_option("--probe", o->probe,
                  "match: Match each read's pages first (the daemon touches "
                  "them and prefetches their NVMe segments); list: no Match")
      ->check(CLI::IsMember({"match", "list"}))
      ->capture_default_str();
  sub->add_option("--prefetch", o->prefetch,
                  "with --probe match, what Match prefetches from NVMe: none "
                  "(a sparse reader: its Get promotes what it reads), group "
                  "(the read's layer group), all (every layer, as a prefix "
                  "lookup)")
      ->check(CLI::IsMember({"none", "group", "all"}))
      ->capture_default_str();
  sub->add_option("--shards", o->shards, "host tier shards")
      ->capture_default_str();
  sub->add_option("--json", o->json_path, "write the figures as JSON");
  sub->callback([o] { SetExitCode(Run(*o)); });
});

}  // namespace
}  // namespace tierkv::bench
