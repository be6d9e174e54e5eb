// Clock: the one source of time for leases and expiry, injected so tests can
// use a ManualClock instead of sleeping (STYLE.md habit 8).
#pragma once

#include <atomic>
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

// A clock that moves only when told. Thread-safe.
class ManualClock final : public Clock {
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

}  // namespace tierkv::storage
