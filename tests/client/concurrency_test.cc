// Many client threads against one real daemon: 8 threads x 10,000 mixed
// operations complete without an error and every read is bit-exact.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "tests/client/client_test_util.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"

namespace tierkv::testing {
namespace {

constexpr size_t kSeg = 8 * 1024;  // 64 tokens x 128 B

TEST(ConcurrencyTest, EightThreadsTenThousandMixedOpsEach) {
  DaemonProcess daemon;
  ASSERT_OK(daemon.Start(
      {.extra_args = {"--host-bytes", "64MiB", "--io-threads", "4"}}));
  constexpr int kThreads = 8;
  constexpr int kOps = 10000;
  std::atomic<int> errors{0}, mismatches{0}, ops{0};
  const auto shared_pages = Pages(64, 0);  // every thread touches these
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto c = daemon.Connect();
      if (!c.ok() || !(*c)->RegisterLayout(OnePartLayout(128)).ok()) {
        errors++;
        return;
      }
      std::mt19937 rng(t);
      const auto own_pages = Pages(256, 100000 * (t + 1));
      for (int i = 0; i < kOps; ++i) {
        const auto& pages = rng() % 2 ? shared_pages : own_pages;
        const PageHash& page = pages[rng() % pages.size()];
        switch (rng() % 4) {
          case 0: {  // put (stored or deduplicated are both fine)
            const PutResult r = PutPages(**c, {page}, kSeg)[0];
            if (!r.ok() && r.status.code() != StatusCode::kBusy) errors++;
            break;
          }
          case 1: {  // get: a miss is fine, wrong bytes are not
            std::vector<std::byte> dst(kSeg);
            SegmentRead r{{page, 0, 0}, dst};
            Status s = (*c)->Get(std::span(&r, 1))[0];
            if (s.ok() && dst != SegmentBytes({page, 0, 0}, kSeg)) mismatches++;
            if (!s.ok() && !s.IsNotFound()) errors++;
            break;
          }
          case 2: {
            auto m = (*c)->Match(std::span(&page, 1));
            if (!m.ok()) errors++;
            break;
          }
          case 3: {  // zero-copy read under a lease
            SegmentKey key{page, 0, 0};
            auto lease = (*c)->Acquire(std::span(&key, 1));
            if (!lease.ok()) {
              errors++;
            } else if (lease->statuses()[0].ok()) {
              auto bytes = lease->data(0);
              auto want = SegmentBytes(key, kSeg);
              if (!std::equal(bytes.begin(), bytes.end(), want.begin(),
                              want.end())) {
                mismatches++;
              }
            }
            break;
          }
        }
        ops++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ops.load(), kThreads * kOps);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  auto c = daemon.Connect();
  ASSERT_OK(c);
  auto stats = (*c)->StatsJson();
  ASSERT_OK(stats);
  EXPECT_NE(stats->find("\"referenced_segments\":0"), std::string::npos)
      << *stats;
  EXPECT_NE(stats->find("\"reserved_bytes\":0"), std::string::npos) << *stats;
}

}  // namespace
}  // namespace tierkv::testing
