// ManualClock: a storage::Clock that moves only when told, so that lease,
// expiry and write-back-wait tests advance time instead of sleeping
// (STYLE.md habit 8). A test double: it lives in tests/testing/, never in
// tierkvd.
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

  // Times out only once Advance() has moved Now() past `deadline`. Advance
  // does not signal waiters (it knows none), so the wait polls: it returns
  // (spuriously) every millisecond of real time and callers look again.
  bool WaitUntil(CondVar& cv, Mutex* mu, TimePoint deadline) const override
      REQUIRES(mu) {
    if (Now() >= deadline) return false;
    cv.WaitUntil(mu, std::chrono::steady_clock::now() + kPoll);
    return Now() < deadline;
  }

 private:
  static constexpr std::chrono::milliseconds kPoll{1};
  std::atomic<int64_t> now_ns_{int64_t{1} << 40};  // far from zero
};

}  // namespace tierkv::testing
