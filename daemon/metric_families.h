// Helpers that build prometheus-cpp MetricFamily values at scrape time from
// counters storage keeps itself (the Collectables in nvme_metrics.h and
// transfer_metrics.h), so exported values never drift from storage's own.
#pragma once

#include <prometheus/metric_family.h>

#include <optional>
#include <string>
#include <vector>

#include "common/latency_histogram.h"

namespace tierkv::daemon {

prometheus::MetricFamily Family(std::string name, std::string help,
                                prometheus::MetricType type);

// Appends one sample (a counter or gauge value, by f.type).
void AddValue(prometheus::MetricFamily& f,
              std::vector<prometheus::ClientMetric::Label> labels, double v);

// Appends a histogram sample from LatencyHistogram counts: the buckets'
// upper bounds become `le` (seconds). `sum_seconds` is the exact sum when
// storage keeps one; without it the sum is estimated from bucket midpoints.
void AddHistogram(prometheus::MetricFamily& f,
                  std::vector<prometheus::ClientMetric::Label> labels,
                  const LatencyHistogram::Counts& counts,
                  std::optional<double> sum_seconds = std::nullopt);

// The upper bounds (seconds) of LatencyHistogram's finite buckets, for a
// prometheus::Histogram that merges LatencyHistogram counts (the last,
// open-ended bucket is +Inf).
std::vector<double> LatencyBucketBoundaries();

}  // namespace tierkv::daemon
