// The workload behind `tierkv soak` (scripts/soak.sh): many clients of one
// namespace running a random mix of Put, Get (verified byte for byte),
// zero-copy leases, Match, Flush and reconnects over a shared working set,
// for a given time. It reports every operation and every error; the script
// checks that the daemon's leases, fds and RSS return to their baseline.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::tools {

struct SoakOptions {
  std::string socket;
  std::string ns = "default";
  std::string token;
  uint32_t clients = 64;
  std::chrono::seconds duration{600};
  // Pages shared by every client; each is one segment of segment_bytes.
  uint32_t pages = 4096;
  uint32_t segment_bytes = 64 << 10;
  uint32_t batch = 8;  // segments per request
  bool flush = true;   // include Flush (needs an NVMe tier)
  uint64_t seed = 1;
};

struct SoakReport {
  double seconds = 0;
  uint64_t ops = 0;
  // Per operation: how many ran; Busy answers (another client was writing
  // the same segment, or the daemon asked to retry) are counted apart and
  // are not errors.
  std::map<std::string, uint64_t> by_op;
  uint64_t busy = 0;
  uint64_t misses = 0;  // Gets of segments evicted or not yet stored
  uint64_t errors = 0;  // anything else, including a byte mismatch
  std::vector<std::string> first_errors;  // up to 10
};

// Runs the workload; an error only when no client could connect at all.
Result<SoakReport> RunSoak(const SoakOptions& options);

}  // namespace tierkv::tools
