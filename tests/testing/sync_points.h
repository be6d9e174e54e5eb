// ScopedSyncPoints and TIERKV_SKIP_WITHOUT_SYNC_POINTS: how tests use the
// sync points of common/sync_point.h, in this process or (through
// TIERKV_TEST_STALL_LAYER, daemon/layer_stall.h) in a tierkvd of the same
// build.
//
//   TEST_F(CacheEngineTest, ...) {
//     TIERKV_SKIP_WITHOUT_SYNC_POINTS();
//     ScopedSyncPoints sync;
//     sync.SetCallback(CacheEngine::kBeforeTransferUnit, [&](void* arg) {
//       ...
//     });
//     ...
//   }
//
// Without sync points (-DTIERKV_SYNC_POINTS=OFF) a test that needs them is
// skipped, saying why, and ScopedSyncPoints does nothing, so the test still
// compiles.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string_view>
#include <utility>

#include "common/sync_point.h"

namespace tierkv::testing {

#ifdef TIERKV_SYNC_POINTS
inline constexpr bool kSyncPointsBuilt = true;
#else
inline constexpr bool kSyncPointsBuilt = false;
#endif

// Skips the calling test when this build (and so its tierkvd) has no sync
// points. Use it first in the test body.
#define TIERKV_SKIP_WITHOUT_SYNC_POINTS()                               \
  do {                                                                  \
    if (!::tierkv::testing::kSyncPointsBuilt) {                         \
      GTEST_SKIP() << "needs sync points (TIERKV_TEST_STALL_LAYER, "    \
                      "common/sync_point.h): this build has "           \
                      "-DTIERKV_SYNC_POINTS=OFF, as release builds do"; \
    }                                                                   \
  } while (false)

// A test's sync point callbacks: processing is enabled from construction
// to destruction, which also clears every callback (waiting for running
// ones), so nothing a callback captured is used after the test. One at a
// time per process. Not thread-safe itself; the callbacks run on any thread.
class ScopedSyncPoints {
 public:
  ScopedSyncPoints() {
#ifdef TIERKV_SYNC_POINTS
    SyncPoint::Get().EnableProcessing();
#endif
  }
  ~ScopedSyncPoints() {
#ifdef TIERKV_SYNC_POINTS
    SyncPoint::Get().DisableProcessing();
    SyncPoint::Get().ClearAllCallbacks();
#endif
  }
  ScopedSyncPoints(const ScopedSyncPoints&) = delete;
  ScopedSyncPoints& operator=(const ScopedSyncPoints&) = delete;

  // Runs `callback` with the point's argument whenever a thread reaches
  // `name` (SyncPoint::SetCallback).
  void SetCallback([[maybe_unused]] std::string_view name,
                   [[maybe_unused]] std::function<void(void*)> callback) {
#ifdef TIERKV_SYNC_POINTS
    SyncPoint::Get().SetCallback(name, std::move(callback));
#endif
  }
};

}  // namespace tierkv::testing
