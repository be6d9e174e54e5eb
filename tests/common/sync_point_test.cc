// SyncPoint: callbacks per name, run only while processing is enabled, with
// the point's argument; clearing waits for running callbacks; without
// TIERKV_SYNC_POINTS the macros evaluate nothing.
#include "common/sync_point.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/sync_points.h"

namespace tierkv {
namespace {

using testing::kSyncPointsBuilt;
using testing::ScopedSyncPoints;

TEST(SyncPointTest, MacrosEvaluateTheirArgumentOnlyWithSyncPoints) {
  int evaluated = 0;
  TIERKV_SYNC_POINT_CALLBACK("SyncPointTest::NoCallback",
                             (++evaluated, nullptr));
  TIERKV_SYNC_POINT("SyncPointTest::NoCallback");
  EXPECT_EQ(evaluated, kSyncPointsBuilt ? 1 : 0);
}

TEST(SyncPointTest, CallbackRunsWithTheArgumentWhileProcessingIsEnabled) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  std::vector<int> seen;
  {
    ScopedSyncPoints sync;
    sync.SetCallback("SyncPointTest::Point", [&](void* arg) {
      seen.push_back(*static_cast<const int*>(arg));
    });
    int value = 7;
    TIERKV_SYNC_POINT_CALLBACK("SyncPointTest::Point", &value);
    TIERKV_SYNC_POINT_CALLBACK("SyncPointTest::OtherPoint", &value);
    value = 8;
    TIERKV_SYNC_POINT_CALLBACK("SyncPointTest::Point", &value);
  }
  // Processing is off and the callback gone once the scope ended.
  int value = 9;
  TIERKV_SYNC_POINT_CALLBACK("SyncPointTest::Point", &value);
  EXPECT_EQ(seen, (std::vector<int>{7, 8}));
}

TEST(SyncPointTest, NothingRunsWhileProcessingIsDisabled) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  ScopedSyncPoints sync;
  int calls = 0;
  sync.SetCallback("SyncPointTest::Point", [&](void*) { ++calls; });
#ifdef TIERKV_SYNC_POINTS
  SyncPoint::Get().DisableProcessing();
  TIERKV_SYNC_POINT("SyncPointTest::Point");
  EXPECT_EQ(calls, 0);
  SyncPoint::Get().EnableProcessing();
#endif
  TIERKV_SYNC_POINT("SyncPointTest::Point");
  EXPECT_EQ(calls, 1);
}

TEST(SyncPointTest, SetCallbackReplacesAndClearCallbackRemoves) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  ScopedSyncPoints sync;
  std::string last;
  sync.SetCallback("SyncPointTest::Point", [&](void*) { last = "first"; });
  sync.SetCallback("SyncPointTest::Point", [&](void*) { last = "second"; });
  TIERKV_SYNC_POINT("SyncPointTest::Point");
  EXPECT_EQ(last, "second");
#ifdef TIERKV_SYNC_POINTS
  SyncPoint::Get().ClearCallback("SyncPointTest::Point");
#endif
  last.clear();
  TIERKV_SYNC_POINT("SyncPointTest::Point");
  EXPECT_EQ(last, "");
}

// A callback holds its thread at the point until the test lets it go (the
// use sync points exist for), while another thread passes another point;
// clearing after that returns only once the held callback has.
TEST(SyncPointTest, CallbackHoldsItsThreadAndClearingWaitsForIt) {
  TIERKV_SKIP_WITHOUT_SYNC_POINTS();
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, released = false, returned = false;
  int others = 0;
  ScopedSyncPoints sync;
  sync.SetCallback("SyncPointTest::Hold", [&](void*) {
    std::unique_lock lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
    returned = true;
  });
  sync.SetCallback("SyncPointTest::Pass", [&](void*) { ++others; });
  std::thread held([] { TIERKV_SYNC_POINT("SyncPointTest::Hold"); });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  TIERKV_SYNC_POINT("SyncPointTest::Pass");  // not blocked by the held one
  EXPECT_EQ(others, 1);
  std::thread clearer([&] {
#ifdef TIERKV_SYNC_POINTS
    SyncPoint::Get().ClearAllCallbacks();
#endif
    std::lock_guard lock(mu);
    EXPECT_TRUE(returned) << "cleared while a callback still ran";
  });
  {
    std::lock_guard lock(mu);
    released = true;
  }
  cv.notify_all();
  held.join();
  clearer.join();
}

}  // namespace
}  // namespace tierkv
