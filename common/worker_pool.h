// WorkerPool: a fixed set of threads that run jobs from one bounded FIFO
// queue. The engine runs work that may wait (promotion, Flush, transfer
// lanes) here so that its socket IO threads never do; the NVMe tier reads
// on pools of its own, so that those workers never wait for the device.
//
// Why hand-written: Boost.Asio's thread_pool has no queue bound, and a bound
// is the point: a flood of requests gets Busy, not unbounded memory.
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace tierkv {

class WorkerPool {
 public:
  // REQUIRES: threads >= 1, queue_limit >= 1. Each thread runs
  // `on_thread_start` (when set) once, before its first job.
  WorkerPool(uint32_t threads, uint32_t queue_limit,
             std::function<void()> on_thread_start = {});
  // Shutdown().
  ~WorkerPool();

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `job`; false (and `job` is not run) when queue_limit jobs are
  // already waiting or the pool is shutting down.
  [[nodiscard]] bool TrySubmit(std::function<void()> job);

  size_t queue_depth() const;
  // Blocks until no job is queued or running (tests: a job's effects are
  // then visible).
  void WaitIdle() const;
  // The pool's threads (fixed at construction).
  size_t threads() const { return threads_.size(); }

  // Refuses jobs from now on (TrySubmit: false), runs every job already
  // queued, then joins the threads. Jobs may still call TrySubmit. Idempotent;
  // not to be called from a job or concurrently with itself.
  void Shutdown();

 private:
  void Loop(const std::function<void()>& on_thread_start);

  const uint32_t queue_limit_;
  mutable Mutex mu_;
  CondVar cv_;
  mutable CondVar idle_cv_;  // signalled when the last running job ends
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mu_);
  uint32_t running_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tierkv
