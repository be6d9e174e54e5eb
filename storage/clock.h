// Clock: the one source of time for leases and expiry, injected so tests can
// use a manual clock (tests/testing/manual_clock.h) instead of sleeping
// (STYLE.md habit 8).
#pragma once

#include <chrono>

namespace tierkv::storage {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

// The monotonic system clock. Thread-safe.
class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  static SteadyClock* Default() {
    static SteadyClock clock;
    return &clock;
  }
};

}  // namespace tierkv::storage
