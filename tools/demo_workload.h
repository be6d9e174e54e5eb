// The demo workload behind `tierkv demo` (README quick start): simulated
// chat sessions that share a long system prompt, run over two turns through
// the real client library, showing what was stored, deduplicated, evicted
// and hit.
#pragma once

#include <cstdint>

#include "tierkv/client.h"

namespace tierkv::tools {

struct DemoOptions {
  uint32_t sessions = 24;
  uint32_t shared_prefix_tokens = 8192;  // the common system prompt
  uint32_t session_tokens = 4096;        // each session's own history
  uint32_t turn_tokens = 1024;           // appended in turn 2
  uint32_t layers = 8;                   // GLM-5-like: kv everywhere, index_k
                                         // on every 4th layer (IndexShare)
};

// Runs the workload on an opened namespace; prints a report to stdout.
// Returns the first error, or Corruption if any read-back differs.
Status RunDemo(Client& client, const DemoOptions& options);

}  // namespace tierkv::tools
