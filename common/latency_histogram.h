// LatencyHistogram: lock-free log2 buckets of latency for metrics export
// (NVMe IO, Load/Store transfers, and the client's WaitLayer waits, which
// travel to the daemon as bucket counts: see transport/protocol.h
// WaitReport).
//
// Bucket 0 counts latencies below 1 us; bucket i (i >= 1) counts latencies in
// [2^(i-1), 2^i) microseconds; the last bucket also takes everything larger
// (about 0.5 s and up). The daemon maps the upper bounds onto Prometheus
// histogram buckets.
//
// Thread safety: every method may be called concurrently; counters are
// relaxed atomics, so a snapshot taken during IO is approximate, but Drain()
// hands each recorded sample to exactly one caller.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>

namespace tierkv {

class LatencyHistogram {
 public:
  static constexpr size_t kBuckets = 21;
  using Counts = std::array<uint64_t, kBuckets>;

  // Upper bound (exclusive) of bucket i in microseconds; UINT64_MAX for last.
  static constexpr uint64_t BucketUpperBoundMicros(size_t i) {
    return i + 1 >= kBuckets ? UINT64_MAX : (uint64_t{1} << i);
  }

  // Samples in a snapshot: the sum of its bucket counts.
  static constexpr uint64_t SampleCount(const Counts& counts) {
    uint64_t n = 0;
    for (uint64_t c : counts) n += c;
    return n;
  }

  void Record(std::chrono::nanoseconds latency) {
    const uint64_t micros = latency.count() <= 0
                                ? 0
                                : static_cast<uint64_t>(latency.count()) / 1000;
    size_t bucket =
        micros == 0 ? 0 : static_cast<size_t>(std::bit_width(micros));
    if (bucket >= kBuckets) bucket = kBuckets - 1;
    buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
    total_nanos_.fetch_add(static_cast<uint64_t>(latency.count()),
                           std::memory_order_relaxed);
  }

  Counts Snapshot() const {
    Counts out{};
    for (size_t i = 0; i < kBuckets; ++i) {
      out[i] = buckets_[i].load(std::memory_order_relaxed);
    }
    return out;
  }
  uint64_t total_nanos() const {
    return total_nanos_.load(std::memory_order_relaxed);
  }

  // Takes the counts recorded since the last Drain() and zeroes them;
  // `total_nanos` gets their summed latency. A sample recorded during the
  // call lands in this drain or the next (its bucket and its nanoseconds
  // may split across the two).
  Counts Drain(uint64_t& total_nanos) {
    Counts out{};
    for (size_t i = 0; i < kBuckets; ++i) {
      out[i] = buckets_[i].exchange(0, std::memory_order_relaxed);
    }
    total_nanos = total_nanos_.exchange(0, std::memory_order_relaxed);
    return out;
  }

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> total_nanos_{0};
};

}  // namespace tierkv
