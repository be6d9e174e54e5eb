#include "tools/demo_workload.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "tierkv/page_hash.h"

namespace tierkv::tools {
namespace {

constexpr uint32_t kPageTokens = 64;

LayoutSpec DemoLayout(uint32_t layers) {
  LayoutSpec layout;
  layout.page_tokens = kPageTokens;
  for (uint32_t l = 0; l < layers; ++l) {
    LayerSpec layer;
    layer.parts.push_back({"kv", 1152});  // bf16 MLA latent (512 + 64) * 2
    if (l % 4 == 0) layer.parts.push_back({"index_k", 132});  // FP8 + scale
    layout.layers.push_back(layer);
  }
  return layout;
}

// Deterministic bytes for a segment, so reads can be checked.
void FillSegment(const SegmentKey& key, std::span<std::byte> out) {
  uint64_t x = key.page.lo ^ (uint64_t{key.layer} << 32) ^ key.part;
  for (size_t i = 0; i + 8 <= out.size(); i += 8) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    std::memcpy(out.data() + i, &x, 8);
  }
}

struct TurnReport {
  uint64_t pages = 0, matched_pages = 0, stored = 0, deduped = 0, failed = 0;
  uint64_t read_back = 0, mismatches = 0;
};

// The first half of a request: match its pages and read back the hit.
// Returns the number of leading pages found.
Result<uint32_t> Lookup(Client& client, const LayoutSpec& layout,
                        const std::vector<PageHash>& pages,
                        TurnReport& report) {
  auto match = client.Match(pages);
  if (!match.ok()) return match.status();
  report.pages += pages.size();
  report.matched_pages += match->leading_pages;

  std::vector<std::vector<std::byte>> buffers;
  std::vector<SegmentRead> reads;
  std::vector<SegmentKey> read_keys;
  for (uint32_t p = 0; p < match->leading_pages; ++p) {
    for (uint16_t l = 0; l < layout.num_layers(); ++l) {
      for (uint8_t part = 0; part < layout.layers[l].parts.size(); ++part) {
        SegmentKey key{pages[p], l, part};
        buffers.emplace_back(layout.SegmentBytes(l, part));
        read_keys.push_back(key);
      }
    }
  }
  for (size_t i = 0; i < buffers.size(); ++i)
    reads.push_back({read_keys[i], buffers[i]});
  auto got = client.Get(reads);
  std::vector<std::byte> expected;
  for (size_t i = 0; i < reads.size(); ++i) {
    if (!got[i].ok()) continue;  // evicted between Match and Get
    expected.resize(buffers[i].size());
    FillSegment(read_keys[i], expected);
    report.read_back++;
    if (expected != buffers[i]) report.mismatches++;
  }
  return match->leading_pages;
}

// The second half: store the pages the engine had to prefill.
void Store(Client& client, const LayoutSpec& layout,
           const std::vector<PageHash>& pages, uint32_t from_page,
           TurnReport& report) {
  std::vector<std::vector<std::byte>> buffers;
  std::vector<SegmentWrite> writes;
  std::vector<SegmentKey> write_keys;
  for (size_t p = from_page; p < pages.size(); ++p) {
    for (uint16_t l = 0; l < layout.num_layers(); ++l) {
      for (uint8_t part = 0; part < layout.layers[l].parts.size(); ++part) {
        SegmentKey key{pages[p], l, part};
        buffers.emplace_back(layout.SegmentBytes(l, part));
        FillSegment(key, buffers.back());
        write_keys.push_back(key);
      }
    }
  }
  for (size_t i = 0; i < buffers.size(); ++i)
    writes.push_back({write_keys[i], buffers[i]});
  for (const PutResult& r : client.Put(writes)) {
    if (!r.ok())
      report.failed++;
    else if (r.already_stored)
      report.deduped++;
    else
      report.stored++;
  }
}

std::vector<uint32_t> SessionTokens(const DemoOptions& o, uint32_t session,
                                    uint32_t extra) {
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < o.shared_prefix_tokens; ++i)
    tokens.push_back(i % 50000);
  const uint32_t own = o.session_tokens + extra;
  for (uint32_t i = 0; i < own; ++i)
    tokens.push_back(100000 + session * 7919 + i);
  return tokens;
}

}  // namespace

