#include "daemon/metric_families.h"

#include <limits>

namespace tierkv::daemon {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  return MetricFamily{std::move(name), std::move(help), type, {}};
}

void AddValue(MetricFamily& f, std::vector<ClientMetric::Label> labels,
              double v) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f.type == MetricType::Counter) {
    m.counter.value = v;
  } else {
    m.gauge.value = v;
  }
  f.metric.push_back(std::move(m));
}

void AddHistogram(MetricFamily& f, std::vector<ClientMetric::Label> labels,
                  const LatencyHistogram::Counts& counts,
                  std::optional<double> sum_seconds) {
  ClientMetric m;
  m.label = std::move(labels);
  uint64_t cumulative = 0;
  double sum_estimate = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    const uint64_t upper = LatencyHistogram::BucketUpperBoundMicros(i);
    const double mid =
        i == 0 ? 0.5e-6 : 1.5e-6 * static_cast<double>(uint64_t{1} << (i - 1));
    sum_estimate += static_cast<double>(counts[i]) * mid;
    if (upper == UINT64_MAX) break;  // +Inf is implied by sample_count
    m.histogram.bucket.push_back(
        {cumulative, static_cast<double>(upper) * 1e-6});
  }
  m.histogram.bucket.push_back(
      {cumulative, std::numeric_limits<double>::infinity()});
  m.histogram.sample_count = cumulative;
  m.histogram.sample_sum = sum_seconds.value_or(sum_estimate);
  f.metric.push_back(std::move(m));
}

std::vector<double> LatencyBucketBoundaries() {
  std::vector<double> out;
  for (size_t i = 0; i + 1 < LatencyHistogram::kBuckets; ++i) {
    out.push_back(
        static_cast<double>(LatencyHistogram::BucketUpperBoundMicros(i)) *
        1e-6);
  }
  return out;
}

}  // namespace tierkv::daemon
