// ParseUcxPerftestCsv: reads the final figures `ucx_perftest -f -v` prints
// (UCX 1.13), so that tierkv-bench can put UCX's own numbers beside the
// peer transport's in the same run (bench/peer_bench.cc).
#pragma once

#include <cstdint>
#include <string_view>

#include "tierkv/status.h"

namespace tierkv::bench {

// One ucx_perftest run's final line, in ucx_perftest's units. For ping-pong
// tests (*_lat) ucx_perftest reports half the round trip as latency and
// counts both directions' bytes in bandwidth (libperf.c
// ucx_perf_calc_result: factor 2); for one-way tests (*_bw) latency is the
// time per message.
struct UcxPerftestResult {
  uint64_t iterations = 0;
  // The -R rank the first latency column is for (50 by default), and that
  // percentile of the latency, in microseconds, over the last samples
  // ucx_perftest keeps (a window of the run, not the whole run).
  double percentile_rank = 0;
  double percentile_latency_us = 0;
  double average_latency_us = 0;  // "avg_lat": the last reporting interval
  double overall_latency_us = 0;  // "overall_lat": the whole run
  // "MB/s" in ucx_perftest's table, which are MiB/s (2^20 bytes/s).
  double average_bandwidth_mib_s = 0;
  double overall_bandwidth_mib_s = 0;
  double average_message_rate = 0;  // messages per second
  double overall_message_rate = 0;

  // overall_bandwidth_mib_s in GB/s (10^9 bytes/s), the unit tierkv-bench
  // reports in.
  double OverallGBps() const { return overall_bandwidth_mib_s * 1048576 / 1e9; }
};

// Parses the output of `ucx_perftest ... -f -v` (client side): the CSV header
// "iterations,<rank>_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,
// avg_mr,overall_mr" followed by one line of values. UCX log lines (warnings)
// around them are skipped; when several header/value pairs appear, the last
// is returned. InvalidArgument, quoting the output, when no complete header
// and value line are found or a value is not a number.
Result<UcxPerftestResult> ParseUcxPerftestCsv(std::string_view output);

}  // namespace tierkv::bench
