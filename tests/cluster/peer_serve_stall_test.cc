// PeerServeStall (daemon/cluster/peer_serve_stall.h), in process: what it
// parses, which requests it holds, that a FIFO byte or EOF releases them
// in order, and that destroying it never waits for the FIFO.
#include "daemon/cluster/peer_serve_stall.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include "common/mutex.h"
#include "daemon/cluster/fetch_protocol.h"
#include "tests/testing/peer_serve_stall_fifo.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sync_points.h"
#include "tests/testing/temp_dir.h"

namespace tierkv::daemon::cluster {
namespace {

#ifdef TIERKV_SYNC_POINTS

using testing::PeerServeStallFifo;
using transport::peer::PeerRequest;
using transport::peer::PeerResponder;

// What the stall passed on: each request's first payload byte, in order.
class Served {
 public:
  transport::peer::RequestHandler Handler() {
    return [this](const PeerRequest& request, PeerResponder) {
      MutexLock lock(&mu_);
      order_.push_back(static_cast<int>(request.payload[0]));
      cv_.SignalAll();
    };
  }
  // The requests served so far, once there are `n` (or after 20 s).
  std::vector<int> Await(size_t n) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(20);
    MutexLock lock(&mu_);
    while (order_.size() < n && cv_.WaitUntil(&mu_, deadline)) {
    }
    return order_;
  }
  std::vector<int> Now() {
    MutexLock lock(&mu_);
    return order_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::vector<int> order_ GUARDED_BY(mu_);
};

void Send(PeerServeStall& stall, uint16_t opcode, int tag) {
  const std::vector<std::byte> payload = {static_cast<std::byte>(tag)};
  stall.Handle({.peer_node_id = "node-b", .opcode = opcode, .payload = payload},
               PeerResponder());
}

class PeerServeStallTest : public ::testing::Test {
 protected:
  std::unique_ptr<PeerServeStall> Start(uint32_t nth_fetch) {
    auto stall = PeerServeStall::Start(
        {.nth_fetch = nth_fetch, .fifo_path = fifo_.path()}, served_.Handler());
    EXPECT_OK(stall);
    return stall.ok() ? std::move(stall).value() : nullptr;
  }

  testing::TempDir dir_;
  PeerServeStallFifo fifo_{dir_.File("serve.fifo")};
  Served served_;
};

TEST_F(PeerServeStallTest, ParsesNthFetchAndAFifo) {
  auto spec = ParsePeerServeStall("3:" + fifo_.path());
  ASSERT_OK(spec);
  EXPECT_EQ(spec->nth_fetch, 3u);
  EXPECT_EQ(spec->fifo_path, fifo_.path());

  const std::string file = dir_.File("plain");
  std::ofstream(file) << "x";
  const std::vector<std::string> malformed = {"",
                                              "3",
                                              "0:" + fifo_.path(),
                                              "x:" + fifo_.path(),
                                              ":" + fifo_.path(),
                                              "4294967296:" + fifo_.path(),
                                              "3:",
                                              "3:" + dir_.File("missing"),
                                              "3:" + file};
  for (const std::string& bad : malformed) {
    auto refused = ParsePeerServeStall(bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(kPeerServeStallEnv),
              std::string::npos)
        << refused.status().ToString();
  }
}

TEST_F(PeerServeStallTest, HoldsFromTheNthFetchUntilReleasedThenServesInOrder) {
  auto stall = Start(/*nth_fetch=*/2);
  ASSERT_NE(stall, nullptr);
  Send(*stall, kFetchOpcode, 1);  // served on this thread, at once
  EXPECT_EQ(served_.Now(), std::vector<int>({1}));
  Send(*stall, /*opcode=*/7, 2);  // not a FETCH: not counted
  EXPECT_EQ(served_.Now(), std::vector<int>({1, 2}));
  Send(*stall, kFetchOpcode, 3);  // the second FETCH: held
  Send(*stall, /*opcode=*/7, 4);  // everything after it too
  Send(*stall, kFetchOpcode, 5);
  ASSERT_TRUE(fifo_.AwaitHeld());
  EXPECT_EQ(served_.Now(), std::vector<int>({1, 2}));

  fifo_.Release();
  EXPECT_EQ(served_.Await(5), std::vector<int>({1, 2, 3, 4, 5}));
  Send(*stall, kFetchOpcode, 6);  // after them (at once, once they are out)
  EXPECT_EQ(served_.Await(6), std::vector<int>({1, 2, 3, 4, 5, 6}));
}

TEST_F(PeerServeStallTest, EveryWriterClosingReleasesIt) {
  auto fifo = std::make_unique<PeerServeStallFifo>(dir_.File("eof.fifo"));
  auto stall = PeerServeStall::Start(
      {.nth_fetch = 1, .fifo_path = fifo->path()}, served_.Handler());
  ASSERT_OK(stall);
  Send(**stall, kFetchOpcode, 1);
  ASSERT_TRUE(fifo->AwaitHeld());
  EXPECT_TRUE(served_.Now().empty());
  fifo.reset();  // a test that failed or died: EOF
  EXPECT_EQ(served_.Await(1), std::vector<int>({1}));
}

TEST_F(PeerServeStallTest, DestroyingItNeverWaitsForTheFifo) {
  // Holding, with the test's end open and never written.
  auto stall = Start(/*nth_fetch=*/1);
  ASSERT_NE(stall, nullptr);
  Send(*stall, kFetchOpcode, 1);
  ASSERT_TRUE(fifo_.AwaitHeld());
  stall.reset();  // answers the held request Unavailable
  EXPECT_TRUE(served_.Now().empty());

  // Holding (or about to) with no writer ever; and never holding at all.
  PeerServeStallFifo unopened(dir_.File("unopened.fifo"));
  auto again = PeerServeStall::Start(
      {.nth_fetch = 1, .fifo_path = unopened.path()}, served_.Handler());
  ASSERT_OK(again);
  Send(**again, kFetchOpcode, 2);
  again->reset();
  EXPECT_NE(Start(/*nth_fetch=*/1), nullptr);  // destroyed at once
  EXPECT_TRUE(served_.Now().empty());
}

#else

TEST(PeerServeStallTest, NeedsSyncPoints) { TIERKV_SKIP_WITHOUT_SYNC_POINTS(); }

#endif  // TIERKV_SYNC_POINTS

}  // namespace
}  // namespace tierkv::daemon::cluster
