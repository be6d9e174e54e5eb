// SyncPoint: named points in the code where a test runs a callback, to hold
// one thread until another has done something, or to observe an argument,
// so that concurrency tests order threads deterministically instead of
// sleeping (STYLE.md habit 14; rocksdb test_util/sync_point.h, without its
// dependency graph: a callback that waits on the test's own condition
// variable says the same thing, in the test).
//
//   // In the code under test, where the ordering matters:
//   TIERKV_SYNC_POINT("Evictor::BeforeUnlink");
//   TIERKV_SYNC_POINT_CALLBACK("CacheEngine::RunLane:BeforeTransferUnit",
//                              &layer);
//
//   // In a test:
//   SyncPoint& sp = SyncPoint::Get();
//   sp.SetCallback("Evictor::BeforeUnlink", [&](void*) { ... });
//   sp.EnableProcessing();
//   ...
//   sp.DisableProcessing();
//   sp.ClearAllCallbacks();
//
// Both macros compile to nothing, and this header declares nothing, unless
// the build defines TIERKV_SYNC_POINTS (the CMake option of that name: ON
// for developer and CI builds, OFF for every release artifact; see README
// "Tests"). Code that refers to SyncPoint itself, rather than through the
// macros, must be inside `#ifdef TIERKV_SYNC_POINTS`.
#pragma once

#ifdef TIERKV_SYNC_POINTS

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "common/mutex.h"

namespace tierkv {

// The process-wide registry of sync point callbacks.
//
// Thread-safe: every method may be called from any thread. A callback runs
// on the thread that reached its point, without the registry's lock held,
// so it may block (that is what it is for) while other threads pass other
// points. Callbacks are owned by the registry until cleared.
class SyncPoint {
 public:
  // The registry's argument to a callback: what the point passed to
  // TIERKV_SYNC_POINT_CALLBACK (its comment says the type), or nullptr
  // from TIERKV_SYNC_POINT.
  using Callback = std::function<void(void* arg)>;

  // The one instance (never destroyed, so points reached during static
  // destruction are safe).
  static SyncPoint& Get();

  SyncPoint(const SyncPoint&) = delete;
  SyncPoint& operator=(const SyncPoint&) = delete;

  // Runs `callback` every time a thread reaches the point `name` while
  // processing is enabled; replaces the point's previous callback.
  void SetCallback(std::string_view name, Callback callback) EXCLUDES(mu_);
  // Removes the callback of `name` (none: nothing happens) and waits until
  // no callback of any point is running, so that state the removed one
  // captured may be destroyed when this returns.
  // REQUIRES: not called from a callback (it would wait for itself).
  void ClearCallback(std::string_view name) EXCLUDES(mu_);
  // ClearCallback for every point.
  // REQUIRES: not called from a callback.
  void ClearAllCallbacks() EXCLUDES(mu_);

  // Points run callbacks only between EnableProcessing and
  // DisableProcessing. Default: disabled, and then a point costs one
  // relaxed atomic load.
  void EnableProcessing();
  void DisableProcessing();

  // What the macros call: runs the callback of `name`, if processing is
  // enabled and one is set, with `arg`.
  void Process(std::string_view name, void* arg = nullptr) EXCLUDES(mu_);

 private:
  SyncPoint() = default;

  // Relaxed: a point reached just as processing is switched on or off may
  // run or skip its callback either way; tests enable processing before
  // starting the work they order.
  std::atomic<bool> enabled_{false};
  Mutex mu_;
  CondVar no_callback_running_;
  // std::less<>: Process looks names up by string_view, without copying.
  std::map<std::string, Callback, std::less<>> callbacks_ GUARDED_BY(mu_);
  uint64_t callbacks_running_ GUARDED_BY(mu_) = 0;
};

}  // namespace tierkv

#define TIERKV_SYNC_POINT(name) ::tierkv::SyncPoint::Get().Process(name)
#define TIERKV_SYNC_POINT_CALLBACK(name, arg) \
  ::tierkv::SyncPoint::Get().Process(name, arg)

#else  // !TIERKV_SYNC_POINTS

// Nothing of the arguments is evaluated.
#define TIERKV_SYNC_POINT(name) static_cast<void>(0)
#define TIERKV_SYNC_POINT_CALLBACK(name, arg) static_cast<void>(0)

#endif  // TIERKV_SYNC_POINTS
