// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with
// Clang thread-safety annotations (libstdc++'s carry none), so that
// `-Werror=thread-safety` checks every lock site (STYLE.md habit 10; leveldb
// port/port_stdcxx.h, Mooncake include/mutex.h).
//
//   Mutex mu_;
//   uint64_t hits_ GUARDED_BY(mu_) = 0;
//   void BumpLocked() REQUIRES(mu_) { ++hits_; }
//   void Bump() { MutexLock lock(&mu_); BumpLocked(); }
//
// Thread safety: these are the synchronisation primitives.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace tierkv {

class CondVar;

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds the lock (it cannot check it
  // at run time).
  void AssertHeld() ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope. Unlock()/Lock() let a scope drop the lock
// around slow work (and take it back before the scope ends).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (locked_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_->Unlock();
    locked_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    locked_ = true;
  }

 private:
  Mutex* const mu_;
  bool locked_ = true;
};

// A condition variable used with a Mutex that every wait holds, passed in
// so that the analysis checks it (absl::CondVar's shape).
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Atomically releases `mu` and waits for a Signal (or a spurious
  // wake-up); holds `mu` again on return. Call it in a loop that re-checks
  // the condition: `while (!ready_) cv_.Wait(&mu_);` (a predicate lambda
  // would hide its guarded reads from the analysis).
  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // Like Wait(), but returns false once `deadline` has passed.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline)
      REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woke =
        cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woke;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace tierkv
