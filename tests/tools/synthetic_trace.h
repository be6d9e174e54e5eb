// Synthetic prefix traces for the tools/ tests: chat sessions that share a
// few system prompts and grow over several turns, interleaved at random.
// The ids are chain-consistent like Mooncake's (an id names its whole
// prefix) and every prompt ends in a partial block with an id of its own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "tools/prefix_trace.h"

namespace tierkv::tools::testing {

struct SyntheticTraceOptions {
  uint32_t system_prompts = 4;
  uint32_t max_system_prompt_blocks = 12;  // each has 2..this many
  uint32_t sessions = 80;
  uint32_t max_turns = 6;        // each session has 1..this many requests
  uint32_t max_turn_blocks = 4;  // full blocks a turn adds: 1..this many
  uint64_t seed = 1;
};

inline std::vector<TraceRequest> MultiTurnTrace(
    const SyntheticTraceOptions& o) {
  std::mt19937_64 rng(o.seed);
  auto uniform = [&](uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
  };
  uint64_t next_id = 0;
  std::vector<std::vector<uint64_t>> system_prompts(o.system_prompts);
  for (auto& prompt : system_prompts) {
    prompt.resize(uniform(2, std::max(2u, o.max_system_prompt_blocks)));
    for (uint64_t& id : prompt) id = next_id++;
  }
  // A session's full blocks so far; its turns, in a random interleaving.
  std::vector<std::vector<uint64_t>> history(o.sessions);
  std::vector<uint32_t> turns;
  for (uint32_t s = 0; s < o.sessions; ++s) {
    // Skewed: low-numbered system prompts are shared by more sessions.
    const uint32_t a = uniform(0, o.system_prompts - 1);
    const uint32_t b = uniform(0, o.system_prompts - 1);
    history[s] = system_prompts[std::min(a, b)];
    for (uint32_t t = uniform(1, o.max_turns); t > 0; --t) turns.push_back(s);
  }
  std::shuffle(turns.begin(), turns.end(), rng);
  std::vector<TraceRequest> trace;
  for (uint32_t s : turns) {
    for (uint32_t n = uniform(1, o.max_turn_blocks); n > 0; --n) {
      history[s].push_back(next_id++);
    }
    TraceRequest r;
    r.timestamp_ms = 10 * trace.size();
    r.input_length = history[s].size() * kTraceBlockTokens + uniform(1, 512);
    r.output_length = uniform(1, 200);
    r.hash_ids = history[s];
    r.hash_ids.push_back(next_id++);  // the partial (or last) block
    trace.push_back(std::move(r));
  }
  return trace;
}

// A request whose prompt is exactly `ids.size()` full blocks plus one token,
// so every id in `ids` is cacheable; the partial block gets id 1000 + i.
inline std::vector<TraceRequest> FullBlockRequests(
    const std::vector<std::vector<uint64_t>>& prompts) {
  std::vector<TraceRequest> out;
  for (const auto& ids : prompts) {
    TraceRequest r{.input_length = ids.size() * kTraceBlockTokens + 1,
                   .hash_ids = ids};
    r.hash_ids.push_back(1000 + out.size());
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace tierkv::tools::testing
