// Clock: the one source of time for every deadline in the engine, the mover
// and the host tier (lease expiry, write-back waits, group syncs), injected
// so tests can use a manual clock (tests/testing/manual_clock.h) instead of
// sleeping (STYLE.md habit 8).
#pragma once

#include <chrono>

#include "common/mutex.h"

namespace tierkv::storage {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;

  // Waits on `cv` (releasing `mu` meanwhile) until it is signalled or this
  // clock reaches `deadline`. Returns false once Now() >= deadline, true
  // otherwise, which may be spurious: call it in a loop that re-checks the
  // condition. A deadline is only ever compared with this clock's Now().
  virtual bool WaitUntil(CondVar& cv, Mutex* mu, TimePoint deadline) const
      REQUIRES(mu) = 0;
};

// The monotonic system clock. Thread-safe.
class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  bool WaitUntil(CondVar& cv, Mutex* mu, TimePoint deadline) const override
      REQUIRES(mu) {
    return cv.WaitUntil(mu, deadline);
  }
  static SteadyClock* Default() {
    static SteadyClock clock;
    return &clock;
  }
};

}  // namespace tierkv::storage
