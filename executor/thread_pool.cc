// ThreadPool implementation (see thread_pool.h).
#include "executor/thread_pool.h"

#include <algorithm>

namespace tierkv::executor {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) {
    num_threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  num_threads_ = num_threads;
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(const std::function<void(int64_t, int64_t)>& fn,
                           int64_t n, int64_t grain) {
  for (;;) {
    const int64_t begin = next_.fetch_add(grain, std::memory_order_relaxed);
    if (begin >= n) return;
    fn(begin, std::min(n, begin + grain));
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t n, grain;
    {
      MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
      grain = grain_;
    }
    RunChunks(*fn, n, grain);
    bool last;
    {
      MutexLock lock(&mu_);
      last = --pending_workers_ == 0;
    }
    if (last) done_cv_.Signal();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || n <= grain) {
    for (int64_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain));
    return;
  }
  MutexLock call_lock(&call_mu_);
  {
    MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    next_.store(0, std::memory_order_relaxed);
    pending_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.SignalAll();
  RunChunks(fn, n, grain);
  MutexLock lock(&mu_);
  while (pending_workers_ != 0) done_cv_.Wait(&mu_);
}

}  // namespace tierkv::executor
