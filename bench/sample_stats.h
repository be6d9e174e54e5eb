// Order statistics of benchmark samples (latencies, durations), the one
// definition every tierkv-bench subcommand reports with.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace tierkv::bench {

// The p-quantile (0 <= p <= 1) of `v`, nearest rank (the sample at index
// floor(p * n) of the sorted n, the last for p = 1); 0 for no samples. For
// tails (p99); a benchmark's p50 is Median().
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// The median of `v`: the middle sample, or the mean of the middle two for
// an even count; 0 for no samples. This is the textbook median, kept over
// the upper median (Percentile(v, 0.5)) that some benches used: the two
// agree for odd counts (the defaults --iterations 5, --repeat 3), but for an
// even one the upper median is biased to the larger of the middle two
// (with the 2 cold Loads `load` times by default: the slower one).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return (lower + upper) / 2;
}

}  // namespace tierkv::bench
