// RunSessions: multi-turn chat sessions through a TierKvCache, the
// executor's end-to-end use of tierkvd (`tierkv-run serve-sessions`).
//
// S sessions share a system prompt; turn t of a session appends user tokens
// to its history (system prompt, earlier user turns and replies) and
// generates a reply, so turn t + 1's prompt extends turn t's. Turns run
// round-robin over the sessions (turn 0 of every session, then turn 1, ...),
// so sessions compete for the daemon's DRAM as an engine's requests do.
// Every turn starts from an empty cache, as a request whose KV was dropped
// from GPU memory: what it does not prefill comes from tierkvd.
//
// With `check`, every turn is also run on the in-process cache and its
// logits (prompt's last position and every decode step) compared for exact
// float equality.
//
// Thread safety: one call at a time per Model.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "executor/model.h"
#include "executor/tier_kv_cache.h"
#include "tierkv/status.h"

namespace tierkv::executor {

struct SessionsOptions {
  int sessions = 3;                  // Default: 3
  int turns = 3;                     // Default: 3
  int64_t system_tokens = 256;       // shared by every session. Default: 256
  int64_t user_tokens = 64;          // per turn. Default: 64
  int64_t reply_tokens = 16;         // generated per turn (greedy). Default: 16
  uint64_t seed = 1;                 // of the token ids. Default: 1
  bool check = true;                 // compare with the in-process cache
  KvDtype kv_dtype = KvDtype::kF32;  // both caches' row format
};

struct TurnReport {
  int session = 0;
  int turn = 0;
  int64_t prompt_tokens = 0;
  int64_t loaded_tokens = 0;      // served by tierkvd
  int64_t prefilled_tokens = 0;   // computed (includes recomputed)
  int64_t recomputed_tokens = 0;  // matched but not arrived
  int64_t pages_hbm = 0, pages_host = 0, pages_nvme = 0;
  double ttft_seconds = 0;  // prefix load + suffix prefill + first logits
  double decode_tokens_per_second = 0;
  uint64_t bytes_loaded = 0;
  uint64_t bytes_stored = 0;
  bool degraded = false;          // the daemon was not used
  bool checked = false;           // compared with the in-process run
  bool logits_identical = false;  // when checked
};

// Runs the sessions; `on_turn` is told each turn as it ends. Returns the
// model's and the cache's errors (a degraded cache is not an error).
Result<std::vector<TurnReport>> RunSessions(
    Model& model, const TierKvCacheOptions& cache_options,
    const SessionsOptions& options,
    const std::function<void(const TurnReport&)>& on_turn = {});

}  // namespace tierkv::executor
