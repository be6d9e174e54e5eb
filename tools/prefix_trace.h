// A prefix-cache request trace in Mooncake's format (kvcache-ai/Mooncake,
// FAST'25 traces): one JSON object per line,
//
//   {"timestamp": ms, "input_length": tokens, "output_length": tokens,
//    "hash_ids": [block ids]}
//
// where hash_ids name the request's prompt in 512-token blocks: equal ids at
// the same position are a shared prefix, and the ids are already
// chain-consistent (an id determines its whole prefix), so they are used as
// block names directly. The last block may be partial (input_length is
// exact). Other keys are ignored. What the replay and the simulators count
// is in tools/prefix_hit_rules.h.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <string_view>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::tools {

// Tokens per trace block (fixed by the Mooncake trace format).
inline constexpr uint64_t kTraceBlockTokens = 512;

// One request of a trace, as read.
struct TraceRequest {
  uint64_t timestamp_ms = 0;  // arrival, from the trace's start
  uint64_t input_length = 0;  // prompt tokens; >= 1
  uint64_t output_length = 0;
  // Block ids of the prompt, one per 512 tokens, the last possibly partial.
  // Holds at least the request's cacheable blocks (prefix_hit_rules.h).
  std::vector<uint64_t> hash_ids;
};

// Reads the trace at `path`. Blank lines are skipped. Errors:
// NotFound when the file cannot be opened; InvalidArgument naming
// "path:line" and the field for a line that is not a JSON object, a missing
// or mistyped field (timestamp, input_length and output_length must be
// non-negative integers, hash_ids an array of them), input_length 0, or
// fewer hash_ids than the request's cacheable blocks; InvalidArgument when
// the file holds no request.
Result<std::vector<TraceRequest>> LoadPrefixTrace(const std::string& path);

// As LoadPrefixTrace, from a stream; `name` stands for the path in errors.
Result<std::vector<TraceRequest>> ParsePrefixTrace(std::istream& in,
                                                   std::string_view name);

}  // namespace tierkv::tools
