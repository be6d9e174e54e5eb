// ManualClock: a storage::Clock that moves only when told, so that lease and
// expiry tests advance time instead of sleeping (STYLE.md habit 8). A test
// double: it lives in tests/testing/, never in tierkvd.
//
// Thread safety: thread-safe (one relaxed atomic; nothing else is published
// through it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "storage/clock.h"

namespace tierkv::testing {

class ManualClock final : public storage::Clock {
 public:
  TimePoint Now() const override {
    return TimePoint(
        std::chrono::nanoseconds(now_ns_.load(std::memory_order_relaxed)));
  }
  void Advance(std::chrono::nanoseconds d) {
    now_ns_.fetch_add(d.count(), std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> now_ns_{int64_t{1} << 40};  // far from zero
};

}  // namespace tierkv::testing
