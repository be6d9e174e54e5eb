// AuthThrottle (see auth_throttle.h).
#include "daemon/auth_throttle.h"

#include <utility>
#include <vector>

namespace tierkv::daemon {

AuthThrottle::AuthThrottle(std::chrono::milliseconds delay)
    : delay_(delay), thread_([this] { Run(); }) {}

AuthThrottle::~AuthThrottle() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void AuthThrottle::Refuse(transport::Responder responder,
                          transport::HandlerReply reply, bool hang_up) {
  reply.close_after = hang_up;
  {
    MutexLock lock(&mu_);
    if (!stop_ && delay_.count() > 0 && waiting_.size() < kMaxWaiting) {
      waiting_.push_back(
          {Clock::now() + delay_, std::move(responder), std::move(reply)});
      cv_.Signal();
      return;
    }
  }
  responder.Send(std::move(reply));
}

void AuthThrottle::Run() {
  MutexLock lock(&mu_);
  while (true) {
    if (waiting_.empty()) {
      if (stop_) return;
      cv_.Wait(&mu_);
      continue;
    }
    const Clock::time_point next = waiting_.front().due;
    if (!stop_ && Clock::now() < next) {
      cv_.WaitUntil(&mu_, next);
      continue;
    }
    // Due (or stopping): send outside the lock.
    std::vector<Waiting> due;
    const auto now = Clock::now();
    while (!waiting_.empty() && (stop_ || waiting_.front().due <= now)) {
      due.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
    lock.Unlock();
    for (Waiting& w : due) w.responder.Send(std::move(w.reply));
    lock.Lock();
  }
}

}  // namespace tierkv::daemon
