// InFlightBudget: a byte counter with a limit and a FIFO of waiters.
#include "transport/in_flight_budget.h"

#include <utility>

namespace tierkv::transport {

bool InFlightBudget::ChargeOrWait(uint64_t bytes, std::function<void()> wake) {
  MutexLock lock(&mu_);
  const uint64_t charged = charged_.load(std::memory_order_relaxed);
  if (charged == 0 || charged + bytes <= limit_) {
    charged_.store(charged + bytes, std::memory_order_relaxed);
    return true;
  }
  waiters_.push_back(std::move(wake));
  return false;
}

void InFlightBudget::Charge(uint64_t bytes) {
  MutexLock lock(&mu_);
  charged_.fetch_add(bytes, std::memory_order_relaxed);
}

void InFlightBudget::Release(uint64_t bytes) {
  std::deque<std::function<void()>> wake;
  {
    MutexLock lock(&mu_);
    charged_.fetch_sub(bytes, std::memory_order_relaxed);
    wake.swap(waiters_);
  }
  for (auto& w : wake) w();
}

void InFlightBudget::DropWaiters() {
  std::deque<std::function<void()>> dropped;  // destroyed after the lock
  MutexLock lock(&mu_);
  dropped.swap(waiters_);
}

size_t InFlightBudget::waiters() const {
  MutexLock lock(&mu_);
  return waiters_.size();
}

}  // namespace tierkv::transport
