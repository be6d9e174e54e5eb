// WorkerPool: jobs run in FIFO order on the pool's threads, the queue bound
// refuses a flood, Shutdown runs what was queued, and WaitIdle returns only
// once every queued and running job has finished.
#include "common/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

namespace tierkv {
namespace {

TEST(WorkerPoolTest, RunsJobsInOrderAndRefusesPastItsQueueBound) {
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  WorkerPool pool(/*threads=*/1, /*queue_limit=*/3);
  std::vector<int> order;
  std::promise<void> started;
  ASSERT_TRUE(pool.TrySubmit([open, &started] {  // holds the one thread
    started.set_value();
    open.wait();
  }));
  started.get_future().wait();
  int queued = 0;
  while (pool.TrySubmit([&order, n = queued] { order.push_back(n); })) {
    ++queued;
  }
  EXPECT_EQ(queued, 3);
  EXPECT_EQ(pool.queue_depth(), 3u);
  gate.set_value();
  pool.WaitIdle();
  ASSERT_EQ(order.size(), static_cast<size_t>(queued));
  for (int i = 0; i < queued; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkerPoolTest, WaitIdleWaitsForARunningJob) {
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<bool> done{false};
  WorkerPool pool(/*threads=*/2, /*queue_limit=*/8);
  ASSERT_TRUE(pool.TrySubmit([open, &done] {
    open.wait();
    done.store(true);
  }));
  std::atomic<bool> seen_done{false};
  std::thread waiter([&] {
    pool.WaitIdle();
    seen_done.store(done.load());
  });
  gate.set_value();
  waiter.join();
  EXPECT_TRUE(seen_done.load());
}

TEST(WorkerPoolTest, ShutdownRunsQueuedJobsThenRefuses) {
  std::atomic<int> ran{0};
  WorkerPool pool(/*threads=*/1, /*queue_limit=*/16);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(pool.TrySubmit([&ran] { ran.fetch_add(1); }));
  }
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(pool.TrySubmit([] {}));
}

}  // namespace
}  // namespace tierkv
