// TokenBucket: a byte-rate limit on a Clock (the weights prefetch cap,
// NamespaceTiers::prefetch_bytes_per_second; DESIGN.md §4 "mover").
//
// Tokens (bytes) accrue at `rate` per second up to `burst`; Take spends
// them and may leave a debt (a transfer is never split by the limit), and
// ReadyAt says when the debt is paid. So over any window of T seconds the
// bytes taken are at most burst + rate * T + the largest single Take.
// Hand-written: a dozen lines against the engine's injected Clock (tests
// advance a manual one), which the rate limiters of the libraries we use
// (e.g. RocksDB's GenericRateLimiter, on its own Env) do not take.
//
// Thread safety: none; its owner locks.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "storage/clock.h"

namespace tierkv::storage {

class TokenBucket {
 public:
  // REQUIRES: bytes_per_second > 0. Starts full.
  TokenBucket(uint64_t bytes_per_second, uint64_t burst_bytes,
              Clock::TimePoint now)
      : rate_(static_cast<double>(bytes_per_second)),
        burst_(static_cast<double>(burst_bytes)),
        tokens_(burst_),
        at_(now) {}

  // When the next Take may go: `now` while tokens are left, else when the
  // debt is paid.
  Clock::TimePoint ReadyAt(Clock::TimePoint now) const {
    const double tokens = TokensAt(now);
    if (tokens > 0) return now;
    return now + std::chrono::nanoseconds(
                     static_cast<int64_t>(-tokens / rate_ * 1e9) + 1);
  }

  // Spends `bytes` at `now` (possibly into debt).
  void Take(uint64_t bytes, Clock::TimePoint now) {
    tokens_ = TokensAt(now) - static_cast<double>(bytes);
    at_ = std::max(at_, now);
  }

 private:
  double TokensAt(Clock::TimePoint now) const {
    const double seconds =
        now > at_ ? std::chrono::duration<double>(now - at_).count() : 0.0;
    return std::min(burst_, tokens_ + seconds * rate_);
  }

  const double rate_;   // bytes per second
  const double burst_;  // bytes
  double tokens_;       // at at_; negative: a debt
  Clock::TimePoint at_;
};

}  // namespace tierkv::storage
