// WorkerPool: bounded FIFO of jobs over a fixed set of threads.
#include "common/worker_pool.h"

namespace tierkv {

WorkerPool::WorkerPool(uint32_t threads, uint32_t queue_limit,
                       std::function<void()> on_thread_start)
    : queue_limit_(queue_limit) {
  for (uint32_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this, on_thread_start] { Loop(on_thread_start); });
  }
}

WorkerPool::~WorkerPool() { Shutdown(); }

void WorkerPool::Shutdown() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool WorkerPool::TrySubmit(std::function<void()> job) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || jobs_.size() >= queue_limit_) return false;
    jobs_.push_back(std::move(job));
  }
  cv_.Signal();
  return true;
}

size_t WorkerPool::queue_depth() const {
  MutexLock lock(&mu_);
  return jobs_.size();
}

void WorkerPool::WaitIdle() const {
  MutexLock lock(&mu_);
  while (!jobs_.empty() || running_ > 0) idle_cv_.Wait(&mu_);
}

void WorkerPool::Loop(const std::function<void()>& on_thread_start) {
  if (on_thread_start) on_thread_start();
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && jobs_.empty()) cv_.Wait(&mu_);
    if (jobs_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    ++running_;
    lock.Unlock();
    job();
    lock.Lock();
    if (--running_ == 0 && jobs_.empty()) idle_cv_.SignalAll();
  }
}

}  // namespace tierkv
