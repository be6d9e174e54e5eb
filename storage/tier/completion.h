// Completion<R>: one result handed from a completion callback (any thread)
// to a caller that waits for it (ReadAndWait and friends).
#pragma once

#include <optional>
#include <utility>

#include "common/mutex.h"

namespace tierkv::storage {

// Hold it by shared_ptr, shared with the callback: the waiter may see the
// value and return between Set's unlock and its SignalAll.
template <typename R>
class Completion {
 public:
  void Set(R value) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      value_ = std::move(value);
    }
    cv_.SignalAll();
  }
  R Wait() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (!value_) cv_.Wait(&mu_);
    return std::move(*value_);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::optional<R> value_ GUARDED_BY(mu_);
};

}  // namespace tierkv::storage
