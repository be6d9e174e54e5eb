// Order statistics of benchmark samples (latencies, durations).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace tierkv::bench {

// The p-quantile (0 <= p <= 1) of `v`, nearest rank; 0 for no samples.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// The upper median of `v`; 0 for no samples.
inline double Median(std::vector<double> v) {
  return Percentile(std::move(v), 0.5);
}

}  // namespace tierkv::bench
