// RunUcxPerftest: one ucx_perftest measurement (a server and a client
// process on loopback), the physical peer tierkv-bench peer compares the
// peer transport with in the same run (scaleout.md §11).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/ucx_perftest_output.h"
#include "tierkv/status.h"

namespace tierkv::bench {

struct UcxPerftestSpec {
  std::string binary = "/usr/bin/ucx_perftest";
  std::string test;  // -t: ucp_am_bw, ucp_am_lat, tag_bw, tag_lat, ...
  // -s: one size, or several for an IOV message of those pieces.
  std::vector<uint64_t> sizes;
  bool iov = false;            // -D iov,iov (with several sizes)
  uint64_t iterations = 1000;  // -n
  uint64_t warmup = 16;        // -w
  double percentile = 50;      // -R, for latency tests
  // -E: "poll" (ucx_perftest's default: both sides spin in
  // ucp_worker_progress) or "sleep" (they wait for events, as the peer
  // transport does).
  std::string wait_mode = "poll";
  // The whole run (start-up included) is killed after this long.
  std::chrono::seconds timeout{60};
};

// Starts `ucx_perftest -p PORT` (the server) on a free port, waits until it
// listens, runs `ucx_perftest 127.0.0.1 -p PORT ... -f -v` (the client) and
// parses the client's summary. Both inherit this process's environment
// (UCX_TLS). Both are reaped before it returns; on a timeout or failure
// they are killed, and the pair is run once more on a new port (the
// failure is printed to stderr). IOError naming the command and quoting its
// output when the second run fails or times out too.
Result<UcxPerftestResult> RunUcxPerftest(const UcxPerftestSpec& spec);

// True when `binary` exists and is executable.
bool UcxPerftestAvailable(const std::string& binary);

}  // namespace tierkv::bench