Status RunDemo(Client& client, const DemoOptions& o) {
  const LayoutSpec layout = DemoLayout(o.layers);
  TIERKV_RETURN_IF_ERROR(client.RegisterLayout(layout));
  uint64_t page_bytes = 0;
  for (uint16_t l = 0; l < layout.num_layers(); ++l)
    for (uint8_t p = 0; p < layout.layers[l].parts.size(); ++p)
      page_bytes += layout.SegmentBytes(l, p);
  fmt::print(
      "tierkv demo: {} sessions share a {}-token system prompt; each has "
      "{} tokens of its own\n",
      o.sessions, o.shared_prefix_tokens, o.session_tokens);
  fmt::print(
      "layout: {} layers, {}-token pages, {:.1f} KiB of KV per page "
      "(kv 1152 B/token; index_k 132 B/token on every 4th layer)\n\n",
      o.layers, kPageTokens, page_bytes / 1024.0);
  fmt::print("{:<6} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>9}\n", "turn",
             "pages", "hit", "hit_rate", "stored", "dedup", "failed",
             "read_ok");
  const auto start = std::chrono::steady_clock::now();
  uint64_t mismatches = 0;
  for (uint32_t turn = 1; turn <= 2; ++turn) {
    // Turn 1: every session arrives before any has been stored (a burst),
    // so all of them prefill the shared prompt and dedup stores it once.
    // Turn 2: each session comes back with more tokens and hits its history.
    TurnReport r;
    std::vector<std::vector<PageHash>> pages(o.sessions);
    std::vector<uint32_t> hit(o.sessions);
    for (uint32_t s = 0; s < o.sessions; ++s) {
      pages[s] = PageHashChain(
          RootPageHash("default"),
          SessionTokens(o, s, turn == 2 ? o.turn_tokens : 0), kPageTokens);
      if (turn == 1) {
        auto found = Lookup(client, layout, pages[s], r);
        if (!found.ok()) return found.status();
        hit[s] = *found;
      }
    }
    for (uint32_t s = 0; s < o.sessions; ++s) {
      if (turn == 2) {
        auto found = Lookup(client, layout, pages[s], r);
        if (!found.ok()) return found.status();
        hit[s] = *found;
      }
      Store(client, layout, pages[s], hit[s], r);
    }
    mismatches += r.mismatches;
    fmt::print("{:<6} {:>8} {:>8} {:>8.1f}% {:>8} {:>8} {:>8} {:>9}\n", turn,
               r.pages, r.matched_pages,
               100.0 * r.matched_pages / std::max<uint64_t>(1, r.pages),
               r.stored, r.deduped, r.failed, r.read_back - r.mismatches);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  auto stats_json = client.StatsJson();
  if (!stats_json.ok()) return stats_json.status();
  auto j = nlohmann::json::parse(*stats_json);
  const auto& host = j["host"];
  fmt::print("\ndaemon after {:.2f} s:\n", secs);
  fmt::print("  stored     {} segments, {:.1f} MiB of {:.1f} MiB host DRAM\n",
             host["segments"].get<uint64_t>(),
             host["used_bytes"].get<uint64_t>() / 1048576.0,
             host["capacity_bytes"].get<uint64_t>() / 1048576.0);
  fmt::print("  dedup      {} puts of already-stored segments copied nothing\n",
             host["dedup_hits"].get<uint64_t>());
  fmt::print(
      "  evicted    {} segments ({:.1f} MiB), least recently used first\n",
      host["evictions"].get<uint64_t>(),
      host["evicted_bytes"].get<uint64_t>() / 1048576.0);
  const double hit = j["lookup_tokens"]["host"].get<double>();
  const double hit_nvme = j["lookup_tokens"].value("nvme", 0.0);
  const double total =
      hit + hit_nvme + j["lookup_tokens"]["miss"].get<double>();
  fmt::print(
      "  hit        {:.0f} of {:.0f} looked-up tokens ({:.1f}%) served from "
      "host "
      "DRAM\n",
      hit, total, 100.0 * hit / std::max(1.0, total));
  if (j.contains("nvme")) {
    fmt::print(
        "             {:.0f} more ({:.1f}%) from NVMe; {} segments demoted, {} "
        "promoted\n",
        hit_nvme, 100.0 * hit_nvme / std::max(1.0, total),
        j["nvme"]["demotions_done"].get<uint64_t>(),
        j["nvme"]["promotions_done"].get<uint64_t>());
  }
  fmt::print("  verified   {} read-back mismatches\n", mismatches);
  if (mismatches) return Status::Corruption("demo read back wrong bytes");
  return Status::OK();
}

}  // namespace tierkv::tools
