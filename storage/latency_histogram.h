// storage::LatencyHistogram: the shared log2 latency histogram
// (common/latency_histogram.h) under its storage name, for the device stats.
#pragma once

#include "common/latency_histogram.h"

namespace tierkv::storage {

using LatencyHistogram = ::tierkv::LatencyHistogram;

}  // namespace tierkv::storage
