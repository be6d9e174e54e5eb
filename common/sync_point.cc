// SyncPoint: the process-wide registry of sync point callbacks (see
// sync_point.h). Compiled to nothing without TIERKV_SYNC_POINTS.
#include "common/sync_point.h"

#ifdef TIERKV_SYNC_POINTS

#include <utility>

namespace tierkv {

SyncPoint& SyncPoint::Get() {
  // Leaked on purpose: worker threads may reach points while static
  // destructors run.
  static SyncPoint* const instance = new SyncPoint();
  return *instance;
}

void SyncPoint::SetCallback(std::string_view name, Callback callback) {
  MutexLock lock(&mu_);
  callbacks_.insert_or_assign(std::string(name), std::move(callback));
}

void SyncPoint::ClearCallback(std::string_view name) {
  MutexLock lock(&mu_);
  if (auto it = callbacks_.find(name); it != callbacks_.end()) {
    callbacks_.erase(it);
  }
  while (callbacks_running_ > 0) no_callback_running_.Wait(&mu_);
}

void SyncPoint::ClearAllCallbacks() {
  MutexLock lock(&mu_);
  callbacks_.clear();
  while (callbacks_running_ > 0) no_callback_running_.Wait(&mu_);
}

void SyncPoint::EnableProcessing() {
  enabled_.store(true, std::memory_order_relaxed);
}

void SyncPoint::DisableProcessing() {
  enabled_.store(false, std::memory_order_relaxed);
}

void SyncPoint::Process(std::string_view name, void* arg) {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  Callback callback;
  {
    MutexLock lock(&mu_);
    auto it = callbacks_.find(name);
    if (it == callbacks_.end()) return;
    // A copy: the callback may block, and SetCallback may replace the
    // registry's meanwhile.
    callback = it->second;
    ++callbacks_running_;
  }
  callback(arg);
  bool last = false;
  {
    MutexLock lock(&mu_);
    last = --callbacks_running_ == 0;
  }
  if (last) no_callback_running_.SignalAll();
}

}  // namespace tierkv

#endif  // TIERKV_SYNC_POINTS
