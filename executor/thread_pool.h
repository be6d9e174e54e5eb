// ThreadPool: a fixed set of std::threads that run ParallelFor loops.
//
// Why not OpenMP or a library: the executor needs only a blocking parallel
// loop with a deterministic partition, and a pool sized per Model (tests
// compare 1 vs N threads). A few dozen lines of std::thread suffice.
//
// Determinism: ParallelFor only decides which thread runs which index range;
// callers compute every output element entirely inside one call of `fn`, so
// results are bit-identical for any thread count.
//
// Thread safety: ParallelFor may be called from one thread at a time (calls
// are serialized by an internal mutex); `fn` must not call ParallelFor
// (no nesting).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace tierkv::executor {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: 1 runs everything inline.
  // 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), each at most
  // `grain` long (grain >= 1), and returns when all are done.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t)>& fn)
      EXCLUDES(call_mu_, mu_);

 private:
  void WorkerLoop() EXCLUDES(mu_);
  void RunChunks(const std::function<void(int64_t, int64_t)>& fn, int64_t n,
                 int64_t grain);

  int num_threads_;                     // set in the constructor
  std::vector<std::thread> workers_;    // set in the constructor
  Mutex call_mu_ ACQUIRED_BEFORE(mu_);  // serializes ParallelFor calls

  Mutex mu_;
  CondVar work_cv_;  // a new generation_ or stop_
  CondVar done_cv_;  // pending_workers_ reached 0
  // The current job and its generation.
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  // Workers that have not yet finished the current generation; every worker
  // takes part in every job, so none can touch a retired job's fn.
  int pending_workers_ GUARDED_BY(mu_) = 0;
  const std::function<void(int64_t, int64_t)>* fn_ GUARDED_BY(mu_) = nullptr;
  int64_t n_ GUARDED_BY(mu_) = 0;
  int64_t grain_ GUARDED_BY(mu_) = 1;
  // Next chunk start; relaxed is enough because the job fields are
  // published by mu_ and completion is published by mu_ again.
  std::atomic<int64_t> next_{0};
};

}  // namespace tierkv::executor
